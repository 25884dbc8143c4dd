#!/usr/bin/env bash
# resume_keeps_global_batch.sh SCRATCH LLMTRAIN MPIEXEC CONFIG [--set ...]: a run of pp 2 x dp 2
# with train.grad_accum = 2 (no train.global_batch_size: 2 x 2 x 2 = 8 sequences per step) is
# resumed on one process with the same config. The resume keeps the 8 sequences (grad_accum 4
# on dp 1) and says so; its steps 4..6 have the losses of an uninterrupted one-process run of
# 8 sequences per step within 1e-5 relative. A deliberate change (train.global_batch_size = 4)
# is applied and warned about; a layout that cannot hold 8 (dp 3 x batch_size 2) is refused
# (exit 2) with the numbers. A global batch given only by --set (train.global_batch_size = 8 on
# pp 2 x dp 2) is kept by a resume on one process whose command leaves it out: steps 4..6 have
# the uninterrupted 4-rank run's losses within 1e-5 relative.
set -u
scratch=$1 bin=$2 mpiexec=$3
shift 3
rm -rf "$scratch"
mkdir -p "$scratch"
common=("$@" --set train.steps=6 --set train.batch_size=2 --set train.sample_tokens=0 --set train.log_every=100)
fail() { echo "FAIL: $*"; exit 1; }
losses() { grep '"event":"step"' "$1/log.jsonl" | sed -E 's/.*"loss":([^,]*).*"step":([0-9]+),.*/\2 \1/' | awk '$1 > 3' | sort -n; }
# expect_same_losses REFERENCE RESUMED: the run directories' steps 4..6, three of them, equal
# within 1e-5 relative.
expect_same_losses() {
    losses "$scratch/$1" >"$scratch/$1.losses"
    losses "$scratch/$2" >"$scratch/$2.losses"
    [ "$(wc -l <"$scratch/$2.losses")" -eq 3 ] && paste "$scratch/$1.losses" "$scratch/$2.losses" |
        awk '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 1e-5 * ($2 < 0 ? -$2 : $2)) exit 1 }' ||
        fail "steps 4..6 ($1 | $2): $(paste "$scratch/$1.losses" "$scratch/$2.losses" | tr '\n' ';')"
}

"$bin" train "${common[@]}" --set train.grad_accum=4 --run-dir "$scratch/reference" >"$scratch/reference.out" 2>&1 ||
    fail "the reference run failed: $(tail -3 "$scratch/reference.out")"
"$mpiexec" --oversubscribe -np 4 "$bin" train "${common[@]}" --set train.grad_accum=2 --set parallel.pp=2 --set checkpoint.every_steps=3 \
    --set checkpoint.dir=\""$scratch/ck"\" --run-dir "$scratch/saved" >"$scratch/saved.out" 2>&1 || fail "the pp 2 x dp 2 run failed: $(tail -3 "$scratch/saved.out")"
grep -q "global batch 8 sequences = batch_size 2 x grad_accum 2 x dp 2" "$scratch/saved.out" || fail "the saved run's batch: $(grep 'global batch' "$scratch/saved.out")"

"$bin" train "${common[@]}" --set train.grad_accum=2 --resume "$scratch/ck/step_00000003" --run-dir "$scratch/resumed" >"$scratch/resumed.out" 2>&1 ||
    fail "the resume on one process failed: $(tail -3 "$scratch/resumed.out")"
grep -q "resume: keeping the checkpoint's global batch of 8 sequences per step: grad_accum 4 on dp 1 (saved on dp 2)" "$scratch/resumed.out" ||
    fail "the resume does not say it keeps the global batch: $(grep -i 'batch' "$scratch/resumed.out")"
grep -q "global batch 8 sequences = batch_size 2 x grad_accum 4 x dp 1" "$scratch/resumed.out" || fail "resumed with $(grep -o 'global batch [0-9]* sequences' "$scratch/resumed.out")"
expect_same_losses reference resumed
echo "ok   resumed on one process with the saved 8 sequences per step; steps 4..6 match: $(tr '\n' ' ' <"$scratch/resumed.losses")"

"$mpiexec" --oversubscribe -np 4 "$bin" train "${common[@]}" --set train.global_batch_size=8 --set parallel.pp=2 --set checkpoint.every_steps=3 \
    --set checkpoint.dir=\""$scratch/ck_set"\" --run-dir "$scratch/saved_set" >"$scratch/saved_set.out" 2>&1 || fail "the --set run failed: $(tail -3 "$scratch/saved_set.out")"
grep -q "global batch 8 sequences = batch_size 2 x grad_accum 2 x dp 2" "$scratch/saved_set.out" || fail "the --set run's batch: $(grep 'global batch' "$scratch/saved_set.out")"
"$bin" train "${common[@]}" --resume "$scratch/ck_set/step_00000003" --run-dir "$scratch/resumed_set" >"$scratch/resumed_set.out" 2>&1 ||
    fail "the resume without the --set failed: $(tail -3 "$scratch/resumed_set.out")"
grep -q "resume: keeping the checkpoint's global batch of 8 sequences per step: grad_accum 4 on dp 1 (saved on dp 2)" "$scratch/resumed_set.out" ||
    fail "the resume without the --set does not keep 8: $(grep -i 'batch' "$scratch/resumed_set.out")"
expect_same_losses saved_set resumed_set
echo "ok   a global batch given by --set is kept when the resume leaves it out; steps 4..6 match the 4-rank run: $(tr '\n' ' ' <"$scratch/resumed_set.losses")"

"$bin" train "${common[@]}" --set train.global_batch_size=4 --resume "$scratch/ck/step_00000003" --run-dir "$scratch/changed" >"$scratch/changed.out" 2>&1 ||
    fail "a deliberate change of the global batch failed: $(tail -3 "$scratch/changed.out")"
grep -q "warning: resuming '.*step_00000003' with another global batch: 8 -> 4 sequences per step" "$scratch/changed.out" &&
    grep -q "global batch 4 sequences" "$scratch/changed.out" || fail "the deliberate change: $(grep -i batch "$scratch/changed.out")"
echo "ok   a deliberate train.global_batch_size = 4 is applied and warned about"

"$bin" train "${common[@]}" --set train.grad_accum=2 --set parallel.dp=3 --resume "$scratch/ck/step_00000003" --dry-run >"$scratch/dp3.out" 2>&1
status=$?
[ "$status" -eq 2 ] && grep -q "global batch of 8 sequences per step, which does not split into micro-batches of train.batch_size = 2 on dp = 3 ranks" "$scratch/dp3.out" ||
    fail "dp 3: exit $status: $(tail -2 "$scratch/dp3.out")"
echo "ok   a layout that cannot hold 8 sequences (dp 3) is refused: exit 2"
