#!/usr/bin/env bash
# expect_error.sh REGEX COMMAND...: passes when COMMAND exits non-zero and writes exactly one
# line to stderr, matching REGEX (extended grep syntax).
set -u
regex=$1
shift
stderr_file=$(mktemp)
trap 'rm -f "$stderr_file"' EXIT
"$@" >/dev/null 2>"$stderr_file"
status=$?
lines=$(wc -l <"$stderr_file")
if [ "$status" -eq 0 ]; then echo "FAIL: exit status 0, expected non-zero"; cat "$stderr_file"; exit 1; fi
if [ "$lines" -ne 1 ]; then echo "FAIL: $lines lines on stderr, expected 1:"; cat "$stderr_file"; exit 1; fi
if ! grep -Eq -- "$regex" "$stderr_file"; then echo "FAIL: stderr does not match /$regex/:"; cat "$stderr_file"; exit 1; fi
echo "ok (exit $status): $(cat "$stderr_file")"
