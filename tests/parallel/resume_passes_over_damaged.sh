#!/usr/bin/env bash
# resume_passes_over_damaged.sh SCRATCH LLMTRAIN MPIEXEC CONFIG [--set ...]: under mpirun each
# rank checks its share of a checkpoint's files; a byte flipped in rank 1's file of the newest
# checkpoint is found by rank 1, which names the file, and every rank resumes from the one before.
set -u
scratch=$1 bin=$2 mpiexec=$3
shift 3
rm -rf "$scratch"
mkdir -p "$scratch"
common=("$@" --set train.sample_tokens=0 --set checkpoint.every_steps=5 --set checkpoint.dir=\""$scratch/checkpoints"\")
launch=("$mpiexec" --oversubscribe -np 2 "$bin")
"${launch[@]}" train "${common[@]}" --set train.steps=10 --run-dir "$scratch/saved" >"$scratch/saved.out" 2>&1 ||
    { echo "FAIL: the first run failed"; tail -3 "$scratch/saved.out"; exit 1; }
file=$scratch/checkpoints/step_00000010/rank_00001.h5
size=$(stat -c %s "$file")
printf '\xff' | dd of="$file" bs=1 seek=$((size / 2)) conv=notrunc status=none
"${launch[@]}" train "${common[@]}" --set train.steps=11 --resume auto --run-dir "$scratch/resumed" >"$scratch/resumed.out" 2>&1 ||
    { echo "FAIL: the resumed run failed"; tail -3 "$scratch/resumed.out"; exit 1; }
grep -q "rank_00001.h5' fails its XXH64 checksum" "$scratch/resumed.out" || { echo "FAIL: no rank named the damaged file:"; cat "$scratch/resumed.out"; exit 1; }
grep -q "resumed from '$scratch/checkpoints/step_00000005' at step 5" "$scratch/resumed.out" || { echo "FAIL: did not resume from step 5:"; cat "$scratch/resumed.out"; exit 1; }
echo "ok: $(grep -o "rank_00001.h5' fails its XXH64 checksum" "$scratch/resumed.out" | head -1); resumed from step 5"
