#!/usr/bin/env bash
# resume_on_other_layouts.sh SCRATCH LLMTRAIN MPIEXEC CONFIG [--set ...]: a checkpoint saved
# at step 5 by TP2 x PP2 x DP2 (8 ranks; or SAVED_LAYOUT="RANKS [--set ...]") is resumed as 1
# process, as DP4 (ZeRO-1), as TP2 x DP2, as PP4, as DP4 under ZeRO-2, as DP4 under ZeRO-2
# sharded within blocks of 2 (hybrid) and as CP2 x TP2 (context parallel); one saved by DP2 x PP2 under ZeRO-2 (its gradient
# shards and AdamW pieces cut along layer groups) is resumed as 1 process, as DP4 without ZeRO
# and as TP2 x DP2 under ZeRO-1; one saved by the hybrid layout (two blocks holding the same
# AdamW shards, the first one's saved) as 1 process and as DP4 under plain ZeRO-2; the first
# save is resumed as DP4 under ZeRO-3 too, and one saved by DP2 x PP2 under ZeRO-3 (its
# master weights gathered for the save) as 1 process and as TP2 x DP2 under ZeRO-3 (only
# parallel.* differs: train.global_batch_size keeps the batch). The losses of steps 6..10 must
# equal those of an uninterrupted single-process run within 1e-5 relative. With SAVED_LAYOUT
# the ZeRO-2 and hybrid saves are left out (they are the same with any first save).
source "$(dirname "$0")/resume_common.sh"

run_reference
read -r -a saved_layout <<<"${SAVED_LAYOUT:-8 --set parallel.tp=2 --set parallel.pp=2}"
run saved "${saved_layout[@]}" --set checkpoint.every_steps=5 --set checkpoint.dir=\""$scratch/checkpoints"\"
hybrid=(--set parallel.zero_stage=2 --set parallel.shard_size=2)
layouts=("one_process 1" "dp4 4" "tp2_dp2 4 --set parallel.tp=2" "pp4 4 --set parallel.pp=4" "dp4_zero2 4 --set parallel.zero_stage=2" "dp4_hybrid 4 ${hybrid[*]}"
         "dp4_zero3 4 --set parallel.zero_stage=3" "cp2_tp2 4 --set parallel.cp=2 --set parallel.tp=2")
if [ -z "${SAVED_LAYOUT:-}" ]; then  # the ZeRO-2 and hybrid saves, once
    run saved_zero2 4 --set parallel.pp=2 --set parallel.zero_stage=2 --set checkpoint.every_steps=5 --set checkpoint.dir=\""$scratch/checkpoints_zero2"\"
    run saved_hybrid 4 "${hybrid[@]}" --set checkpoint.every_steps=5 --set checkpoint.dir=\""$scratch/checkpoints_hybrid"\"
    run saved_zero3 4 --set parallel.pp=2 --set parallel.zero_stage=3 --set checkpoint.every_steps=5 --set checkpoint.dir=\""$scratch/checkpoints_zero3"\"
    layouts+=("zero3_saved:one_process 1" "zero3_saved:tp2_dp2_zero3 4 --set parallel.tp=2 --set parallel.zero_stage=3")
    layouts+=("zero2_saved:one_process 1" "zero2_saved:dp4_no_zero 4 --set parallel.zero_stage=0" "zero2_saved:tp2_dp2_zero1 4 --set parallel.tp=2"
              "hybrid_saved:one_process 1" "hybrid_saved:dp4_zero2 4 --set parallel.zero_stage=2")
fi
for layout in "${layouts[@]}"; do
    set -- $layout
    name=$1
    shift
    checkpoint=$scratch/checkpoints/step_00000005
    case $name in
        zero2_saved:*) checkpoint=$scratch/checkpoints_zero2/step_00000005 name=from_zero2_${name#zero2_saved:} ;;
        zero3_saved:*) checkpoint=$scratch/checkpoints_zero3/step_00000005 name=from_zero3_${name#zero3_saved:} ;;
        hybrid_saved:*) checkpoint=$scratch/checkpoints_hybrid/step_00000005 name=from_hybrid_${name#hybrid_saved:} ;;
    esac
    run "$name" "$@" --resume "$checkpoint"
    check_resumed "$name"
done
[ "$failures" -eq 0 ] || exit 1
