#!/usr/bin/env bash
# tp_overlap.sh SCRATCH LLMTRAIN MPIEXEC CONFIG [--set ...]: under sequence parallelism, a run
# with parallel.tp_overlap = true (the all-gathers and reduce-scatters in pieces behind the
# matmuls) has bitwise the losses, gradient norms and validation losses of the same run without
# it, on GPT-2 tp 2 (one and two threads per rank), Llama with grouped-query attention at
# tp 2 x dp 2, tp 4, and tp 2 x pp 2
# with full recomputation (the layer forward again in backward). Each rank's rows go in tp
# pieces: a micro-batch of 16 x 64 tokens is 2 pieces of 256 rows per rank at tp 2 and 4 of
# 64 at tp 4; the validation's (6 sequences) 2 of 96 and 4 of 24. Resuming the overlapped
# run's step-3 checkpoint repeats steps 4..6 bit for bit.
source "$(dirname "$0")/bitwise_option_common.sh"
common=(--set train.steps=6 --set train.eval_every=3 --set train.log_every=100 --set train.sample_tokens=4 --set train.batch_size=16
        --set train.seq_len=64 --set train.eval_sequences=6 --set parallel.sequence_parallel=true)

layouts=("gpt2_tp2 2 --set parallel.tp=2"
         "llama_gqa_tp2_dp2 4 --set parallel.tp=2 --set model.family=\"llama\" --set model.n_kv_heads=2"
         "gpt2_tp4 4 --set parallel.tp=4"
         "gpt2_tp2_two_threads 2 --set parallel.tp=2 --set train.threads=2"
         "gpt2_tp2_pp2_recompute 4 --set parallel.tp=2 --set parallel.pp=2 --set train.grad_accum=2 --set train.recompute=\"full\"")
for layout in "${layouts[@]}"; do
    set -- $layout  # NAME RANKS --set ...
    expect_option_is_bitwise "$1" "$2" parallel.tp_overlap=true "sequence parallel, its collectives in pieces behind the matmuls" "${@:3}"
done
[ "$failures" -eq 0 ] || exit 1
