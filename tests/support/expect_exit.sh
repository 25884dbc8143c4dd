#!/usr/bin/env bash
# expect_exit.sh [--exit N] [--skip N] COMMAND...: runs COMMAND, its output passed through,
# then checks its exit status (N, 0 when not given). CTest ignores the exit status of a test
# that has a PASS_REGULAR_EXPRESSION, so a crash after the matched line would pass: such a
# test runs through this script (llmtrain_output_test, cmake/output_test.cmake), and its
# FAIL_REGULAR_EXPRESSION matches the "expect_exit: FAILED" line printed on any other status.
# Exits 0 on the expected status, with the --skip status (CTest's SKIP_RETURN_CODE) as it is,
# and 1 otherwise.
set -u
want=0 skip=""
while [ $# -gt 0 ]; do
  case "$1" in
    --exit) want=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    *) break ;;
  esac
done
if [ $# -eq 0 ]; then echo "expect_exit: FAILED: no command to run"; exit 1; fi
"$@"
status=$?
if [ "$status" -eq "$want" ]; then echo "expect_exit: exit status $status, as expected"; exit 0; fi
if [ -n "$skip" ] && [ "$status" -eq "$skip" ]; then echo "expect_exit: exit status $status: skipped"; exit "$status"; fi
echo "expect_exit: FAILED: exit status $status, expected $want"
exit 1
