#!/usr/bin/env bash
# soak-restarts.sh [N]: N trials (default 20) of the supervised-restart test: a random rank
# of a 4-rank run is killed with SIGKILL at a random step, often during a checkpoint save;
# scripts/llmtrain-supervise must restart it and the final weights and AdamW moments must be
# bitwise those of an uninterrupted run. Needs a build in build/ and the tiny corpus
# (scripts/make-tiny-corpus.sh). Prints one line per trial and "passed/N".
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${1:-20}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
[ -x build/llmtrain ] || { echo "soak-restarts: build/llmtrain is missing: build first (cmake --build build)" >&2; exit 2; }
[ -f data/fortunes.txt ] || scripts/make-tiny-corpus.sh
exec tests/parallel/supervised_restart.sh build/soak-restarts "$trials" build/llmtrain mpirun scripts/llmtrain-supervise \
    configs/tiny.toml --set model.n_layers=2 --set model.d_model=32 --set train.batch_size=2 --set train.seq_len=16 \
    --set train.eval_sequences=4 --set train.eval_every=20 --set train.threads=1 --set optimizer.warmup_steps=1
