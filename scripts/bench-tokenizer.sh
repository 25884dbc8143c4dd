#!/usr/bin/env bash
# The tokenizer's closing figure: llmtrain against tiktoken (the npm package: Rust compiled
# to WebAssembly, one thread) on the same mixed English text (data/english-mix.txt, built by
# scripts/make-english-corpus.sh), with GPT-2's vocabulary and with cl100k_base, the
# vocabulary and split pattern Llama 3 extends; both are converted from tiktoken's own ranks
# (scripts/tokenizer-bench/tiktoken-to-tokenizer-json.mjs). For each vocabulary the ids of
# the whole text are compared first, then ROUNDS rounds each run llmtrain once and tiktoken
# once, alternated, each timing only its encode of the text already in memory (llmtrain:
# `bench tokenizer --repeat 1`, a fresh piece cache as in prepare). Prints every run and the
# medians. Run it on an otherwise idle machine (the timings are wall-clock).
#
# usage: scripts/bench-tokenizer.sh [LLMTRAIN] [ROUNDS]     (defaults: build/llmtrain, 5)
set -euo pipefail
cd "$(dirname "$0")/.."
llmtrain=${1:-build/llmtrain}
rounds=${2:-5}
work=build/tokenizer-bench
mkdir -p "$work"
[ -f data/english-mix.txt ] || scripts/make-english-corpus.sh
corpus=data/english-mix.txt
[ -d node_modules/tiktoken ] || { echo "bench-tokenizer: node_modules/tiktoken missing; run scripts/install-deps.sh" >&2; exit 1; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "corpus: $corpus, $(wc -c <"$corpus") bytes, $(wc -l <"$corpus") lines; $rounds alternated rounds per vocabulary"
for encoding in gpt2 cl100k_base; do
    tokenizer="$work/$encoding.json"
    [ -f "$tokenizer" ] || node scripts/tokenizer-bench/tiktoken-to-tokenizer-json.mjs "$encoding" "$tokenizer"
    "$llmtrain" bench tokenizer --tokenizer "$tokenizer" --input "$corpus" --repeat 1 --ids-out "$work/$encoding.llmtrain.ids" >/dev/null
    node scripts/tokenizer-bench/tiktoken-encode.mjs "$encoding" "$corpus" "$work/$encoding.tiktoken.ids" >/dev/null
    if cmp -s "$work/$encoding.llmtrain.ids" "$work/$encoding.tiktoken.ids"; then
        ids="identical ($(wc -w <"$work/$encoding.llmtrain.ids") ids)"
    else
        echo "bench-tokenizer: $encoding: the ids differ from tiktoken's" >&2
        exit 1
    fi
    ours=() theirs=()
    for round in $(seq 1 "$rounds"); do
        ours+=("$("$llmtrain" bench tokenizer --tokenizer "$tokenizer" --input "$corpus" --repeat 1 | sed -n 's/^encode: \([0-9.]*\) MB\/s.*/\1/p')")
        theirs+=("$(node scripts/tokenizer-bench/tiktoken-encode.mjs "$encoding" "$corpus" | sed -n 's/.*s, \([0-9.]*\) MB\/s$/\1/p')")
        printf '%-12s round %d: llmtrain %7.2f MB/s   tiktoken %6.2f MB/s\n' "$encoding" "$round" "${ours[-1]}" "${theirs[-1]}"
    done
    ours_median=$(printf '%s\n' "${ours[@]}" | median)
    theirs_median=$(printf '%s\n' "${theirs[@]}" | median)
    printf '%-12s median:  llmtrain %7.2f MB/s   tiktoken %6.2f MB/s   %.1fx; ids %s\n' "$encoding" "$ours_median" "$theirs_median" \
        "$(awk -v a="$ours_median" -v b="$theirs_median" 'BEGIN { print a / b }')" "$ids"
done
