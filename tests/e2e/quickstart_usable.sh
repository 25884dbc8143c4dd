#!/usr/bin/env bash
# quickstart_usable.sh SCRATCH LLMTRAIN: the quick start's config (configs/tiny-bpe.toml), cut
# to 3 steps, leaves a checkpoint, and the generate / eval / export lines the run prints at
# its end each work on it as printed (the export a Hugging Face directory with its tokenizer).
set -u
scratch=$1 bin=$2
rm -rf "$scratch"
mkdir -p "$scratch"
fail() { echo "FAIL: $*"; exit 1; }
"$bin" train configs/tiny-bpe.toml --set train.steps=3 --set optimizer.warmup_steps=1 --set train.eval_sequences=16 --set train.sample_tokens=8 \
    --set train.threads=2 --set checkpoint.dir=\""$scratch/checkpoints"\" --run-dir "$scratch/run" >"$scratch/train.out" 2>&1 ||
    fail "the quick start's run failed: $(tail -3 "$scratch/train.out")"
next=$(grep -o 'next: .*' "$scratch/train.out") || fail "the run printed no next commands: $(tail -3 "$scratch/train.out")"
echo "$next"
IFS='|' read -r -a commands <<<"${next#next: }"
[ "${#commands[@]}" -eq 3 ] || fail "expected 3 commands: $next"
for command in "${commands[@]}"; do
    read -r -a words <<<"$command"
    [ "${words[0]}" = llmtrain ] || fail "'$command' is not an llmtrain command"
    "$bin" "${words[@]:1}" >"$scratch/command.out" 2>&1 || fail "'$command' failed: $(tail -3 "$scratch/command.out")"
    echo "ok   $command"
done
for file in model.safetensors config.json tokenizer.json tokenizer_config.json; do [ -s "$scratch/run/hf/$file" ] || fail "the export lacks $file"; done
echo "ok   the export holds $(ls "$scratch/run/hf" | tr '\n' ' ')"
