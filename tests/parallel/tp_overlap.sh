#!/usr/bin/env bash
# tp_overlap.sh SCRATCH LLMTRAIN MPIEXEC CONFIG [--set ...]: under sequence parallelism, a run
# with parallel.tp_overlap = true (the all-gathers and reduce-scatters in pieces behind the
# matmuls) has bitwise the losses, gradient norms and validation losses of the same run without
# it, on GPT-2 tp 2, Llama with grouped-query attention at tp 2 x dp 2, tp 4, and tp 2 x pp 2
# with full recomputation (the layer forward again in backward). The CPU's pieces are whole
# blocks of 64 rows: a micro-batch of 16 x 64 tokens is 2 pieces of 256 rows per rank at tp 2
# and 4 of 64 at tp 4; the validation's (6 sequences) is 2 pieces (64 and 128 rows) at tp 2,
# and at tp 4 (96 rows per rank, not whole blocks) runs unsplit. Resuming the overlapped run's step-3 checkpoint repeats steps
# 4..6 bit for bit.
set -u
scratch=$1 bin=$2 mpiexec=$3
shift 3
rm -rf "$scratch"
mkdir -p "$scratch"
common=("$@" --set train.steps=6 --set train.eval_every=3 --set train.log_every=100 --set train.sample_tokens=4 --set train.batch_size=16
        --set train.seq_len=64 --set train.eval_sequences=6 --set parallel.sequence_parallel=true)
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

layouts=("gpt2_tp2 2 --set parallel.tp=2"
         "llama_gqa_tp2_dp2 4 --set parallel.tp=2 --set model.family=\"llama\" --set model.n_kv_heads=2"
         "gpt2_tp4 4 --set parallel.tp=4"
         "gpt2_tp2_pp2_recompute 4 --set parallel.tp=2 --set parallel.pp=2 --set train.grad_accum=2 --set train.recompute=\"full\"")
for layout in "${layouts[@]}"; do
    set -- $layout
    name=$1 ranks=$2
    shift 2
    run "${name}_plain" "$ranks" "$@"
    run "${name}_overlap" "$ranks" "$@" --set parallel.tp_overlap=true \
        --set checkpoint.every_steps=3 --set checkpoint.dir=\""$scratch/${name}_checkpoints"\"
    grep -q "sequence parallel, its collectives in pieces behind the matmuls" "$scratch/${name}_overlap.out" ||
        { echo "FAIL $name: the start-up line does not say the collectives overlap"; failures=$((failures + 1)); }
    figures "$scratch/${name}_plain" >"$scratch/${name}_plain.figures"
    figures "$scratch/${name}_overlap" >"$scratch/${name}_overlap.figures"
    same "$name overlapped" "$scratch/${name}_plain.figures" "$scratch/${name}_overlap.figures"
    run "${name}_resumed" "$ranks" "$@" --set parallel.tp_overlap=true --resume "$scratch/${name}_checkpoints/step_00000003"
    figures "$scratch/${name}_resumed" | grep -E '^step [4-6] ' >"$scratch/${name}_resumed.figures"
    grep -E '^step [4-6] ' "$scratch/${name}_plain.figures" >"$scratch/${name}_plain_4_6.figures"
    same "$name resumed at step 3, overlapped" "$scratch/${name}_plain_4_6.figures" "$scratch/${name}_resumed.figures"
done
[ "$failures" -eq 0 ] || exit 1
