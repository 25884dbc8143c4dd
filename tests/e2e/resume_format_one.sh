#!/usr/bin/env bash
# resume_format_one.sh SCRATCH LLMTRAIN MPIEXEC FIXTURE: a checkpoint of the first format
# (tests/fixtures/README.md: tensor-parallel parts per rank file, manifest version 1, the
# retired parallel.zero1 in its config), saved at step 3 by TP2 x DP2 under ZeRO-1, is
# verified, inspected and exported like any other, and resumes on its own layout, as one
# process and as DP4 under ZeRO-3: steps 4..6 give the losses of the run that wrote it
# within 1e-5 relative. Nothing in the checkpoint directory changes.
set -u
scratch=$1 bin=$2 mpiexec=$3 fixture=$4
rm -rf "$scratch"
mkdir -p "$scratch"
tar -xzf "$fixture" -C "$scratch" || { echo "FAIL: cannot unpack $fixture"; exit 1; }
checkpoint=$scratch/checkpoint_format_1/step_00000003
expected=$scratch/checkpoint_format_1/losses_after_step_3.txt
fail() { echo "FAIL: $*"; exit 1; }
before=$(cd "$checkpoint" && sha256sum * | sha256sum)

"$bin" checkpoint verify "$checkpoint" >"$scratch/verify.out" 2>&1 || fail "verify: $(cat "$scratch/verify.out")"
"$bin" checkpoint inspect "$checkpoint" >"$scratch/inspect.out" 2>&1 || fail "inspect: $(cat "$scratch/inspect.out")"
grep -q "ZeRO stage 1" "$scratch/inspect.out" || fail "inspect does not tell the ZeRO stage: $(grep mesh "$scratch/inspect.out")"
grep -Eq "transformer\.h\.0\.attn\.c_attn\.weight +\[48, 16\] +[0-9]+ boxes +rank 0, 1" "$scratch/inspect.out" || fail "inspect: $(grep c_attn.weight "$scratch/inspect.out")"
"$bin" checkpoint export "$checkpoint" "$scratch/hf" >"$scratch/export.out" 2>&1 || fail "export: $(cat "$scratch/export.out")"

common=(configs/tiny.toml --set model.n_layers=2 --set model.d_model=16 --set model.n_heads=2 --set model.max_seq_len=16 --set train.seq_len=16
        --set train.batch_size=2 --set train.global_batch_size=8 --set train.steps=6 --set train.eval_sequences=2 --set train.sample_tokens=0
        --set train.threads=1 --set optimizer.warmup_steps=1 --set train.log_every=100)
losses() { grep '"event":"step"' "$1/log.jsonl" | sed -E 's/.*"loss":([^,]*).*"step":([0-9]+),.*/\2 \1/' | sort -n; }
for layout in "same_layout 4 --set parallel.tp=2" "one_process 1" "dp4_zero3 4 --set parallel.zero_stage=3"; do
    set -- $layout
    name=$1 ranks=$2
    shift 2
    launch=("$bin")
    [ "$ranks" -gt 1 ] && launch=("$mpiexec" --oversubscribe -np "$ranks" "$bin")
    "${launch[@]}" train "${common[@]}" "$@" --resume "$checkpoint" --run-dir "$scratch/$name" >"$scratch/$name.out" 2>&1 ||
        fail "$name: $(tail -3 "$scratch/$name.out")"
    losses "$scratch/$name" >"$scratch/$name.losses"
    if [ "$(wc -l <"$scratch/$name.losses")" -ne 3 ] ||
       ! paste "$expected" "$scratch/$name.losses" | awk '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 1e-5 * ($2 < 0 ? -$2 : $2)) exit 1 }'; then
        echo "FAIL $name: losses of steps 4..6 (the run that wrote it | resumed):"; paste "$expected" "$scratch/$name.losses"; exit 1
    fi
    echo "ok   $name: steps 4..6 match the run that wrote the checkpoint ($(tr '\n' ' ' <"$scratch/$name.losses"))"
done
[ "$(cd "$checkpoint" && sha256sum * | sha256sum)" = "$before" ] || fail "the checkpoint directory changed"
echo "ok   verify, inspect and export read it; the checkpoint is untouched"
