#!/usr/bin/env bash
# Installs what is missing, builds, makes the bundled corpus, trains a BPE tokenizer on it,
# prepares the token shards and trains configs/tiny-bpe.toml into runs/quickstart, then prints
# the generate / eval / export lines that use its checkpoint. Run again, it continues the same
# run (--resume auto): after an interruption it picks up from the last checkpoint, and once
# the run is done it says so and prints those lines again.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)" --target llmtrain
scripts/make-tiny-corpus.sh
scripts/make-tiny-bpe-dataset.sh build/llmtrain
build/llmtrain train configs/tiny-bpe.toml --run-dir runs/quickstart --resume auto "$@"
