#!/usr/bin/env bash
# The throughput of `prepare` on Parquet against the same texts as .jsonl.zst (docs/data.md).
# Builds MB megabytes of documents (default 290, which makes a Parquet file of about 200 MB) (fortunes entries from data/fortunes.txt, 1 to 30 of them
# joined per document in a seeded random order, so documents run from a few hundred bytes to
# a few kilobytes, as web text does), writes them as JSONL compressed by the zstd tool
# (level 3) and as Parquet (scripts/prepare-bench/jsonl-to-parquet.mjs: SNAPPY, 10,000 rows
# per row group), checks that both give the same dataset, then runs
# `prepare` ROUNDS times on each, alternated, with GPT-2's vocabulary (converted from
# tiktoken's ranks) and --threads THREADS, and prints every run's wall time and the text
# MB/s (the documents' UTF-8 bytes over the wall time) and peak resident memory, then the
# medians. Run it on an otherwise idle machine (the timings are wall-clock).
#
# usage: scripts/bench-prepare-parquet.sh [LLMTRAIN] [MB] [ROUNDS] [THREADS]   (defaults: build/llmtrain, 290, 5, the cores)
set -euo pipefail
cd "$(dirname "$0")/.."
llmtrain=${1:-build/llmtrain}
megabytes=${2:-290}
rounds=${3:-5}
threads=${4:-$(nproc)}
work=build/prepare-bench
mkdir -p "$work"
[ -d node_modules/parquet-wasm ] && [ -d node_modules/tiktoken ] || { echo "bench-prepare-parquet: node_modules lacks parquet-wasm or tiktoken; run scripts/install-deps.sh" >&2; exit 1; }
[ -f data/fortunes.txt ] || scripts/make-tiny-corpus.sh >/dev/null
tokenizer=build/tokenizer-bench/gpt2.json
[ -f "$tokenizer" ] || { mkdir -p build/tokenizer-bench && node scripts/tokenizer-bench/tiktoken-to-tokenizer-json.mjs gpt2 "$tokenizer"; }
jsonl=$work/texts-${megabytes}mb.jsonl
if [ ! -f "$jsonl.zst" ] || [ ! -f "$work/texts-${megabytes}mb.parquet" ]; then
    python3 - "$megabytes" "$jsonl" <<'PY'
import json, random, sys
target = int(sys.argv[1]) * 1_000_000
entries = [e for e in open("data/fortunes.txt", encoding="utf-8", errors="replace").read().split("\n%\n") if e.strip()]
rng = random.Random(1)
total = 0
with open(sys.argv[2], "w", encoding="utf-8") as out:
    while total < target:
        text = "\n\n".join(rng.choice(entries) for _ in range(rng.randint(1, 30)))
        out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
        total += len(text.encode("utf-8"))
open(sys.argv[2] + ".text-bytes", "w").write(f"{total}\n")
PY
    node scripts/prepare-bench/jsonl-to-parquet.mjs "$jsonl" "$work/texts-${megabytes}mb.parquet" 10000 SNAPPY
    zstd -q -f -3 "$jsonl" -o "$jsonl.zst"
    rm -f "$jsonl"
    mv "$jsonl.text-bytes" "$work/texts-${megabytes}mb.text-bytes"
fi
parquet=$work/texts-${megabytes}mb.parquet
text_bytes=$(cat "$work/texts-${megabytes}mb.text-bytes")
echo "texts: $text_bytes bytes of UTF-8; $jsonl.zst $(stat -c %s "$jsonl.zst") bytes, $parquet $(stat -c %s "$parquet") bytes; $rounds alternated rounds, --threads $threads"
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# run INPUT OUTPUT: prints the wall seconds; the peak resident memory (MB) goes to $work/last.rss
# where GNU time is installed.
run() {
    local start end timer=()
    [ -x /usr/bin/time ] && timer=(/usr/bin/time -f %M -o "$work/last.rss")
    start=$(date +%s.%N)
    "${timer[@]}" "$llmtrain" prepare --tokenizer "$tokenizer" --input "$1" --threads "$threads" --output "$2" --force >/dev/null
    end=$(date +%s.%N)
    [ -x /usr/bin/time ] && awk '{ printf "%.0f", $1 / 1024 }' "$work/last.rss" >"$work/last.rss.mb" || echo "?" >"$work/last.rss.mb"
    awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f\n", b - a }'
}
rate() { awk -v bytes="$text_bytes" -v s="$1" 'BEGIN { printf "%.2f", bytes / 1e6 / s }'; }
run "$parquet" "$work/out-parquet" >/dev/null
run "$jsonl.zst" "$work/out-jsonl" >/dev/null

python3 - "$work/out-parquet/dataset.json" "$work/out-jsonl/dataset.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for split in ("train", "val"):
    if (a[split]["tokens"], a[split]["documents"]) != (b[split]["tokens"], b[split]["documents"]):
        sys.exit(f"bench-prepare-parquet: {split}: Parquet gave {a[split]['tokens']} tokens in {a[split]['documents']} documents, JSONL {b[split]['tokens']} in {b[split]['documents']}")
print(f"same documents and tokens: {a['train']['documents']} documents, {a['train']['tokens']} tokens")
PY
parquet_times=() jsonl_times=()
for round in $(seq 1 "$rounds"); do
    parquet_times+=("$(run "$parquet" "$work/out-parquet")")
    parquet_rss=$(cat "$work/last.rss.mb")
    jsonl_times+=("$(run "$jsonl.zst" "$work/out-jsonl")")
    jsonl_rss=$(cat "$work/last.rss.mb")
    printf 'round %d: parquet %7.2f s (%s MB/s, peak RSS %s MB)   jsonl.zst %7.2f s (%s MB/s, peak RSS %s MB)\n' "$round" \
        "${parquet_times[-1]}" "$(rate "${parquet_times[-1]}")" "$parquet_rss" "${jsonl_times[-1]}" "$(rate "${jsonl_times[-1]}")" "$jsonl_rss"
done
p=$(printf '%s\n' "${parquet_times[@]}" | median) j=$(printf '%s\n' "${jsonl_times[@]}" | median)
printf 'median: parquet %.2f s (%s MB/s of text), jsonl.zst %.2f s (%s MB/s of text)\n' "$p" "$(rate "$p")" "$j" "$(rate "$j")"
