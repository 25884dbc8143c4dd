#!/usr/bin/env bash
# overlap_param_gather.sh SCRATCH LLMTRAIN MPIEXEC CONFIG [--set ...]: under ZeRO-1 (dp 2, small
# buckets), ZeRO-2 (dp 3: layer groups whose padded cuts go through the gradient pool's two
# buffers, the tied embedding's group resident) and ZeRO-2 over pp 2 x dp 2, a run with
# parallel.overlap_param_gather = true has bitwise the losses, gradient norms and validation
# losses of the same run without it (evaluation every 2 steps, a checkpoint every 3, the text
# sample at the end: each completes the gathers in flight first), and resuming its step-3
# checkpoint with the overlap on repeats steps 4..6 bit for bit.
set -u
scratch=$1 bin=$2 mpiexec=$3
shift 3
rm -rf "$scratch"
mkdir -p "$scratch"
common=("$@" --set train.steps=6 --set train.eval_every=2 --set train.log_every=100 --set train.sample_tokens=4)
failures=0

run() {  # NAME RANKS [--set ...]
    local name=$1 ranks=$2
    shift 2
    "$mpiexec" --oversubscribe -np "$ranks" "$bin" train "${common[@]}" "$@" --run-dir "$scratch/$name" >"$scratch/$name.out" 2>&1 ||
        { echo "FAIL: run $name failed:"; tail -5 "$scratch/$name.out"; exit 1; }
}
# "step N LOSS GRAD_NORM" and "eval N VAL_LOSS" as logged (the shortest text that reads back
# to the same double: equal text is equal bits)
figures() {
    python3 -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["event"] == "step": print("step", r["step"], repr(r["loss"]), repr(r["grad_norm"]))
    elif r["event"] == "eval": print("eval", r["step"], repr(r["val_loss"]))
' "$1/log.jsonl"
}
same() {  # WHAT A B
    if cmp -s "$2" "$3"; then
        echo "ok   $1: $(wc -l <"$2") records bitwise equal"
    else
        echo "FAIL $1:"; diff "$2" "$3" | head -20; failures=$((failures + 1))
    fi
}

layouts=("zero1_dp2 2 --set parallel.zero_stage=1 --set parallel.bucket_mb=0.01"
         "zero2_dp3 3 --set parallel.zero_stage=2"
         "zero2_pp2_dp2 4 --set parallel.zero_stage=2 --set parallel.pp=2")
for layout in "${layouts[@]}"; do
    set -- $layout
    name=$1 ranks=$2
    shift 2
    run "${name}_plain" "$ranks" "$@"
    run "${name}_overlap" "$ranks" "$@" --set parallel.overlap_param_gather=true \
        --set checkpoint.every_steps=3 --set checkpoint.dir=\""$scratch/${name}_checkpoints"\"
    grep -q "parameter all-gathers behind the next forward" "$scratch/${name}_overlap.out" ||
        { echo "FAIL $name: the start-up line does not say the gathers overlap"; failures=$((failures + 1)); }
    figures "$scratch/${name}_plain" >"$scratch/${name}_plain.figures"
    figures "$scratch/${name}_overlap" >"$scratch/${name}_overlap.figures"
    same "$name overlapped" "$scratch/${name}_plain.figures" "$scratch/${name}_overlap.figures"
    run "${name}_resumed" "$ranks" "$@" --set parallel.overlap_param_gather=true --resume "$scratch/${name}_checkpoints/step_00000003"
    figures "$scratch/${name}_resumed" | grep -E '^step [4-6] ' >"$scratch/${name}_resumed.figures"
    grep -E '^step [4-6] ' "$scratch/${name}_plain.figures" >"$scratch/${name}_plain_4_6.figures"
    same "$name resumed at step 3, overlapped" "$scratch/${name}_plain_4_6.figures" "$scratch/${name}_resumed.figures"
done
[ "$failures" -eq 0 ] || exit 1
