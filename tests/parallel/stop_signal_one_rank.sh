#!/usr/bin/env bash
# stop_signal_one_rank.sh SCRATCH LLMTRAIN MPIEXEC CONFIG [--set ...]: SIGTERM to one rank (not
# rank 0) of a 4-rank run: every rank finishes the step, a checkpoint of that step is written,
# and the job exits with 75 ("resume me"); --resume auto then gives the losses and gradient
# norms of an uninterrupted run, bit for bit.
set -u
scratch=$1 bin=$2 mpiexec=$3
shift 3
rm -rf "$scratch"
mkdir -p "$scratch"
common=("$@" --set train.steps=200 --set checkpoint.every_steps=1000 --set train.sample_tokens=0 --set train.log_every=1000)
launch=("$mpiexec" --oversubscribe -np 4 "$bin")

"${launch[@]}" train "${common[@]}" --set checkpoint.dir=\""$scratch/reference_checkpoints"\" --run-dir "$scratch/reference" >"$scratch/reference.out" 2>&1 ||
    { echo "FAIL: the uninterrupted run failed"; tail -5 "$scratch/reference.out"; exit 1; }

"${launch[@]}" train "${common[@]}" --set checkpoint.dir=\""$scratch/checkpoints"\" --run-dir "$scratch/signalled" >"$scratch/signalled.out" 2>&1 &
job=$!
for _ in $(seq 1200); do
    grep -q '"step":3,' "$scratch/signalled/log.jsonl" 2>/dev/null && break
    sleep 0.05
done
# The ranks' command lines start with the binary (mpirun's with mpirun): the newest is not rank 0.
rank_pid=$(pgrep -n -f -- "^$bin train .*--run-dir $scratch/signalled")
kill -TERM "$rank_pid"
wait "$job"
status=$?
stopped=$(grep -o '"event":"interrupted".*' "$scratch/signalled/log.jsonl")
step=$(echo "$stopped" | sed -E 's/.*"step":([0-9]+).*/\1/')
if [ "$status" -ne 75 ] || [ -z "$stopped" ] || ! echo "$stopped" | grep -q '"signal":"SIGTERM"'; then
    echo "FAIL: exit $status (want 75), closing record: '$stopped'"; tail -5 "$scratch/signalled.out"; exit 1
fi
latest=$(cat "$scratch/checkpoints/latest")
[ "$latest" = "$(printf 'step_%08d' "$step")" ] || { echo "FAIL: latest is $latest, the run stopped after step $step"; exit 1; }
echo "ok: SIGTERM to pid $rank_pid stopped every rank after step $step with exit 75 and checkpoint $latest"

"${launch[@]}" train "${common[@]}" --set checkpoint.dir=\""$scratch/checkpoints"\" --run-dir "$scratch/resumed" --resume auto >"$scratch/resumed.out" 2>&1 ||
    { echo "FAIL: the resumed run failed"; tail -5 "$scratch/resumed.out"; exit 1; }
figures() { grep '"event":"step"' "$1" | sed -E 's/.*"grad_norm":([^,]*).*"loss":([^,]*).*"step":([0-9]+),.*/\3 \2 \1/' | sort -n; }
figures "$scratch/reference/log.jsonl" | awk -v s="$step" '$1 > s' >"$scratch/reference.figures"
figures "$scratch/resumed/log.jsonl" >"$scratch/resumed.figures"
if ! cmp -s "$scratch/reference.figures" "$scratch/resumed.figures"; then
    echo "FAIL: steps after $step differ from the uninterrupted run:"; diff "$scratch/reference.figures" "$scratch/resumed.figures" | head; exit 1
fi
echo "ok: the resumed steps $((step + 1))..200 are bitwise those of the uninterrupted run"
