#!/usr/bin/env bash
# resume_across_zero_stages.sh SCRATCH LLMTRAIN MPIEXEC CONFIG [--set ...]: checkpoints saved at
# step 5 by DP4 under each ZeRO stage (0: replicated, 1: AdamW state sharded, 2: gradients
# too, 3: parameters too) are each resumed under every other stage, as DP4 or as TP2 x DP2,
# and the losses of steps 6..10 must equal those of an uninterrupted single-process run within
# 1e-5 relative: whatever cut the saving stage made of the state (buckets or layer groups,
# pieces in shards or whole), the pieces land where the resuming stage keeps them.
source "$(dirname "$0")/resume_common.sh"

run_reference
for stage in 0 1 2 3; do
    run "saved_zero$stage" 4 --set parallel.zero_stage=$stage --set checkpoint.every_steps=5 --set checkpoint.dir=\""$scratch/checkpoints_zero$stage"\"
done
for saved in 0 1 2 3; do
    for resumed in 0 1 2 3; do
        [ "$saved" = "$resumed" ] && continue
        # Half the resumes also change the layout: tensor parallelism cuts every tensor anew.
        layout=()
        [ $(((saved + resumed) % 2)) = 1 ] && layout=(--set parallel.tp=2)
        name=zero${saved}_as_zero${resumed}${layout:+_tp2}
        run "$name" 4 --set parallel.zero_stage=$resumed "${layout[@]}" --resume "$scratch/checkpoints_zero$saved/step_00000005"
        check_resumed "$name"
    done
done
[ "$failures" -eq 0 ] || exit 1
