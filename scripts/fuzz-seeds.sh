#!/usr/bin/env bash
# Seeds the corpora of the fuzz targets (tests/fuzz) with llmtrain's own outputs, so that
# mutations start from well-formed files and reach past their headers, and writes each
# target's libFuzzer dictionary (tests/fuzz/dictionaries plus what is read off the outputs:
# the config's keys, the models' tensor names).
#
#   tokenizer_json       a byte-level BPE trained on the fortunes corpus (GPT-2 and cl100k splits)
#   shard_reader         the shards of a tiny dataset (`prepare`: 256-token blocks, train and val)
#   megatron_index       the same dataset's .idx files, each after the 8-byte size of its .bin
#   llmc_reader          the same dataset as llm.c shards
#   jsonl                fortunes entries as JSONL records
#   gzip_input           the records gzipped (one member, and two concatenated)
#   zstd_input           the records as zstd (one frame, two frames, a skippable frame first)
#   parquet              the 40 fortunes entries of the JSONL in every file of tests/parquet's fixture
#                        script: both writers, every codec, page version and encoding read
#   tokenizer_roundtrip  fortunes entries, and the JSONL
#   safetensors          `checkpoint export` of the tiny GPT-2 and Llama of tests/fuzz/models,
#                        each trained 2 steps
#   checkpoint_manifest  those checkpoints' manifest.json
#   checkpoint_rank_file those checkpoints' rank file (HDF5)
#   config               the bundled configs, the tiny models' configs and the effective configs
#                        their runs wrote, each also with "#--set" override lines
#
# usage: fuzz-seeds.sh [OUT_DIR] [LLMTRAIN_BINARY]   (default build-fuzz/seeds, build/llmtrain)
# OUT_DIR/<target>/ holds the seeds, OUT_DIR/<target>.dict the dictionary. Deterministic: the
# same corpus and binary give the same seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build-fuzz/seeds}
llmtrain=${2:-build/llmtrain}
[ -x "$llmtrain" ] || { echo "fuzz-seeds: no llmtrain binary at '$llmtrain' (build it: cmake --build build --target llmtrain)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "fuzz-seeds: python3 is needed (scripts/install-deps.sh)" >&2; exit 1; }
[ -f data/fortunes.txt ] || scripts/make-tiny-corpus.sh
dictionaries=tests/fuzz/dictionaries
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$out"
mkdir -p "$out"

# seed TARGET NAME FILE: FILE becomes seed NAME of TARGET.
seed() {
    mkdir -p "$out/$1"
    cp "$3" "$out/$1/$2"
}
# dictionary TARGET BASE...: the committed dictionaries BASE, then what stdin adds.
dictionary() {
    local target=$1 base
    shift
    for base in "$@"; do cat "$dictionaries/$base.dict"; done >"$out/$target.dict"
    cat >>"$out/$target.dict"
}
quiet() { "$@" >"$work/last.log" 2>&1 || { cat "$work/last.log" >&2; exit 1; }; }

# ---- Text, tokenizers and a tiny dataset in every token format ----
awk 'BEGIN { RS = "\n%\n"; ORS = "\n%\n" } NR <= 40' data/fortunes.txt >"$work/entries.txt"
head -c 200000 data/fortunes.txt >"$work/corpus.txt"
quiet "$llmtrain" tokenizer train --vocab-size 300 --input "$work/corpus.txt" --output "$work/gpt2-split.json"
quiet "$llmtrain" tokenizer train --vocab-size 300 --pattern cl100k --special '<|endoftext|>' '<|pad|>' \
    --input "$work/corpus.txt" --output "$work/cl100k-split.json"
seed tokenizer_json gpt2-split.json "$work/gpt2-split.json"
seed tokenizer_json cl100k-split.json "$work/cl100k-split.json"
dictionary tokenizer_json json tokenizer </dev/null

for format in shards megatron llmc; do
    quiet "$llmtrain" prepare --tokenizer "$work/gpt2-split.json" --input "$work/entries.txt" --separator '\n%\n' --val-fraction 0.2 \
        --unit-mb 0.002 --block-tokens 256 --threads 1 --output-format "$format" --output "$work/$format"
done
for shard in "$work"/shards/*.ltshard; do seed shard_reader "$(basename "$shard")" "$shard"; done
dictionary shard_reader shard </dev/null
for split in train val; do
    python3 - "$work/megatron/$split" "$work/megatron-$split" <<'EOF'
import os, struct, sys
prefix, out = sys.argv[1], sys.argv[2]
with open(out, "wb") as f:
    f.write(struct.pack("<Q", os.path.getsize(prefix + ".bin")))
    f.write(open(prefix + ".idx", "rb").read())
EOF
    seed megatron_index "$split" "$work/megatron-$split"
    seed llmc_reader "$split.bin" "$work/llmc/$split.bin"
done
dictionary megatron_index megatron </dev/null
dictionary llmc_reader llmc </dev/null

# ---- JSONL records (prepare reads them back: they are what it accepts) ----
python3 - "$work/entries.txt" "$work/records" <<'EOF'
import json, sys
entries = [e for e in open(sys.argv[1], encoding="utf-8", errors="replace").read().split("\n%\n") if e]
with open(sys.argv[2] + "-a.jsonl", "w") as f:
    for i, e in enumerate(entries[:15]):
        f.write(json.dumps({"text": e, "id": i}) + "\n")
with open(sys.argv[2] + "-b.jsonl", "w") as f:
    for i, e in enumerate(entries[15:30]):
        f.write(json.dumps({"meta": {"source": "fortunes", "n": [i, i * 0.5, None, True]}, "text": e}, ensure_ascii=False) + "\n")
    f.write(json.dumps({"text": "caf\u00e9 \u65e5\u672c \U0001F642 \"quoted\"\\\t\n"}) + "\n")
    f.write("\n" + json.dumps({"text": ""}) + "\n")
EOF
for part in a b; do
    quiet "$llmtrain" prepare --tokenizer "$work/gpt2-split.json" --input "$work/records-$part.jsonl" --threads 1 --output "$work/jsonl-$part"
    seed jsonl "records-$part.jsonl" "$work/records-$part.jsonl"
    seed tokenizer_roundtrip "records-$part.jsonl" "$work/records-$part.jsonl"
done
dictionary jsonl json <<'EOF'
"\"text\""
"\"text\": "
EOF
# The same records compressed: one member / frame, two concatenated, and zstd with a
# skippable frame first (prepare reads each).
gzip -9 -n -c "$work/records-a.jsonl" >"$work/records-a.jsonl.gz"
{ gzip -1 -n -c "$work/records-a.jsonl"; gzip -n -c "$work/records-b.jsonl"; } >"$work/records-ab.jsonl.gz"
zstd -q -19 -c "$work/records-a.jsonl" >"$work/records-a.jsonl.zst"
{ zstd -q -1 -c "$work/records-a.jsonl"; zstd -q --no-check -c "$work/records-b.jsonl"; } >"$work/records-ab.jsonl.zst"
{ printf '\x50\x2a\x4d\x18\x04\x00\x00\x00skip'; zstd -q -c "$work/records-b.jsonl"; } >"$work/records-skippable.jsonl.zst"
for compressed in "$work"/records-*.jsonl.gz "$work"/records-*.jsonl.zst; do
    quiet "$llmtrain" prepare --tokenizer "$work/gpt2-split.json" --input "$compressed" --threads 1 --output "$work/dataset-$(basename "$compressed")"
    case $compressed in
        *.gz) seed gzip_input "$(basename "$compressed")" "$compressed" ;;
        *) seed zstd_input "$(basename "$compressed")" "$compressed" ;;
    esac
done
dictionary gzip_input json <<'EOF'
"\x1f\x8b\x08\x00"
"\x1f\x8b\x08\x08"
"\x00\x00\x00\x00"
"\xff\xff\xff\xff"
EOF
dictionary zstd_input json <<'EOF'
"\x28\xb5\x2f\xfd"
"\x50\x2a\x4d\x18"
"\x5f\x2a\x4d\x18"
"\x00\x00\x00\x00"
"\xff\xff\xff\xff"
EOF
# Small Parquet files of both writers the tests use (tests/parquet/make_parquet_fixtures.mjs):
# every codec, page version and encoding the reader reads, several row groups and pages.
python3 -c 'import json, sys
print(json.dumps([e for e in open(sys.argv[1], encoding="utf-8", errors="replace").read().split("\n%\n") if e]))' "$work/entries.txt" >"$work/parquet-texts.json"
[ -d node_modules/parquet-wasm ] || { echo "fuzz-seeds: node_modules/parquet-wasm missing; run scripts/install-deps.sh" >&2; exit 1; }
quiet node tests/parquet/make_parquet_fixtures.mjs "$work/parquet" "$work/parquet-texts.json" --small
while read -r file; do seed parquet "$file" "$work/parquet/$file"; done <"$work/parquet/fixtures.txt"
seed parquet nulls.parquet "$work/parquet/nulls.parquet"
seed parquet invalid-utf8.parquet "$work/parquet/invalid-utf8.parquet"
for file in "$work/parquet/unsupported"/*.parquet; do seed parquet "unsupported-$(basename "$file")" "$file"; done
dictionary parquet parquet </dev/null

awk -v dir="$work" 'BEGIN { RS = "\n%\n" } NR <= 8 { f = dir "/entry-" NR ".txt"; printf "%s", $0 > f; close(f) }' "$work/entries.txt"
for entry in "$work"/entry-*.txt; do seed tokenizer_roundtrip "$(basename "$entry")" "$entry"; done
dictionary tokenizer_roundtrip text </dev/null

# ---- Tiny models: a checkpoint each, its export and its effective config ----
for model in gpt2 llama; do
    quiet "$llmtrain" train "tests/fuzz/models/$model.toml" --set "checkpoint.dir=\"$work/$model-checkpoints\"" --run-dir "$work/$model-run"
    quiet "$llmtrain" checkpoint export "$work/$model-checkpoints" "$work/$model-hf"
    seed safetensors "$model.safetensors" "$work/$model-hf/model.safetensors"
    seed config "$model-effective.toml" "$work/$model-run/config.toml"
    seed config "$model.toml" "tests/fuzz/models/$model.toml"
    checkpoint=$work/$model-checkpoints/$(cat "$work/$model-checkpoints/latest")
    seed checkpoint_manifest "$model-manifest.json" "$checkpoint/manifest.json"
    seed checkpoint_rank_file "$model-rank_00000.h5" "$checkpoint/rank_00000.h5"
done
dictionary checkpoint_manifest json checkpoint_manifest </dev/null
# The datasets' paths and tensor names, as `h5ls -r` lists them.
for model in gpt2 llama; do
    checkpoint=$work/$model-checkpoints/$(cat "$work/$model-checkpoints/latest")
    h5ls -r "$checkpoint/rank_00000.h5" | awk '$2 == "Dataset" { n = split($1, part, "/"); print "\"" substr($1, 2) "\""; print "\"" part[n] "\"" }'
done | sort -u | dictionary checkpoint_rank_file hdf5
# The tensor names and dtypes, as the exports' headers give them.
python3 - "$work"/*-hf/model.safetensors <<'EOF' | sort -u | dictionary safetensors json safetensors
import json, struct, sys
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        for name in json.loads(f.read(length)):
            print('"\\"%s\\""' % name)
EOF

# ---- Configs: the bundled ones, each also with overrides ----
for config in configs/*.toml; do
    name=$(basename "$config" .toml)
    seed config "$name.toml" "$config"
    { cat "$config"; printf '#--set train.steps=3\n#--set parallel.tp=2\n#--set model.n_heads=8\n'; } >"$work/$name-set.toml"
    seed config "$name-set.toml" "$work/$name-set.toml"
done
# Every key as `train --dry-run` prints the effective config: "[section]" lines, then "key = value".
"$llmtrain" train configs/tiny.toml --dry-run 2>/dev/null |
    awk '/^\[[a-z_]+\]$/ { section = substr($0, 2, length($0) - 2); print "\"" $0 "\""; next }
         /^[a-z_0-9]+ = / && section != "" { print "\"" $1 "\""; print "\"" section "." $1 "=\"" }' |
    dictionary config toml

echo "fuzz-seeds: $out"
for target_dir in "$out"/*/; do
    target=$(basename "$target_dir")
    printf '  %-20s %3d seeds, %7d bytes, dictionary of %d entries\n' "$target" "$(find "$target_dir" -type f | wc -l)" \
        "$(cat "$target_dir"/* | wc -c)" "$(grep -c '^"' "$out/$target.dict")"
done
