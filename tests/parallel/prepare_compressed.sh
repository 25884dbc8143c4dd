#!/usr/bin/env bash
# Compressed and dirty input through the command line, on 1 process and under mpirun with 4
# ranks: the .gz, .zst, .jsonl.gz and .jsonl.zst forms of a corpus (made by the gzip and zstd
# tools), and a gzip file named .txt, give the same dataset bytes as the plain files; a
# binary input is refused (exit 2) naming it; `tokenizer train` reads the JSONL's documents; a JSONL file with bad records stops at the
# first naming file:line (exit 2), and with --on-bad-record skip gives the tokens of the
# file without those lines, counting and listing them.
# usage: prepare_compressed.sh LLMTRAIN MPIEXEC CORPUS WORK_DIR
set -euo pipefail
llmtrain=$1 mpiexec=$2 corpus=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
fail() { echo "prepare_compressed: $*" >&2; exit 1; }
"$llmtrain" tokenizer train --vocab-size 800 --input "$corpus" --output "$work/tokenizer.json" >/dev/null
head -c 400000 "$corpus" >"$work/corpus.txt"
# One JSON object per fortune.
python3 -c 'import json, sys
for n, doc in enumerate(open(sys.argv[1], encoding="utf-8", errors="surrogateescape").read().split("\n%\n")):
    if doc: print(json.dumps({"text": doc.encode("utf-8", "surrogateescape").decode("utf-8", "replace"), "n": n}))' "$work/corpus.txt" >"$work/corpus.jsonl"
gzip -k "$work/corpus.txt" "$work/corpus.jsonl"
zstd -q -k "$work/corpus.txt" "$work/corpus.jsonl"
cp "$work/corpus.txt.gz" "$work/gzip-named.txt"
common=(--tokenizer "$work/tokenizer.json" --unit-mb 0.05 --val-fraction 0.1)
prepare() { "$llmtrain" prepare "${common[@]}" --threads 2 "$@" >/dev/null; }
prepare_np4() { "$mpiexec" -np 4 --oversubscribe "$llmtrain" prepare "${common[@]}" --threads 1 "$@" >/dev/null; }
prepare --input "$work/corpus.txt" --separator '\n%\n' --output "$work/plain-text"
prepare --input "$work/corpus.jsonl" --output "$work/plain-jsonl"
[ "$(ls "$work/plain-text" | grep -c ltshard)" -ge 8 ] || fail "expected several shards"
for input in corpus.txt.gz corpus.txt.zst gzip-named.txt corpus.jsonl.gz corpus.jsonl.zst; do
    case $input in *jsonl*) expected=plain-jsonl; args=() ;; *) expected=plain-text; args=(--separator '\n%\n') ;; esac
    prepare --input "$work/$input" "${args[@]}" --output "$work/$input.np1"
    prepare_np4 --input "$work/$input" "${args[@]}" --output "$work/$input.np4"
    diff -r "$work/$expected" "$work/$input.np1" || fail "$input on 1 process differs from the plain file's dataset"
    diff -r "$work/$expected" "$work/$input.np4" || fail "$input on 4 ranks differs from the plain file's dataset"
done
echo "prepare_compressed: .gz, .zst, .jsonl.gz, .jsonl.zst and gzip named .txt give the plain files' dataset on 1 and 4 ranks"

# tokenizer train reads a JSONL corpus, compressed or not, as its documents, not as JSON text.
for input in corpus.jsonl corpus.jsonl.zst; do
    "$llmtrain" tokenizer train --vocab-size 600 --input "$work/$input" --output "$work/tok-$input.json" >/dev/null
done
"$llmtrain" tokenizer train --vocab-size 600 --input-format text --input "$work/corpus.jsonl" --output "$work/tok-json-as-text.json" >/dev/null
cmp "$work/tok-corpus.jsonl.json" "$work/tok-corpus.jsonl.zst.json" || fail "tokenizer train: .jsonl.zst differs from .jsonl"
if cmp -s "$work/tok-corpus.jsonl.json" "$work/tok-json-as-text.json"; then fail "tokenizer train: JSONL was trained on as JSON text"; fi

status=0
"$llmtrain" prepare "${common[@]}" --input "$llmtrain" --output "$work/binary" 2>"$work/stderr" || status=$?
[ "$status" -eq 2 ] || fail "a binary input: exit $status, expected 2"
grep -q "input '$llmtrain' does not look like text" "$work/stderr" || { cat "$work/stderr"; fail "the refusal does not name the file"; }

# Bad records after lines 7 and 20 of the clean file: lines 8 and 22 of the dirty one.
awk 'NR == 7 { print; print "{\"text\": null}"; next } NR == 20 { print; print "not json"; next } { print }' "$work/corpus.jsonl" >"$work/dirty.jsonl"
zstd -q -k "$work/dirty.jsonl"
status=0
"$llmtrain" prepare "${common[@]}" --input "$work/dirty.jsonl.zst" --output "$work/dirty-abort" 2>"$work/stderr" || status=$?
[ "$status" -eq 2 ] || fail "bad records with the default policy: exit $status, expected 2"
grep -q "dirty.jsonl.zst:8: record has no string field \"text\"" "$work/stderr" || { cat "$work/stderr"; fail "the error does not name file:line"; }
[ ! -e "$work/dirty-abort" ] || [ -z "$(ls -A "$work/dirty-abort")" ] || fail "an aborted run left a dataset"
prepare_np4 --input "$work/dirty.jsonl.zst" --on-bad-record skip --output "$work/dirty-skip" 2>"$work/stderr"
grep -q '"skipped_records": 2' "$work/dirty-skip/dataset.json" || fail "the manifest does not count 2 skipped records"
[ "$(cut -d, -f2 "$work/dirty-skip/skipped-records.jsonl" | tr -d ' ' | paste -sd' ')" = '"line":8 "line":22' ] || { cat "$work/dirty-skip/skipped-records.jsonl"; fail "skipped lines listed wrongly"; }
for f in "$work/plain-jsonl"/*.ltshard; do cmp "$f" "$work/dirty-skip/$(basename "$f")" || fail "skipping changed the tokens of $(basename "$f")"; done
echo "prepare_compressed: a binary input is refused; bad records abort naming file:line, or are skipped, counted and listed"
