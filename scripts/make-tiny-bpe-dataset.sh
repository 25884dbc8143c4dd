#!/usr/bin/env bash
# Builds data/fortunes-bpe/, the dataset of configs/tiny-bpe.toml: a 1024-token byte-level
# BPE trained on the fortunes corpus, then `llmtrain prepare` (entries split at '%' lines,
# 5% of them held out for validation). Deterministic: the same corpus gives the same bytes.
# usage: make-tiny-bpe-dataset.sh [LLMTRAIN_BINARY]   (default build/llmtrain)
set -euo pipefail
cd "$(dirname "$0")/.."
llmtrain=${1:-build/llmtrain}
[ -f data/fortunes.txt ] || scripts/make-tiny-corpus.sh
out=data/fortunes-bpe
tokenizer=data/fortunes-bpe-tokenizer.json
trap 'rm -f "$tokenizer"' EXIT
"$llmtrain" tokenizer train --vocab-size 1024 --input data/fortunes.txt --output "$tokenizer" --force
# prepare writes beside $out and swaps the new dataset in whole: never a half-written one.
"$llmtrain" prepare --tokenizer "$tokenizer" --input data/fortunes.txt --separator '\n%\n' \
  --val-fraction 0.05 --output "$out" --force
echo "make-tiny-bpe-dataset: $out"
