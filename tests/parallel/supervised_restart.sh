#!/usr/bin/env bash
# supervised_restart.sh SCRATCH TRIALS LLMTRAIN MPIEXEC SUPERVISE CONFIG [--set ...]: a 4-rank
# run under scripts/llmtrain-supervise, TRIALS times. In each trial one random rank is killed
# with SIGKILL at a random step, often while a checkpoint is being written (the writer is
# slowed down); the supervisor must restart the job from its latest checkpoint and the final
# checkpoint's weights and AdamW moments must equal an uninterrupted run's, bit for bit
# (h5diff, exact). Prints one line per trial and "passed/TRIALS"; exits 1 if any failed.
set -u
scratch=$1 trials=$2 bin=$3 mpiexec=$4 supervise=$5
shift 5
readonly ranks=4 steps=60
rm -rf "$scratch"
mkdir -p "$scratch"
launch=("$mpiexec" --oversubscribe -np "$ranks" "$bin")
common=("$@" --set train.steps=$steps --set checkpoint.every_steps=5 --set checkpoint.keep_last=3 --set train.sample_tokens=0 --set train.log_every=100)
final=$(printf 'step_%08d' $steps)

"${launch[@]}" train "${common[@]}" --set checkpoint.dir=\""$scratch/reference_checkpoints"\" --run-dir "$scratch/reference" >"$scratch/reference.out" 2>&1 ||
    { echo "FAIL: the uninterrupted run failed"; tail -5 "$scratch/reference.out"; exit 1; }

# The pid of world rank $2 among the processes of run directory $1, once it is running.
rank_pid() {
    local pid
    for pid in $(pgrep -f -- "--run-dir $1( |$)"); do
        tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$pid"; return; }
    done
}

# Trial $1: kills a random rank of the first attempt after a random step; returns 0 if the
# supervised job ends with the reference's final weights.
trial() {
    local dir=$scratch/trial_$1 kill_at=$((6 + RANDOM % (steps - 12))) victim=$((RANDOM % ranks)) pid="" saving=no
    mkdir -p "$dir"
    LLMTRAIN_CHECKPOINT_WRITE_DELAY_MS=20 "$supervise" --backoff 1 --max-restarts 3 -- "${launch[@]}" train "${common[@]}" \
        --set checkpoint.dir=\""$dir/checkpoints"\" --run-dir "$dir/attempt-{attempt}" >"$dir/supervise.out" 2>&1 &
    local supervisor=$!
    for _ in $(seq 1200); do
        grep -q "\"step\":$kill_at," "$dir/attempt-0/log.jsonl" 2>/dev/null && pid=$(rank_pid "$dir/attempt-0" "$victim") && [ -n "$pid" ] && break
        sleep 0.05
    done
    sleep "0.$((RANDOM % 10))"
    compgen -G "$dir/checkpoints/step_*.tmp" >/dev/null && saving=yes
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || { echo "trial $1: FAIL: rank $victim was gone before step $kill_at"; wait $supervisor; return 1; }
    wait $supervisor
    local code=$? attempts
    attempts=$(grep -c "attempt [0-9]*:" "$dir/supervise.out")
    local what="trial $1: rank $victim killed after step $kill_at (save in progress: $saving), $attempts attempt(s), supervisor exit $code"
    if [ $code -ne 0 ] || [ "$attempts" -lt 2 ]; then
        echo "$what: FAIL: expected a restart and exit 0"; tail -5 "$dir/supervise.out"; return 1
    fi
    for file in "$scratch/reference_checkpoints/$final"/rank_*.h5; do
        h5diff -q "$file" "$dir/checkpoints/$final/$(basename "$file")" ||
            { echo "$what: FAIL: $(basename "$file") differs from the uninterrupted run's"; return 1; }
    done
    echo "$what: final weights and moments bitwise equal"
}

passed=0
for t in $(seq "$trials"); do trial "$t" && passed=$((passed + 1)); done
echo "$passed/$trials trials passed"
[ "$passed" -eq "$trials" ]
