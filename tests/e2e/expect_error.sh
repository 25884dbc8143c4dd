#!/usr/bin/env bash
# expect_error.sh [--exit N] REGEX COMMAND...: passes when COMMAND exits non-zero (with N
# when given) and writes exactly one line to stderr, which starts with "llmtrain: " and
# matches REGEX (extended grep syntax).
set -u
want_status=""
if [ "$1" = "--exit" ]; then want_status=$2; shift 2; fi
regex=$1
shift
stderr_file=$(mktemp)
trap 'rm -f "$stderr_file"' EXIT
"$@" >/dev/null 2>"$stderr_file"
status=$?
lines=$(wc -l <"$stderr_file")
if [ "$status" -eq 0 ]; then echo "FAIL: exit status 0, expected non-zero"; cat "$stderr_file"; exit 1; fi
if [ -n "$want_status" ] && [ "$status" -ne "$want_status" ]; then echo "FAIL: exit status $status, expected $want_status"; cat "$stderr_file"; exit 1; fi
if [ "$lines" -ne 1 ]; then echo "FAIL: $lines lines on stderr, expected 1:"; cat "$stderr_file"; exit 1; fi
if ! grep -q '^llmtrain: ' "$stderr_file"; then echo "FAIL: the line does not start with 'llmtrain: ':"; cat "$stderr_file"; exit 1; fi
if ! grep -Eq -- "$regex" "$stderr_file"; then echo "FAIL: stderr does not match /$regex/:"; cat "$stderr_file"; exit 1; fi
echo "ok (exit $status): $(cat "$stderr_file")"
