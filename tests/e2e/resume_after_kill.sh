#!/usr/bin/env bash
# resume_after_kill.sh SCRATCH RANKS LLMTRAIN MPIEXEC CONFIG [--set ...]: a run of 200 steps
# saving every 5 is killed with SIGKILL (every rank) at a random step after the first save,
# then run again with --resume auto. Every step after the resume point must have the loss and
# gradient norm of an uninterrupted run, bit for bit, and the final checkpoints' weights and
# AdamW moments must be identical (h5diff, exact). RANKS > 1 runs under MPIEXEC.
set -u
scratch=$1 ranks=$2 bin=$3 mpiexec=$4
shift 4
rm -rf "$scratch"
mkdir -p "$scratch"
launch=("$bin")
[ "$ranks" -gt 1 ] && launch=("$mpiexec" --oversubscribe -np "$ranks" "$bin")
common=("$@" --set train.steps=200 --set checkpoint.every_steps=5 --set checkpoint.keep_last=10 --set train.sample_tokens=0 --set train.log_every=100)

"${launch[@]}" train "${common[@]}" --set checkpoint.dir=\""$scratch/reference_checkpoints"\" --run-dir "$scratch/reference" >"$scratch/reference.out" 2>&1 ||
    { echo "FAIL: the uninterrupted run failed"; tail -5 "$scratch/reference.out"; exit 1; }

kill_at=$((6 + RANDOM % 13))  # a step in [6, 18]: after the first checkpoint, before the last step
"${launch[@]}" train "${common[@]}" --set checkpoint.dir=\""$scratch/checkpoints"\" --run-dir "$scratch/killed" >"$scratch/killed.out" 2>&1 &
# After step kill_at, once a checkpoint is committed (an asynchronous save lags a few steps).
for _ in $(seq 1200); do
    grep -q "\"step\":$kill_at," "$scratch/killed/log.jsonl" 2>/dev/null && [ -e "$scratch/checkpoints/latest" ] && break
    sleep 0.05
done
pkill -KILL -f -- "--run-dir $scratch/killed" 
wait
echo "killed every rank after step $kill_at (log: $(grep -c '"event":"step"' "$scratch/killed/log.jsonl") steps, checkpoints: $(ls "$scratch/checkpoints" | tr '\n' ' '))"

"${launch[@]}" train "${common[@]}" --set checkpoint.dir=\""$scratch/checkpoints"\" --run-dir "$scratch/resumed" --resume auto >"$scratch/resumed.out" 2>&1 ||
    { echo "FAIL: the resumed run failed"; tail -5 "$scratch/resumed.out"; exit 1; }
grep -o "resumed from '[^']*' at step [0-9]*" "$scratch/resumed.out" || { echo "FAIL: the run did not resume"; tail -5 "$scratch/resumed.out"; exit 1; }

# "step":N,...,"loss":X,...,"grad_norm":Y of every step record, as printed (full precision).
figures() { grep '"event":"step"' "$1" | sed -E 's/.*"grad_norm":([^,]*).*"loss":([^,]*).*"step":([0-9]+),.*/\3 \2 \1/' | sort -n; }
figures "$scratch/reference/log.jsonl" >"$scratch/reference.figures"
figures "$scratch/resumed/log.jsonl" >"$scratch/resumed.figures"
resumed_steps=$(wc -l <"$scratch/resumed.figures")
if [ "$resumed_steps" -lt 2 ] || ! grep -Fxf "$scratch/resumed.figures" "$scratch/reference.figures" | cmp -s - "$scratch/resumed.figures"; then
    echo "FAIL: the resumed steps differ from the uninterrupted run's (step loss grad_norm):"
    diff <(grep -F -f <(cut -d' ' -f1 "$scratch/resumed.figures" | sed 's/^/^/; s/$/ /') "$scratch/reference.figures") "$scratch/resumed.figures" | head
    exit 1
fi
for file in "$scratch/reference_checkpoints/step_00000200"/rank_*.h5; do
    other="$scratch/checkpoints/step_00000200/$(basename "$file")"
    h5diff -q "$file" "$other" || { echo "FAIL: the weights or moments of $(basename "$file") differ after the resume"; exit 1; }
done
echo "ok: $resumed_steps steps after the resume are bitwise those of the uninterrupted run; final weights and moments identical"
