#!/usr/bin/env bash
# Parquet input of `prepare`, on 1 process and under mpirun: each fixture file (two writers;
# data pages v1 and v2; UNCOMPRESSED, SNAPPY, GZIP, ZSTD; plain, dictionary, delta encodings;
# required and optional text; see tests/parquet/make_parquet_fixtures.mjs) gives the dataset
# bytes of the same documents as JSONL; --text-column picks another column and a missing one
# is named with the file's columns; `tokenizer train` reads the documents too; Parquet and
# JSONL files mixed in one run give the dataset of their documents in input order; with small
# units (row groups, and the data pages of a large one, as the pieces) the dataset is the same
# on 1 and 2 threads and 4 ranks;
# null texts and texts that are not UTF-8 abort naming row group and row, or are skipped,
# counted and listed as JSONL's bad records are; hostile and
# unsupported files (tests/parquet/break_parquet.py) are refused in one line naming the file
# and the part, writing nothing.
# usage: prepare_parquet.sh LLMTRAIN MPIEXEC CORPUS WORK_DIR
set -euo pipefail
llmtrain=$1 mpiexec=$2 corpus=$3 work=$4
repo=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
fail() { echo "prepare_parquet: $*" >&2; exit 1; }
for tool in node zstd python3; do
    command -v "$tool" >/dev/null || fail "$tool is missing: run scripts/install-deps.sh"
done
for package in parquet-wasm hyparquet-writer hyparquet apache-arrow; do
    [ -d "$repo/node_modules/$package" ] || fail "$repo/node_modules/$package is missing: run scripts/install-deps.sh (it installs package.json's npm packages, which write the Parquet fixtures)"
done
"$llmtrain" tokenizer train --vocab-size 800 --input "$corpus" --output "$work/tokenizer.json" >/dev/null

# The documents: the fortunes of the corpus's first 400 KB, then a few more to try UTF-8,
# an empty text and control characters (NUL, tab, newline, U+2028) inside one.
head -c 400000 "$corpus" >"$work/corpus.txt"
python3 -c 'import json, sys
docs = [doc for doc in open(sys.argv[1], encoding="utf-8", errors="replace").read().split("\n%\n") if doc]
docs += ["Café crème, naïve façade, déjà vu: ça coûte 3,50 €. Ærøskøbing, Łódź, Ἀθῆναι, Москва.",
         "日本語の文章です。東京は晴れ。中文：你好，世界！한국어도 있습니다.",
         "Emoji: 🎉🚀👩‍💻 and flags 🇫🇷🇯🇵, math ∑∫√∞ ≠ ≈.",
         "",
         "Zeilen\nmit \"Anführungszeichen\",\ttabs, NUL\u0000inside and a line\u2028separator: Ünïcödé ß ẞ."]
