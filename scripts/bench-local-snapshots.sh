#!/usr/bin/env bash
# bench-local-snapshots.sh RANKS PAIRS STEPS CONFIG [--set ...]: what local snapshots
# ([checkpoint.local]) cost a run. Runs the config on RANKS ranks (dp), each rank on a
# simulated node of its own (LLMTRAIN_NODE_NAME) so that every snapshot is also copied to
# another node when RANKS > 1, PAIRS times without snapshots and with one after every step,
# alternated (without, with, without, ...), STEPS steps each, the snapshots in /dev/shm.
# Each rank's snapshot is written by a thread of its own beside the training threads: leave
# it a core (RANKS x train.threads below the cores) or it takes the steps' time. The ranks are
# not bound to cores (mpirun binds each of 2 or fewer ranks to one core by default, where the
# thread would share the training thread's core). Prints each run's tokens/s (the run's own figure, steps after the
# first), the mean of each side and their ratio, and per snapshot the seconds the step loop
# was blocked against the copy to host memory alone (from log.jsonl), the seconds to
# complete and the bytes kept per node.
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=$1 pairs=$2 steps=$3
shift 3
bin=${LLMTRAIN:-build/llmtrain}
mpiexec=${MPIEXEC:-mpiexec}
scratch=$(mktemp -d)
shm=$(mktemp -d /dev/shm/llmtrain-bench.XXXXXX)
trap 'rm -rf "$scratch" "$shm"' EXIT
common=("$@" --set train.steps="$steps" --set train.sample_tokens=0 --set train.eval_every=0 --set train.log_every=1000 --set parallel.dp="$ranks"
        --set metrics.enabled=off --set checkpoint.local.dir=\""$shm/{node}"\")

run() {  # NAME [--set ...]: the run's tokens/s
    local name=$1
    shift
    local launch=() r
    for r in $(seq 0 $((ranks - 1))); do
        [ "$r" -gt 0 ] && launch+=(:)
        launch+=(-np 1 -x LLMTRAIN_NODE_NAME="node$r" "$bin" train "${common[@]}" "$@" --run-dir "$scratch/$name")
    done
    "$mpiexec" --oversubscribe --bind-to none "${launch[@]}" >"$scratch/$name.out" 2>&1 || { echo "run $name failed:" >&2; tail -5 "$scratch/$name.out" >&2; exit 1; }
    grep '"event":"end"' "$scratch/$name/log.jsonl" | sed -E 's/.*"tokens_per_second":([0-9.e+]+).*/\1/'
}

without=() with=()
for i in $(seq "$pairs"); do
    without+=("$(run "without-$i")")
    with+=("$(run "with-$i" --set checkpoint.local.every_steps=1)")
    echo "pair $i: tokens/s without snapshots ${without[-1]} | with a snapshot every step ${with[-1]}"
done
printf '%s\n' "${without[@]}" | awk '{ s += $1 } END { printf "%.1f\n", s / NR }' >"$scratch/mean-without"
printf '%s\n' "${with[@]}" | awk '{ s += $1 } END { printf "%.1f\n", s / NR }' >"$scratch/mean-with"
awk -v a="$(cat "$scratch/mean-without")" -v b="$(cat "$scratch/mean-with")" \
    'BEGIN { printf "mean tokens/s: without %.1f | with %.1f | with / without %.3f (%+.1f%%)\n", a, b, b / a, 100 * (b - a) / a }'
cat "$scratch"/with-*/log.jsonl | grep '"event":"local_snapshot"' |
    sed -E 's/.*"blocked_seconds":([0-9.e-]+),.*"copy_seconds":([0-9.e-]+),.*"own_bytes":([0-9]+),.*"replica_bytes":([0-9]+),.*"seconds_to_complete":([0-9.e-]+),.*/\1 \2 \3 \4 \5/' |
    awk '{ b += $1; c += $2; mb = ($3 + $4) / 1e6; t += $5; if ($1 > c_max_b) c_max_b = $1; n++ }
         END { printf "%d snapshots: step loop blocked %.4f s on average (max %.4f s), of which the copy to host %.4f s | complete %.3f s after the copy | %.1f MB node-local on rank 0 (own + copies)\n", n, b / n, c_max_b, c / n, t / n, mb }'
echo "machine: $(getconf _NPROCESSORS_ONLN) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); commit $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (modified)')"
