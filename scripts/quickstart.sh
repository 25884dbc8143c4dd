#!/usr/bin/env bash
# Installs what is missing, builds, makes the bundled corpus and trains configs/tiny.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)" --target llmtrain
scripts/make-tiny-corpus.sh
build/llmtrain train configs/tiny.toml "$@"
