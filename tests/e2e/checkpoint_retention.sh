#!/usr/bin/env bash
# checkpoint_retention.sh LLMTRAIN SCRATCH CONFIG [--set ...]:
#  - retention: 30 steps saving every 5 with keep_last = 2 and keep_every = 10 keep exactly
#    steps 10, 20 (kept forever), 25 and 30 (the newest two); `latest` names step 30;
#  - --resume latest takes that one; --resume of a checkpoint of another model shape is a
#    config error (exit 2) naming the key, and a changed lr is listed in a warning.
set -u
bin=$1 scratch=$2
shift 2
rm -rf "$scratch"
mkdir -p "$scratch"
config=("$@" --set train.sample_tokens=0 --set train.log_every=1000 --set checkpoint.dir=\""$scratch/checkpoints"\")
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

"$bin" train "${config[@]}" --set train.steps=30 --set checkpoint.every_steps=5 --set checkpoint.keep_last=2 --set checkpoint.keep_every=10 \
    --set checkpoint.async=false --run-dir "$scratch/run" >"$scratch/run.out" 2>&1 || fail "the run failed: $(tail -2 "$scratch/run.out")"
kept=$(cd "$scratch/checkpoints" && ls | tr '\n' ' ')
[ "$kept" = "latest step_00000010 step_00000020 step_00000025 step_00000030 " ] || fail "retention kept '$kept'"
echo "ok   retention kept: $kept"

"$bin" train "${config[@]}" --set train.steps=32 --set optimizer.lr=0.001 --resume latest --run-dir "$scratch/latest" >"$scratch/latest.out" 2>&1 ||
    fail "--resume latest failed: $(tail -2 "$scratch/latest.out")"
grep -q "resumed from '$scratch/checkpoints/step_00000030' at step 30" "$scratch/latest.out" || fail "--resume latest did not take step 30"
grep -q "warning: resuming '.*step_00000030' with a changed config: .*optimizer.lr: 0.002 -> 0.001" "$scratch/latest.out" ||
    fail "the changed lr is not listed: $(grep -i resum "$scratch/latest.out")"
echo "ok   --resume latest: $(grep -o "resumed from [^(]*" "$scratch/latest.out")"

"$bin" train "${config[@]}" --set train.steps=40 --set model.n_layers=3 --resume "$scratch/checkpoints/step_00000030" --run-dir "$scratch/other_shape" \
    >"$scratch/other_shape.out" 2>&1
status=$?
[ "$status" -eq 2 ] && grep -q "^llmtrain: config error: model.n_layers: the checkpoint '.*step_00000030' was saved by a model with model.n_layers = 2, this config has 3" \
    "$scratch/other_shape.out" || fail "another model shape: exit $status, $(cat "$scratch/other_shape.out")"
[ ! -e "$scratch/other_shape" ] || fail "another model shape left a run directory"
echo "ok   another model shape: $(grep '^llmtrain:' "$scratch/other_shape.out")"
[ "$failures" -eq 0 ] || exit 1
