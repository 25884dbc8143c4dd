#!/usr/bin/env bash
# zero3_memory_limit.sh SCRATCH LLMTRAIN MPIEXEC CONFIG [--set ...]: ZeRO-3 never holds the
# whole weights. A model whose fp32 master weights (76 MB: 24 layers of d_model 256) do not
# fit in what a rank may hold (train.memory_limit_gb = 0.065: the plan's check and every
# allocation of the CPU backend stay within 65 MB), but whose dp-8 shards do (58 MB with
# the gradients, the AdamW state and the activations), trains, saves and resumes under
# parallel.zero_stage = 3, the resumed steps bitwise those of an uninterrupted run without
# the limit; stage 2, which holds the whole master weights, is refused before it starts.
set -u
scratch=$1 bin=$2 mpiexec=$3
shift 3
rm -rf "$scratch"
mkdir -p "$scratch"
fail() { echo "FAIL: $*"; exit 1; }
common=("$@" --set model.n_layers=24 --set model.d_model=256 --set model.tied_embeddings=false --set model.max_seq_len=32 --set train.seq_len=16
        --set train.batch_size=1 --set train.global_batch_size=8 --set train.eval_every=0 --set train.eval_sequences=1 --set train.sample_tokens=0
        --set train.threads=1 --set train.log_every=100 --set optimizer.warmup_steps=1)
limit=(--set train.memory_limit_gb=0.065)
run() {  # NAME [--set ...]
    local name=$1
    shift
    "$mpiexec" --oversubscribe -np 8 "$bin" train "${common[@]}" "$@" --run-dir "$scratch/$name" >"$scratch/$name.out" 2>&1
}
losses() { grep '"event":"step"' "$1/log.jsonl" | sed -E 's/.*"loss":([^,]*).*"step":([0-9]+),.*/\2 \1/' | awk '$1 > 2' | sort -n; }

# The whole fp32 master weights of the (tp, pp) part are more than the limit.
run reference --set parallel.zero_stage=3 --set train.steps=4 || fail "the run without a limit: $(tail -3 "$scratch/reference.out")"
part_mb=$(grep -o '[0-9.]*M parameters held' "$scratch/reference.out" | awk '{ printf "%.1f", $1 * 4 }')
awk -v part="$part_mb" 'BEGIN { exit !(part > 65) }' || fail "the fp32 part is $part_mb MB, not more than the 65 MB limit"

run zero2 --set parallel.zero_stage=2 --set train.steps=4 "${limit[@]}"
code=$?
[ "$code" = 2 ] || fail "stage 2 under the limit exited $code, expected 2: $(tail -3 "$scratch/zero2.out")"
grep -q "memory: this run needs .* per rank, has 0.0[67] GB" "$scratch/zero2.out" || fail "stage 2's refusal does not say what it needs: $(tail -2 "$scratch/zero2.out")"

checkpoints=(--set checkpoint.every_steps=2 --set checkpoint.dir=\""$scratch/checkpoints"\")
run saved --set parallel.zero_stage=3 --set train.steps=2 "${limit[@]}" "${checkpoints[@]}" || fail "stage 3 under the limit: $(tail -3 "$scratch/saved.out")"
run resumed --set parallel.zero_stage=3 --set train.steps=4 "${limit[@]}" "${checkpoints[@]}" --resume auto || fail "the resume under the limit: $(tail -3 "$scratch/resumed.out")"
grep -q "resumed from '.*step_00000002' at step 2" "$scratch/resumed.out" || fail "did not resume from step 2"
losses "$scratch/reference" >"$scratch/reference.losses"
losses "$scratch/resumed" >"$scratch/resumed.losses"
[ "$(wc -l <"$scratch/resumed.losses")" = 2 ] && cmp -s "$scratch/reference.losses" "$scratch/resumed.losses" ||
    fail "steps 3..4 after the resume differ from the uninterrupted run: $(paste "$scratch/reference.losses" "$scratch/resumed.losses")"
echo "ok: fp32 part $part_mb MB over the 65 MB limit; stage 2 refused; stage 3 trained, saved and resumed within it (steps 3..4 bitwise: $(tr '\n' ' ' <"$scratch/resumed.losses"))"
