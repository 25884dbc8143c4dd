#!/usr/bin/env bash
# Installs what is missing, builds (Release, incremental in build/), and runs every test
# through CTest. Labels: unit, ops, mpi (parallel layouts under mpirun), e2e, gpu (skipped
# without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"
