#!/usr/bin/env bash
# expect_job_failure.sh SECONDS REGEX COMMAND...: passes when COMMAND ends by itself within
# SECONDS with a non-zero exit status and its output (stdout and stderr) matches REGEX
# (extended grep syntax). A job still running after SECONDS is a hang: the test fails.
# With --fresh DIR first, DIR (the job's run directory) is removed before the job starts.
set -u
if [ "$1" = "--fresh" ]; then rm -rf "$2"; shift 2; fi
limit=$1 regex=$2
shift 2
output=$(mktemp)
trap 'rm -f "$output"' EXIT
start=$(date +%s)
timeout --kill-after=5 "$limit" "$@" >"$output" 2>&1
status=$?
elapsed=$(($(date +%s) - start))
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then echo "FAIL: still running after ${limit} s (a hang)"; tail -20 "$output"; exit 1; fi
if [ "$status" -eq 0 ]; then echo "FAIL: exit status 0, expected a failed job"; tail -20 "$output"; exit 1; fi
if ! grep -Eq -- "$regex" "$output"; then echo "FAIL: output does not match /$regex/:"; tail -30 "$output"; exit 1; fi
echo "ok: exit $status after ${elapsed} s: $(grep -E -m1 -- "$regex" "$output")"
