#!/usr/bin/env bash
# supervise_decisions.sh SCRATCH LLMTRAIN MPIEXEC SUPERVISE CONFIG [--set ...]: what
# scripts/llmtrain-supervise decides from llmtrain's exit codes.
#  - a rank that crashes at the same step after every restart: the latest checkpoint stops
#    advancing and the supervisor gives up after --no-progress restarts with exit 4;
#  - a job that keeps failing, with the progress check off, stops with exit 5 once
#    --max-restarts restarts are spent;
#  - a config error (exit 2) and a diverged run (exit 3) are not restarted.
set -u
scratch=$1 bin=$2 mpiexec=$3 supervise=$4
shift 4
rm -rf "$scratch"
mkdir -p "$scratch"
common=("$@" --set train.steps=30 --set checkpoint.every_steps=5 --set train.sample_tokens=0 --set train.log_every=100)
failed=0
# expect NAME CODE ATTEMPTS SUPERVISOR-ARGS -- COMMAND: the supervisor's exit code and attempts.
expect() {
    local name=$1 want_code=$2 want_attempts=$3
    shift 3
    "$supervise" "$@" >"$scratch/$name.out" 2>&1
    local code=$? attempts
    attempts=$(grep -c "attempt [0-9]*:" "$scratch/$name.out")
    if [ $code -eq "$want_code" ] && [ "$attempts" -eq "$want_attempts" ]; then
        echo "ok: $name: exit $code after $attempts attempt(s): $(tail -1 "$scratch/$name.out")"
    else
        echo "FAIL: $name: exit $code after $attempts attempt(s), expected exit $want_code after $want_attempts"
        tail -5 "$scratch/$name.out"
        failed=1
    fi
}

# Rank 1 aborts at step 12 of every attempt: checkpoints 5 and 10 are saved (synchronously) by
# the first, none after; 1 attempt + 2 restarts that make no progress.
LLMTRAIN_INJECT_FAULT=abort:1:12 expect same_step_every_time 4 3 --backoff 0 --no-progress 2 -- \
    "$mpiexec" --oversubscribe -np 2 "$bin" train "${common[@]}" --set checkpoint.async=false --set checkpoint.dir=\""$scratch/stuck"\" --run-dir "$scratch/stuck-{attempt}"
# Rank 0 aborts at step 12: with one restart allowed and no-progress checks off, the budget runs out.
LLMTRAIN_INJECT_FAULT=abort:0:12 expect restarts_spent 5 2 --backoff 0 --max-restarts 1 --no-progress 0 -- \
    "$bin" train "${common[@]}" --set checkpoint.dir=\""$scratch/spent"\" --run-dir "$scratch/spent-{attempt}"
expect config_error_not_restarted 2 1 --backoff 0 --checkpoint-dir "$scratch/bad" -- \
    "$bin" train "${common[@]}" --set train.steps=-1 --set checkpoint.dir=\""$scratch/bad"\" --run-dir "$scratch/bad-{attempt}"
LLMTRAIN_INJECT_FAULT=nan:0:3 expect diverged_not_restarted 3 1 --backoff 0 -- \
    "$bin" train "${common[@]}" --set monitor.on_nonfinite=\"abort\" --set checkpoint.dir=\""$scratch/diverged"\" --run-dir "$scratch/diverged-{attempt}"
exit $failed