json.dump(docs, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
json.dump(docs[::-1], open(sys.argv[3], "w", encoding="utf-8"), ensure_ascii=False)' \
    "$work/corpus.txt" "$work/texts.json" "$work/texts-reversed.json"
fx=$work/fixtures fxr=$work/fixtures-reversed
node "$repo/tests/parquet/make_parquet_fixtures.mjs" "$fx" "$work/texts.json" >"$work/fixtures.log" || { cat "$work/fixtures.log"; fail "the fixtures could not be made"; }
node "$repo/tests/parquet/make_parquet_fixtures.mjs" "$fxr" "$work/texts-reversed.json" >"$work/fixtures-reversed.log" || { cat "$work/fixtures-reversed.log"; fail "the fixtures could not be made"; }
python3 "$repo/tests/parquet/break_parquet.py" "$fx" "$work/hostile" >"$work/hostile.log" || { cat "$work/hostile.log"; fail "the hostile files could not be made"; }
mapfile -t fixtures <"$fx/fixtures.txt"
[ "${#fixtures[@]}" -ge 20 ] || fail "fixtures.txt lists ${#fixtures[@]} files"

common=(--tokenizer "$work/tokenizer.json" --val-fraction 0.1)
prepare() { "$llmtrain" prepare "${common[@]}" --threads 2 "$@" >/dev/null; }
prepare_np() { local np=$1; shift; "$mpiexec" -np "$np" --oversubscribe "$llmtrain" prepare "${common[@]}" --threads 1 "$@" >/dev/null; }
prepare --input "$fx/texts.jsonl" --output "$work/jsonl"
for f in "${fixtures[@]}"; do
    prepare --input "$fx/$f" --output "$work/np1/$f"
    diff -r "$work/jsonl" "$work/np1/$f" || fail "$f on 1 process: the dataset differs from the JSONL's"
done
for f in wasm-v1-snappy-plain_dictionary.parquet wasm-v2-zstd-delta_length_byte_array.parquet hyp-v2-gzip-dict.parquet; do
    prepare_np 2 --input "$fx/$f" --output "$work/np2/$f"
    diff -r "$work/jsonl" "$work/np2/$f" || fail "$f on 2 ranks: the dataset differs from the JSONL's"
done
echo "prepare_parquet: ${#fixtures[@]} Parquet files (2 writers, pages v1/v2, 4 codecs, plain/dictionary/delta) give the JSONL's dataset on 1 process and 2 ranks"

# refused INPUT SUBSTRING...: `prepare --input INPUT` exits 2 with one line on stderr, which
# starts "llmtrain: " and holds INPUT and each SUBSTRING, and writes nothing.
mkdir -p "$work/refused"
refused() {
    local input=$1 status=0
    shift
    "$llmtrain" prepare "${common[@]}" --threads 2 --input "$input" --output "$work/refused/out" >/dev/null 2>"$work/stderr" || status=$?
    [ "$status" -eq 2 ] || { cat "$work/stderr" >&2; fail "$input: exit $status, expected 2"; }
    [ "$(wc -l <"$work/stderr")" -eq 1 ] || { cat "$work/stderr" >&2; fail "$input: expected one line on stderr"; }
    grep -q '^llmtrain: ' "$work/stderr" || { cat "$work/stderr" >&2; fail "$input: the line does not start with 'llmtrain: '"; }
    for part in "$input" "$@"; do
        grep -qF -- "$part" "$work/stderr" || { cat "$work/stderr" >&2; fail "$input: the error does not say '$part'"; }
    done
    [ -z "$(ls -A "$work/refused")" ] || fail "$input: the refused run left $(ls -A "$work/refused")"
}

prepare --input "$fx/body-column.parquet" --text-column body --output "$work/body"
diff -r "$work/jsonl" "$work/body" || fail "--text-column body: the dataset differs from the JSONL's"
refused "$fx/body-column.parquet" 'no column "text"' 'id, body'
echo "prepare_parquet: --text-column body reads the column; a missing text column is named with the file's columns"

# tokenizer train reads a Parquet file's documents as it reads the JSONL's.
for input in texts.jsonl wasm-v1-zstd-dict_fallback_plain.parquet hyp-v2-gzip-dict.parquet body-column.parquet; do
    case $input in body-*) args=(--text-column body) ;; *) args=() ;; esac
    "$llmtrain" tokenizer train --vocab-size 600 --input "$fx/$input" "${args[@]}" --output "$work/tok-$input.json" >/dev/null
    cmp "$work/tok-texts.jsonl.json" "$work/tok-$input.json" || fail "tokenizer train: $input differs from texts.jsonl"
done
echo "prepare_parquet: tokenizer train reads Parquet documents as it reads JSONL's"

# Parquet and JSONL files of the documents and of the documents reversed, in one run.
mixed=("$fx/wasm-v2-zstd-plain.parquet" "$fxr/texts.jsonl" "$fxr/hyp-v2-snappy-dict.parquet" "$fx/texts.jsonl"
       "$fx/hyp-v2-gzip-delta_length_byte_array.parquet" "$fxr/wasm-v1-gzip-delta_length_byte_array.parquet")
cat "$fx/texts.jsonl" "$fxr/texts.jsonl" "$fxr/texts.jsonl" "$fx/texts.jsonl" "$fx/texts.jsonl" "$fxr/texts.jsonl" >"$work/mixed.jsonl"
inputs=()
for f in "${mixed[@]}"; do inputs+=(--input "$f"); done
prepare --input "$work/mixed.jsonl" --output "$work/mixed-jsonl"
prepare "${inputs[@]}" --output "$work/mixed"
diff -r "$work/mixed-jsonl" "$work/mixed" || fail "Parquet and JSONL inputs in one run: the dataset differs from their concatenated JSONL's"
echo "prepare_parquet: Parquet and JSONL inputs mixed in one run give the dataset of their documents in input order"

# Units of 50 KB: the row groups (60-90 KB of text each in the first two files; about 200 KB
# of 19-20 pages in the third, which is cut at its data pages) are the units' pieces.
for f in wasm-v2-zstd-plain.parquet hyp-v2-snappy-delta_byte_array.parquet wasm-v1-zstd-dict_fallback_plain.parquet; do
    "$llmtrain" prepare "${common[@]}" --unit-mb 0.05 --threads 1 --input "$fx/$f" --output "$work/units/$f.t1" >/dev/null
    "$llmtrain" prepare "${common[@]}" --unit-mb 0.05 --threads 2 --input "$fx/$f" --output "$work/units/$f.t2" >/dev/null
    prepare_np 4 --unit-mb 0.05 --input "$fx/$f" --output "$work/units/$f.np4"
    shards=("$work/units/$f.t1"/train-*.ltshard)
    [ "${#shards[@]}" -ge 4 ] || fail "$f with --unit-mb 0.05: ${#shards[@]} train shard(s), expected several"
    diff -r "$work/units/$f.t1" "$work/units/$f.t2" || fail "$f with --unit-mb 0.05: 2 threads differ from 1"
    diff -r "$work/units/$f.t1" "$work/units/$f.np4" || fail "$f with --unit-mb 0.05: 4 ranks differ from 1 process"
    python3 -c 'import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
