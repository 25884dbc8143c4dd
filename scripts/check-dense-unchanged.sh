#!/usr/bin/env bash
# check-dense-unchanged.sh BEFORE_BINARY AFTER_BINARY [SCRATCH]: runs the same fixed tiny dense
# configs with two builds of llmtrain and demands bitwise equal figures: every step's loss and
# gradient norm and every validation loss of each run's log.jsonl, compared as the text the
# log holds (the shortest text that reads back to the same double: equal text is equal bits).
# For a change meant to leave dense models alone (a refactor, a new kind of layer beside them).
#
# The runs: GPT-2, Llama with grouped-query attention and Qwen2-style Llama (QKV bias), each on
# 1 process and on tp 2 x dp 2 with ZeRO-1; then tp 2 x dp 2 with sequence parallelism and
# selective or full recomputation, tp 2 x pp 2 and cp 2 x dp 2, which take the layer's other
# paths. configs/tiny.toml on the bundled corpus (data/fortunes.txt), 2 layers, 4 steps, a
# validation at steps 2 and 4. Run from the repository root; 4-rank runs go through $MPIEXEC
# (default mpirun) with --oversubscribe. Prints a table; exits 1 on any difference or failed
# run, 2 on bad arguments.
set -u
if [ $# -lt 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
    echo "usage: $0 BEFORE_BINARY AFTER_BINARY [SCRATCH]  (both executable llmtrain builds; run from the repository root)" >&2
    exit 2
fi
before=$1 after=$2
scratch=${3:-$(mktemp -d -t dense-unchanged.XXXXXX)}
mpiexec=${MPIEXEC:-mpirun}
[ -f configs/tiny.toml ] && [ -f data/fortunes.txt ] ||
    { echo "run from the repository root: configs/tiny.toml and data/fortunes.txt are needed (scripts/make-tiny-corpus.sh builds the corpus)" >&2; exit 2; }
mkdir -p "$scratch"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

common=(--set model.n_layers=2 --set model.d_model=64 --set model.n_heads=4 --set train.steps=4 --set train.batch_size=8
        --set train.seq_len=64 --set train.eval_every=2 --set train.eval_sequences=8 --set train.log_every=1
        --set train.sample_tokens=0 --set optimizer.warmup_steps=1)
gpt2=(--set model.family=\"gpt2\")
llama=(--set model.family=\"llama\" --set model.n_kv_heads=2)
qwen2=("${llama[@]}" --set model.qkv_bias=true)
tp2_dp2=(--set parallel.tp=2 --set parallel.zero_stage=1)
# NAME RANKS OVERRIDES...
runs=("gpt2_1_process 1 ${gpt2[*]}"
      "llama_1_process 1 ${llama[*]}"
      "qwen2_1_process 1 ${qwen2[*]}"
      "gpt2_tp2_dp2_zero1 4 ${gpt2[*]} ${tp2_dp2[*]}"
      "llama_tp2_dp2_zero1 4 ${llama[*]} ${tp2_dp2[*]}"
      "qwen2_tp2_dp2_zero1 4 ${qwen2[*]} ${tp2_dp2[*]}"
      "gpt2_tp2_dp2_sp_selective 4 ${gpt2[*]} ${tp2_dp2[*]} --set parallel.sequence_parallel=true --set train.recompute=\"selective\""
      "llama_tp2_dp2_sp_full 4 ${llama[*]} ${tp2_dp2[*]} --set parallel.sequence_parallel=true --set train.recompute=\"full\""
      "qwen2_tp2_pp2 4 ${qwen2[*]} --set parallel.tp=2 --set parallel.pp=2 --set train.grad_accum=2"
      "llama_cp2_dp2 4 ${llama[*]} --set parallel.cp=2")

figures() { python3 "$(dirname "$0")/log-figures.py" "$1"; }

run() {  # BINARY RUN_DIR RANKS OVERRIDES...
    local bin=$1 dir=$2 ranks=$3
    shift 3
    local launch=("$bin")
    [ "$ranks" -gt 1 ] && launch=("$mpiexec" --oversubscribe -np "$ranks" "$bin")
    rm -rf "$dir"
    "${launch[@]}" train configs/tiny.toml "${common[@]}" "$@" --run-dir "$dir" >"$dir.out" 2>&1
}

failures=0
printf '%-28s %5s %-8s %-22s %-22s %s\n' run ranks records "final loss (before)" "final loss (after)" result
for entry in "${runs[@]}"; do
    read -r -a words <<<"$entry"
    name=${words[0]} ranks=${words[1]}
    overrides=("${words[@]:2}")
    result=equal
    for side in before after; do
        bin=$before
        [ "$side" = after ] && bin=$after
        run "$bin" "$scratch/$name.$side" "$ranks" "${overrides[@]}" || result="FAILED ($side: $scratch/$name.$side.out)"
        figures "$scratch/$name.$side" >"$scratch/$name.$side.figures" 2>/dev/null || true
    done
    records=$(wc -l <"$scratch/$name.before.figures")
    loss() { grep '^step' "$1" | tail -1 | cut -d' ' -f3; }
    if [ "$result" = equal ]; then
        if [ "$records" -eq 0 ]; then result="FAILED (no records)"
        elif ! cmp -s "$scratch/$name.before.figures" "$scratch/$name.after.figures"; then result="DIFFERENT (diff $scratch/$name.{before,after}.figures)"; fi
    fi
    [ "$result" = equal ] || failures=$((failures + 1))
    printf '%-28s %5s %-8s %-22s %-22s %s\n' "$name" "$ranks" "$records" "$(loss "$scratch/$name.before.figures")" \
        "$(loss "$scratch/$name.after.figures")" "$result"
done
echo "before: $before ($("$before" --version 2>/dev/null | head -1))"
echo "after:  $after ($("$after" --version 2>/dev/null | head -1))"
if [ "$failures" -gt 0 ]; then
    echo "FAIL: $failures of ${#runs[@]} runs differ or failed (records: step loss and gradient norm, validation loss; scratch $scratch)"
    exit 1
fi
echo "ok: all ${#runs[@]} runs have bitwise equal losses, gradient norms and validation losses"
