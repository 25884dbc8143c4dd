#!/usr/bin/env bash
# `llmtrain prepare` on 1 process (no launcher), then under mpirun with 2 and 4 ranks (and
# 1 thread each), must write byte-identical dataset directories. Then replacing a dataset
# under mpirun: refused without --force; an error on rank 1 leaves the old dataset as it was
# and nothing beside it; with --force the new dataset replaces it whole.
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

leftovers() { ls -A "$work" | grep -E '\.llmtrain-' || true; }
if "$mpiexec" -np 2 --oversubscribe "$llmtrain" "${args[@]}" --threads 1 --output "$work/np2" 2>"$work/stderr"; then echo "expected a refusal"; exit 1; fi
grep -q "output directory '$work/np2' is not empty" "$work/stderr" || { cat "$work/stderr"; exit 1; }
# 25 lines of about 50 bytes per 1,000-byte unit: line 30 lies in unit 1, rank 1's.
for i in $(seq 1 60); do
  if [ "$i" -eq 30 ]; then echo "not json"; else echo "{\"text\": \"document $i of a JSONL corpus\"}"; fi
done >"$work/bad.jsonl"
if "$mpiexec" -np 2 --oversubscribe "$llmtrain" prepare --tokenizer "$work/tokenizer.json" --input "$work/bad.jsonl" --unit-mb 0.001 --threads 1 \
    --force --output "$work/np2" 2>"$work/stderr"; then echo "expected an error on rank 1"; exit 1; fi
grep -Eq "rank 1: data error: .*bad.jsonl:30: line is not JSON" "$work/stderr" || { cat "$work/stderr"; exit 1; }
diff -r "$work/np1" "$work/np2"
[ -z "$(leftovers)" ] || { echo "left behind: $(leftovers)"; exit 1; }
"$llmtrain" "${args[@]}" --seed 99 --threads 2 --output "$work/seed99"
"$mpiexec" -np 4 --oversubscribe "$llmtrain" "${args[@]}" --seed 99 --threads 1 --force --output "$work/np2"
diff -r "$work/seed99" "$work/np2"
[ -z "$(leftovers)" ] || { echo "left behind: $(leftovers)"; exit 1; }
echo "prepare_ranks: under mpirun a dataset is refused without --force, kept on an error, replaced whole with --force"
