#!/usr/bin/env bash
# bench-checkpoint.sh STEPS CONFIG [--set ...]: what checkpoints cost the step loop. Trains
# STEPS steps three times (no checkpoints; checkpoint.every_steps = 10 asynchronously; the
# same synchronously) and prints, from each run's log: the state saved, the seconds the step
# loop was blocked per save, the seconds written in the background, and the step loop's wall
# time against the run without checkpoints (the final save, after the last step, excluded),
# and the rate of a save's host checksum passes.
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
# The host passes of a save beside the write itself, timed as `checkpoint verify` runs them
# over the last checkpoint (in the page cache): XXH64 over each rank file, Fletcher32 over
# each chunk. plan's save model takes this rate as storage.checksum_gbps.
last=$(ls -d "$scratch"/async-checkpoints/step_* | tail -n 1)
"$bin" checkpoint verify "$last" | sed -nE 's/.*, ([0-9.]+) MB; .* verified in ([0-9.]+) s, ([0-9.]+) GB\/s.*/host checksums (XXH64 + Fletcher32, one thread, page cache): \1 MB in \2 s: \3 GB\/s/p'
for mode in async sync; do
    saves "$mode" | awk -v m="$mode" '{ b += $1; w += $2; mb = $3; k++ } END { if (k) printf "%s: %d saves of %.1f MB | step loop blocked %.3f s per save | written in %.3f s per save\n", m, k, mb, b / k, w / k }'
done
