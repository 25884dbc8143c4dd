#!/usr/bin/env bash
# stopped_rank_named.sh RUN_DIR LLMTRAIN MPIEXEC CONFIG [--set ...]: world rank 1 of a 4-rank run
# stops itself with SIGSTOP at step 3 (LLMTRAIN_INJECT_FAULT=stop:1:3), as a frozen node would.
# With parallel.timeout_seconds = 5 the job must end by itself with a non-zero status, a
# timeout message must name world rank 1 and its host (LLMTRAIN_NODE_NAME) as the rank that
# never arrived, with its process stopped, and no message may name another rank so. The
# stopped process is continued and killed on the way out, whatever happened.
set -u
run_dir=$1 bin=$2 mpiexec=$3
shift 3
host=hang-test-node
rm -rf "$run_dir"
mkdir -p "$run_dir"
out="$run_dir/job.out"
end_stopped_rank() {
    pid=$(sed -nE 's/.*injected fault: stop at step [0-9]+ \(pid ([0-9]+)\).*/\1/p' "$out" | head -1)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -CONT "$pid"; kill -KILL "$pid"; fi
}
trap end_stopped_rank EXIT
start=$(date +%s)
LLMTRAIN_INJECT_FAULT=stop:1:3 LLMTRAIN_NODE_NAME=$host timeout --kill-after=5 90 \
    "$mpiexec" --oversubscribe -np 4 "$bin" train "$@" --run-dir "$run_dir/run" >"$out" 2>&1
status=$?
elapsed=$(($(date +%s) - start))
fail() { echo "FAIL: $1"; tail -30 "$out"; exit 1; }
[ "$status" -ne 124 ] && [ "$status" -ne 137 ] || fail "still running after 90 s (a hang)"
[ "$status" -ne 0 ] || fail "exit status 0, expected a failed job"
grep -q "\[rank 1\] injected fault: stop at step 3" "$out" || fail "rank 1 never stopped itself"
named=$(grep -E -m1 "error: .* did not complete within 5 s \(parallel\.timeout_seconds\): .*world rank 1 on host $host never arrived \([^)]*its process is stopped" "$out")
[ -n "$named" ] || fail "no timeout message names world rank 1 on host $host as never arrived, stopped"
if grep -Eq "world rank [023] on host [^ ]+ never arrived" "$out"; then fail "a healthy rank is named as never arrived: $(grep -Eo "world rank [023] on host [^ ]+ never arrived" "$out" | head -1)"; fi
echo "ok: exit $status after ${elapsed} s: $named"
