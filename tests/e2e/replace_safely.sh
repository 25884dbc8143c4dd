#!/usr/bin/env bash
# replace_safely.sh LLMTRAIN TOKENIZER WORK_DIR: `prepare` and `tokenizer train --output`
# never lose what the output already holds. On a small tmpfs (a full disk) and then on the
# same tmpfs remounted read-only, a replacing run fails with the system's reason, the old
# dataset / tokenizer file stays byte for byte, and nothing is left beside it; without
# --force an existing output is refused (exit 2); with --force the directory holds exactly
# the new dataset.
#
# The tmpfs lives in a user + mount namespace (no root needed); where the kernel refuses
# one the test is skipped (exit 77) and says why.
set -u
llmtrain=$1 tokenizer=$2 work=$3

fail() { echo "FAIL: $*"; exit 1; }

# expect STATUS REGEX COMMAND...: COMMAND exits with STATUS and its stderr matches REGEX.
expect() {
  local status=$1 regex=$2
  shift 2
  "$@" >/dev/null 2>"$work/stderr"
  local got=$?
  [ "$got" -eq "$status" ] || fail "exit $got (expected $status) from: $* | $(cat "$work/stderr")"
  grep -Eq -- "$regex" "$work/stderr" || fail "stderr does not match /$regex/: $(cat "$work/stderr")"
  echo "ok (exit $got): $(head -c 300 "$work/stderr")"
}

# Checksums of every file under DIR, and the names beside it in its parent.
snapshot() { (cd "$1" && find . -type f -exec sha256sum {} + | sort) ; ls -A "$(dirname "$1")"; }

unchanged() {
  [ "$(snapshot "$1")" = "$2" ] || fail "'$1' or its parent changed: $(snapshot "$1")"
  [ -z "$(find "$(dirname "$1")" -name '*.tmp' -o -name '*.llmtrain-*')" ] || fail "left behind: $(find "$(dirname "$1")")"
}

inside() {
  local mnt=$work/mnt
  mount -t tmpfs -o size=256k tmpfs "$mnt" || fail "mount tmpfs"
  local prepare=("$llmtrain" prepare --tokenizer "$tokenizer" --separator '\n%\n' --unit-mb 0.05)

  "${prepare[@]}" --input "$work/small.txt" --output "$mnt/ds" 2>/dev/null || fail "first prepare"
  local before
  before=$(snapshot "$mnt/ds")
  expect 2 "llmtrain: config error: output directory '$mnt/ds' is not empty .*pass --force" "${prepare[@]}" --input "$work/other.txt" --output "$mnt/ds"
  unchanged "$mnt/ds" "$before"
  expect 1 "No space left on device" "${prepare[@]}" --input "$work/big.txt" --output "$mnt/ds" --force
  unchanged "$mnt/ds" "$before"

  # With --force: exactly the dataset that a fresh directory gets.
  "${prepare[@]}" --input "$work/other.txt" --output "$mnt/ds" --force 2>/dev/null || fail "prepare --force"
  diff -r "$work/expected" "$mnt/ds" || fail "the replaced directory is not exactly the new dataset"
  [ "$(ls -A "$mnt")" = "ds" ] || fail "left beside the dataset: $(ls -A "$mnt")"

  local train_tokenizer=("$llmtrain" tokenizer train --vocab-size 300 --input "$work/small.txt")
  mkdir "$mnt/tok"
  "${train_tokenizer[@]}" --output "$mnt/tok/tokenizer.json" 2>/dev/null || fail "tokenizer train"
  dd if=/dev/zero of="$mnt/fill" bs=4k 2>/dev/null  # the disk is full
  local tok_before
  tok_before=$(snapshot "$mnt/tok")
  expect 2 "llmtrain: config error: '$mnt/tok/tokenizer.json' exists; pass --force" "${train_tokenizer[@]}" --output "$mnt/tok/tokenizer.json"
  expect 1 "No space left on device" "${train_tokenizer[@]}" --output "$mnt/tok/tokenizer.json" --force
  unchanged "$mnt/tok" "$tok_before"
  rm "$mnt/fill"
  tok_before=$(snapshot "$mnt/tok")
  before=$(snapshot "$mnt/ds")

  mount -o remount,ro "$mnt" || fail "remount read-only"
  expect 1 "Read-only file system" "${prepare[@]}" --input "$work/small.txt" --output "$mnt/ds" --force
  unchanged "$mnt/ds" "$before"
  expect 1 "Read-only file system" "${train_tokenizer[@]}" --output "$mnt/tok/tokenizer.json" --force
  unchanged "$mnt/tok" "$tok_before"
  echo "replace_safely: refusals, a full disk and a read-only filesystem left every old output intact"
}

if [ "${REPLACE_SAFELY_INSIDE:-}" = 1 ]; then
  inside
  exit $?
fi

if ! why=$(unshare --user --map-root-user --mount true 2>&1); then
  echo "SKIP: the kernel refuses a user + mount namespace (needed for a tmpfs without root): $why"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work/mnt" || fail "cannot make '$work'"
for i in $(seq 1 40); do printf 'A small document, number %d, of the old dataset.\n%%\n' "$i"; done >"$work/small.txt"
for i in $(seq 1 30); do printf 'Another document, number %d, of the new dataset.\n%%\n' "$i"; done >"$work/other.txt"
# Random text barely compresses: its dataset outgrows the 256 KiB tmpfs.
head -c 450000 /dev/urandom | base64 | awk '{ print } NR % 50 == 0 { print "%" }' >"$work/big.txt"
"$llmtrain" prepare --tokenizer "$tokenizer" --separator '\n%\n' --unit-mb 0.05 --input "$work/other.txt" --output "$work/expected" 2>/dev/null ||
  fail "prepare into a fresh directory"
REPLACE_SAFELY_INSIDE=1 exec unshare --user --map-root-user --mount "$0" "$@"
