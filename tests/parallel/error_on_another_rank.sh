#!/usr/bin/env bash
# error_on_another_rank.sh SCRATCH LLMTRAIN MPIEXEC CONFIG [--set ...]: an error on rank 1 of 2
# (an injected hardware fault) ends the job with its exit code (76), and rank 0's run
# directory tells it: log.jsonl's last record is that error, naming rank 1.
set -u
scratch=$1 bin=$2 mpiexec=$3
shift 3
rm -rf "$scratch"
LLMTRAIN_INJECT_FAULT=hardware:1:3 "$mpiexec" --oversubscribe -np 2 "$bin" train "$@" --set train.steps=10 --set train.sample_tokens=0 \
    --run-dir "$scratch/run" >"$scratch.out" 2>&1
status=$?
last=$(tail -n 1 "$scratch/run/log.jsonl")
if [ "$status" -ne 76 ] || ! echo "$last" | grep -q '"event":"error"' || ! echo "$last" | grep -q '"rank":1' || ! echo "$last" | grep -q '"kind":"hardware fault"'; then
    echo "FAIL: exit $status (want 76), last record: $last"; tail -5 "$scratch.out"; exit 1
fi
echo "ok: exit $status; last record $last"
