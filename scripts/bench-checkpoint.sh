#!/usr/bin/env bash
# bench-checkpoint.sh STEPS CONFIG [--set ...]: what checkpoints cost the step loop. Trains
# STEPS steps three times (no checkpoints; checkpoint.every_steps = 10 asynchronously; the
# same synchronously) and prints, from each run's log: the state saved, the seconds the step
# loop was blocked per save, the seconds written in the background, and the step loop's wall
# time against the run without checkpoints (the final save, after the last step, excluded).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=$1
shift
bin=${LLMTRAIN:-build/llmtrain}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
common=("$@" --set train.steps="$steps" --set train.sample_tokens=0 --set train.eval_every=0 --set train.log_every=1000)

run() {  # NAME [--set ...]: prints the wall seconds from the first step record to the last
    local name=$1
    shift
    "$bin" train "${common[@]}" "$@" --set checkpoint.dir=\""$scratch/$name-checkpoints"\" --run-dir "$scratch/$name" >"$scratch/$name.out" 2>&1
    grep '"event":"step"' "$scratch/$name/log.jsonl" | sed -E 's/.*"time":"[0-9-]+T([0-9]+):([0-9]+):([0-9.]+)Z".*/\1 \2 \3/' |
        awk 'NR == 1 { first = $1 * 3600 + $2 * 60 + $3 } { last = $1 * 3600 + $2 * 60 + $3 } END { t = last - first; if (t < 0) t += 86400; printf "%.3f", t }'
}
saves() {  # NAME: per save "blocked_s background_s MB"
    grep -o "checkpoint [^ ]*: [0-9.]* MB in .*" "$scratch/$1.out" |
        sed -E 's/.*: ([0-9.]+) MB in .*blocked ([0-9.]+) s .* in ([0-9.]+) s.*/\2 \3 \1/'
}

none=$(run none)
async=$(run async --set checkpoint.every_steps=10 --set checkpoint.async=true)
sync=$(run sync --set checkpoint.every_steps=10 --set checkpoint.async=false)
echo "step loop (wall time from the first step record to the last, $steps steps): none ${none} s | async every 10: ${async} s | sync every 10: ${sync} s"
awk -v n="$none" -v a="$async" -v s="$sync" 'BEGIN { printf "slowdown against no checkpoints: async %+.1f%% | sync %+.1f%%\n", 100 * (a - n) / n, 100 * (s - n) / n }'
for mode in async sync; do
    saves "$mode" | awk -v m="$mode" '{ b += $1; w += $2; mb = $3; k++ } END { if (k) printf "%s: %d saves of %.1f MB | step loop blocked %.3f s per save | written in %.3f s per save\n", m, k, mb, b / k, w / k }'
done