total = lambda d, k: d["train"][k] + d["val"][k]
assert (total(a, "tokens"), total(a, "documents")) == (total(b, "tokens"), total(b, "documents")), (a, b)' \
        "$work/units/$f.t1/dataset.json" "$work/jsonl/dataset.json" || fail "$f with --unit-mb 0.05: not the JSONL's documents and tokens"
done
echo "prepare_parquet: with row groups (and pages of a large one) as the units' pieces, 1 thread, 2 threads and 4 ranks write the same shards, of the JSONL's documents and tokens"

# Null texts at rows 7 and 21: row 7 of row group 0 and row 5 of row group 1.
refused "$fx/nulls.parquet" "row group 0, row 7" "null"
prepare --input "$fx/nulls.parquet" --on-bad-record skip --output "$work/nulls-skip" 2>"$work/stderr"
prepare --input "$fx/nulls.jsonl" --on-bad-record skip --output "$work/nulls-jsonl-skip" 2>"$work/stderr"
diff -r -x skipped-records.jsonl "$work/nulls-jsonl-skip" "$work/nulls-skip" || fail "nulls.parquet skipped: the dataset differs from nulls.jsonl's"
for shard in "$work/jsonl"/*.ltshard; do
    cmp "$shard" "$work/nulls-skip/$(basename "$shard")" || fail "skipping the nulls changed the tokens of $(basename "$shard")"
done
grep -q '"skipped_records": 2' "$work/nulls-skip/dataset.json" || fail "the manifest does not count 2 skipped records"
python3 -c 'import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
assert len(records) == 2 and all({"file", "row_group", "row", "reason"} <= set(r) for r in records), records
assert all(r["file"].endswith("nulls.parquet") for r in records), records
assert [(r["row_group"], r["row"]) for r in records] == [(0, 7), (1, 5)], records' "$work/nulls-skip/skipped-records.jsonl" \
    || { cat "$work/nulls-skip/skipped-records.jsonl"; fail "skipped rows listed wrongly"; }
# Text that is not UTF-8 at row 3 of row group 0: a bad record, as the same bytes are in JSONL.
refused "$fx/invalid-utf8.parquet" "row group 0, row 3" "not valid UTF-8"
prepare --input "$fx/invalid-utf8.parquet" --on-bad-record skip --output "$work/utf8-skip" 2>"$work/stderr"
prepare --input "$fx/invalid-utf8.jsonl" --on-bad-record skip --output "$work/utf8-jsonl-skip" 2>"$work/stderr"
diff -r -x skipped-records.jsonl "$work/utf8-jsonl-skip" "$work/utf8-skip" || fail "invalid-utf8.parquet skipped: the dataset differs from invalid-utf8.jsonl's"
grep -q '"skipped_records": 1' "$work/utf8-skip/dataset.json" || fail "the manifest does not count 1 skipped record"
grep -q '"row_group":0,"row":3,"reason":"text is not valid UTF-8' "$work/utf8-skip/skipped-records.jsonl" || { cat "$work/utf8-skip/skipped-records.jsonl"; fail "the invalid row is listed wrongly"; }
echo "prepare_parquet: null texts and texts that are not UTF-8 abort naming row group and row, or are skipped, counted and listed"

# Each broken in one way (see break_parquet.py), and the refused codecs and nesting.
for case in "truncated-footer.parquet|footer" "footer-length-past-start.parquet|footer" "wrong-magic-head.parquet|magic" \
        "wrong-magic-tail.parquet|magic" "page-past-chunk.parquet|page" "dictionary-index-out-of-range.parquet|dictionary" \
        "definition-level-past-max.parquet|definition level" "decompressed-size-lies.parquet|decompressed" \
        "decompressed-size-lies-gzip.parquet|decompressed"; do
    refused "$work/hostile/${case%%|*}" "${case#*|}"
done
hostile=("$work/hostile"/*)
[ "${#hostile[@]}" -eq 9 ] || fail "break_parquet.py wrote ${#hostile[@]} files; this test tries 9"
for case in "lz4_raw.parquet|LZ4" "lz4.parquet|LZ4" "brotli.parquet|BROTLI" "nested-list.parquet|nested" "nested-struct.parquet|nested"; do
    refused "$fx/unsupported/${case%%|*}" "${case#*|}"
done
echo "prepare_parquet: hostile files, LZ4 and BROTLI pages and a nested text column are refused in one line naming the file and the part, writing nothing"
