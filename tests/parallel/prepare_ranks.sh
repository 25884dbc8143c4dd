#!/usr/bin/env bash
# `llmtrain prepare` on 1 process (no launcher), then under mpirun with 2 and 4 ranks (and
# 1 thread each), must write byte-identical dataset directories.
# usage: prepare_ranks.sh LLMTRAIN MPIEXEC CORPUS WORK_DIR
set -euo pipefail
llmtrain=$1 mpiexec=$2 corpus=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
"$llmtrain" tokenizer train --vocab-size 1000 --input "$corpus" --output "$work/tokenizer.json"
args=(prepare --tokenizer "$work/tokenizer.json" --input "$corpus" --separator '\n%\n' --val-fraction 0.1 --unit-mb 0.3 --block-tokens 4096)
"$llmtrain" "${args[@]}" --threads 2 --output "$work/np1"
for np in 2 4; do
  "$mpiexec" -np "$np" --oversubscribe "$llmtrain" "${args[@]}" --threads 1 --output "$work/np$np"
done
ls "$work/np1" | grep -q '^train-00000.ltshard$'
[ "$(ls "$work/np1" | grep -c ltshard)" -ge 4 ] || { echo "expected several shards"; exit 1; }
diff -r "$work/np1" "$work/np2"
diff -r "$work/np1" "$work/np4"
echo "prepare_ranks: 1, 2 and 4 ranks wrote identical datasets"
