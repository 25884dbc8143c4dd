#!/usr/bin/env bash
# export_init_from.sh MPIEXEC LLMTRAIN SCRATCH: a checkpoint saved by tp 2 x pp 2 (four rank
# files, split QKV blocks, row- and column-parallel weights, the embedding split by rows) is
# exported whole to safetensors; a tp 2 x pp 2 run started from that export (train.init_from:
# each rank takes its part) has bitwise the first loss and gradient norm of the run resumed
# from the checkpoint. Every training step sees the same one-window batch, so the first loss
# depends on the weights alone.
set -u
mpiexec=$1 bin=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir"
printf 'Fortune favours!?' >"$dir/window.txt"   # seq_len + 1 bytes: one training window
run=(--oversubscribe -np 4 "$bin" train configs/tiny.toml --set model.n_layers=2 --set model.d_model=32 --set model.vocab_size=258
     --set train.batch_size=2 --set train.seq_len=16 --set train.grad_accum=2 --set train.eval_sequences=2 --set train.sample_tokens=0
     --set train.threads=1 --set optimizer.warmup_steps=1 --set train.steps=4 --set parallel.tp=2 --set parallel.pp=2
     --set data.train_path="$dir/window.txt" --set data.val_path=data/fortunes.txt --set checkpoint.dir="$dir/checkpoints")
fail() { echo "FAIL: $*"; exit 1; }

"$mpiexec" "${run[@]}" --set checkpoint.every_steps=2 --run-dir "$dir/saved" >"$dir/saved.out" 2>&1 || { cat "$dir/saved.out"; fail "training"; }
"$bin" checkpoint export "$dir/checkpoints/step_00000002" --format safetensors "$dir/hf" || fail "export"
"$mpiexec" "${run[@]}" --resume "$dir/checkpoints/step_00000002" --run-dir "$dir/resumed" >"$dir/resumed.out" 2>&1 || { cat "$dir/resumed.out"; fail "resume"; }
"$mpiexec" "${run[@]}" --set train.init_from="$dir/hf" --run-dir "$dir/started" >"$dir/started.out" 2>&1 || { cat "$dir/started.out"; fail "init_from"; }

# "loss":...,"grad_norm":... of the first step record.
first_step() { grep -m1 '"event":"step"' "$1/log.jsonl" | grep -o '"\(loss\|grad_norm\)":[^,]*' | sort | tr '\n' ' '; }
resumed=$(first_step "$dir/resumed") started=$(first_step "$dir/started") fresh=$(first_step "$dir/saved")
[ -n "$resumed" ] && [ "$resumed" = "$started" ] || fail "first step: resumed $resumed, from the export $started"
[ "$fresh" != "$started" ] || fail "the export's first step equals the random initialization's: $fresh"
echo "ok: resumed and started from the export: $started"
