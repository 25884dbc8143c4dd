#!/usr/bin/env bash
# generate_and_eval.sh SCRATCH LLMTRAIN MPIEXEC CONFIG [--set ...]: a short run saves a
# checkpoint and evaluates at its last step, once as one process and once as tp 2 under
# mpirun. `llmtrain eval` on each checkpoint must give the run's logged val_loss (bit for bit
# for the one-process run, whose layout it shares; to 1e-5 for tp 2). `llmtrain generate`
# must print the same tokens with the KV cache as with full recomputation (--no-kv-cache),
# for GPT-2 and Llama, loading either checkpoint into one process.
set -u
scratch=$1 bin=$2 mpiexec=$3
shift 3
rm -rf "$scratch"
mkdir -p "$scratch"
common=("$@" --set train.steps=20 --set train.eval_every=20 --set checkpoint.every_steps=10 --set train.sample_tokens=0)
fail() { echo "FAIL: $*"; exit 1; }

# train NAME [launcher...] -- [--set ...]
train() {
    local name=$1 launch=()
    shift
    while [ "$1" != -- ]; do launch+=("$1"); shift; done
    shift
    "${launch[@]}" "$bin" train "${common[@]}" "$@" --set checkpoint.dir=\""$scratch/$name/checkpoints"\" --run-dir "$scratch/$name/run" \
        >"$scratch/$name.out" 2>&1 || { tail -5 "$scratch/$name.out"; fail "training $name failed"; }
}
logged_val_loss() { grep '"event":"eval","step":20,' "$1/run/log.jsonl" | sed -E 's/.*"val_loss":([^,}]*).*/\1/'; }
eval_loss() { "$bin" eval "$1" --json | sed -E 's/.*"loss":([^,}]*).*/\1/'; }

train single -- 
train tp2 "$mpiexec" --oversubscribe -np 2 -- --set parallel.tp=2
train llama -- --set model.family=\"llama\" --set model.n_kv_heads=2

logged=$(logged_val_loss "$scratch/single") evaluated=$(eval_loss "$scratch/single/checkpoints")
[ -n "$logged" ] && [ "$logged" = "$evaluated" ] || fail "eval of the one-process checkpoint gives '$evaluated', the run logged '$logged'"
echo "ok: eval = logged val_loss = $logged (one process)"
logged=$(logged_val_loss "$scratch/tp2") evaluated=$(eval_loss "$scratch/tp2/run")
awk -v a="$logged" -v b="$evaluated" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-5 * a) }' ||
    fail "eval of the tp 2 checkpoint gives '$evaluated', the run logged '$logged'"
echo "ok: eval of the tp 2 checkpoint (from its run directory) $evaluated, logged $logged"
"$bin" eval "$scratch/single/checkpoints" | grep -E "loss [0-9.]+ nats/token \| perplexity [0-9.]+ \| bits per byte [0-9.]+$" ||
    fail "eval's text output lacks loss, perplexity or bits per byte"

for name in single tp2 llama; do
    for sampling in "--seed 7" "--seed 8 --top-k 5 --top-p 0.9 --temperature 0.8"; do
        # shellcheck disable=SC2086
        "$bin" generate "$scratch/$name/checkpoints" --prompt "The " --max-tokens 150 $sampling >"$scratch/$name.cached" 2>/dev/null &&
            "$bin" generate "$scratch/$name/checkpoints" --prompt "The " --max-tokens 150 $sampling --no-kv-cache >"$scratch/$name.recomputed" 2>/dev/null ||
            fail "generate failed on $name"
        cmp -s "$scratch/$name.cached" "$scratch/$name.recomputed" || fail "$name ($sampling): the KV cache's tokens differ from full recomputation's"
        [ "$(wc -c <"$scratch/$name.cached")" -gt 150 ] || fail "$name: fewer than 150 tokens printed"
    done
    echo "ok: $name: generate prints the same 150 tokens with and without the KV cache (two samplings)"
done
