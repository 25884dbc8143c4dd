#!/usr/bin/env bash
# overlap_param_gather.sh SCRATCH LLMTRAIN MPIEXEC CONFIG [--set ...]: under ZeRO-1 (dp 2, small
# buckets), ZeRO-2 (dp 3: layer groups whose padded cuts go through the gradient pool's two
# buffers, the tied embedding's group resident) and ZeRO-2 over pp 2 x dp 2, a run with
# parallel.overlap_param_gather = true has bitwise the losses, gradient norms and validation
# losses of the same run without it (evaluation every 2 steps, a checkpoint every 3, the text
# sample at the end: each completes the gathers in flight first), and resuming its step-3
# checkpoint with the overlap on repeats steps 4..6 bit for bit.
source "$(dirname "$0")/bitwise_option_common.sh"
common=(--set train.steps=6 --set train.eval_every=2 --set train.log_every=100 --set train.sample_tokens=4)

layouts=("zero1_dp2 2 --set parallel.zero_stage=1 --set parallel.bucket_mb=0.01"
         "zero2_dp3 3 --set parallel.zero_stage=2"
         "zero2_pp2_dp2 4 --set parallel.zero_stage=2 --set parallel.pp=2")
for layout in "${layouts[@]}"; do
    set -- $layout  # NAME RANKS --set ...
    expect_option_is_bitwise "$1" "$2" parallel.overlap_param_gather=true "parameter all-gathers behind the next forward" "${@:3}"
done
[ "$failures" -eq 0 ] || exit 1
