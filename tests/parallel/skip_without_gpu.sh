#!/usr/bin/env bash
# skip_without_gpu.sh COMMAND...: runs COMMAND; when it reports that this machine or build
# has no usable GPU, exits 77, which CTest counts as a skipped test (never as passed).
set -u
output=$("$@" 2>&1)
status=$?
echo "$output"
if [ "$status" -ne 0 ] && echo "$output" | grep -Eq "needs a GPU|built without CUDA"; then exit 77; fi
exit "$status"
