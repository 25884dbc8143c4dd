#!/usr/bin/env bash
# config_error_once.sh MPIEXEC LLMTRAIN CONFIG: a bad config under `mpirun -np 3` is reported
# by one line (not one per rank) and every rank exits with code 2.
set -u
mpiexec=$1 bin=$2 config=$3
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$mpiexec" --oversubscribe -np 3 "$bin" train "$config" --run-dir /tmp/never-created-by-config-error-once >"$out" 2>&1
status=$?
lines=$(grep -c '^llmtrain: ' "$out")
if [ "$status" -ne 2 ] || [ "$lines" -ne 1 ]; then
    echo "FAIL: exit $status (want 2), $lines 'llmtrain:' lines (want 1):"; cat "$out"; exit 1
fi
echo "ok: $(grep '^llmtrain: ' "$out")"
