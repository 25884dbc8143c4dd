#!/usr/bin/env bash
# resume_across_zero_stages.sh SCRATCH LLMTRAIN MPIEXEC CONFIG [--set ...]: checkpoints saved at
# step 5 by DP4 under each ZeRO stage (0: replicated, 1: AdamW state sharded, 2: gradients
# too, 3: parameters too) are each resumed under every other stage, as DP4 or as TP2 x DP2,
# and the losses of steps 6..10 must equal those of an uninterrupted single-process run within
# 1e-5 relative: whatever cut the saving stage made of the state (buckets or layer groups,
# pieces in shards or whole), the pieces land where the resuming stage keeps them.
set -u
scratch=$1 bin=$2 mpiexec=$3
shift 3
rm -rf "$scratch"
mkdir -p "$scratch"
common=("$@" --set train.steps=10 --set train.batch_size=2 --set train.global_batch_size=8 --set train.sample_tokens=0 --set train.log_every=100)

run() {  # NAME RANKS [--set ...]
    local name=$1 ranks=$2
    shift 2
    local launch=("$bin")
    [ "$ranks" -gt 1 ] && launch=("$mpiexec" --oversubscribe -np "$ranks" "$bin")
    "${launch[@]}" train "${common[@]}" "$@" --run-dir "$scratch/$name" >"$scratch/$name.out" 2>&1 ||
        { echo "FAIL: run $name failed:"; tail -5 "$scratch/$name.out"; exit 1; }
}
losses() { grep '"event":"step"' "$1/log.jsonl" | sed -E 's/.*"loss":([^,]*).*"step":([0-9]+),.*/\2 \1/' | awk '$1 > 5' | sort -n; }

run reference 1
losses "$scratch/reference" >"$scratch/reference.losses"
for stage in 0 1 2 3; do
    run "saved_zero$stage" 4 --set parallel.zero_stage=$stage --set checkpoint.every_steps=5 --set checkpoint.dir=\""$scratch/checkpoints_zero$stage"\"
done
failures=0
for saved in 0 1 2 3; do
    for resumed in 0 1 2 3; do
        [ "$saved" = "$resumed" ] && continue
        # Half the resumes also change the layout: tensor parallelism cuts every tensor anew.
        layout=()
        [ $(((saved + resumed) % 2)) = 1 ] && layout=(--set parallel.tp=2)
        name=zero${saved}_as_zero${resumed}${layout:+_tp2}
        run "$name" 4 --set parallel.zero_stage=$resumed "${layout[@]}" --resume "$scratch/checkpoints_zero$saved/step_00000005"
        losses "$scratch/$name" >"$scratch/$name.losses"
        if [ "$(wc -l <"$scratch/$name.losses")" -ne 5 ] ||
           ! paste "$scratch/reference.losses" "$scratch/$name.losses" | awk '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 1e-5 * ($2 < 0 ? -$2 : $2)) exit 1 }'; then
            echo "FAIL $name: losses of steps 6..10 (reference | resumed):"; paste "$scratch/reference.losses" "$scratch/$name.losses"; failures=$((failures + 1))
        else
            echo "ok   $name: steps 6..10 match the uninterrupted run within 1e-5 ($(tr '\n' ' ' <"$scratch/$name.losses"))"
        fi
    done
done
[ "$failures" -eq 0 ] || exit 1
