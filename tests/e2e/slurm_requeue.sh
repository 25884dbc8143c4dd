#!/usr/bin/env bash
# slurm_requeue.sh SCRATCH LLMTRAIN MPIEXEC CONFIG [--set ...]: a real single-node Slurm
# (munged, slurmctld and slurmd on 127.0.0.1, as the current user, with their own
# slurm.conf, munge key, state and spool directories and free ports) runs
# scripts/slurm/llmtrain.sbatch with 2 tasks (srun --mpi=pmix). Once the job has passed a
# few steps it is sent `scancel --signal=USR1 --batch`, as --signal=B:USR1@120 would before
# a time limit: every rank must save a checkpoint and exit 75, the script must requeue the
# job, and the requeued run must resume and complete, every step of both runs with the loss
# and gradient norm of an uninterrupted 2-rank run (mpirun), bit for bit. The daemons are
# stopped on any exit. Where they cannot start here (no permission, no munge, ...) the test
# exits 77 (skipped) with the daemon's own words.
set -u
scratch=$1 bin=$2 mpiexec=$3
shift 3
config=$1
shift
source_dir=$PWD
export PATH=$PATH:/usr/sbin:/sbin
unset "${!SLURM_@}" "${!SBATCH_@}"  # a test run inside a Slurm job talks to its own cluster only

skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
# shellcheck source=tests/e2e/slurm_test_cluster.sh
. "$(dirname "$0")/slurm_test_cluster.sh"
start_slurm_cluster sbatch

# Steps of about 3 ms: a run of 4000 is long enough to be caught part way.
run=("$config" "$@" --set train.steps=4000 --set checkpoint.every_steps=50 --set train.sample_tokens=0 --set train.log_every=500
     --set checkpoint.dir=\""$scratch/checkpoints"\")

"$mpiexec" --oversubscribe -np 2 "$bin" train "$config" "$@" --set train.steps=4000 --set checkpoint.every_steps=50 --set train.sample_tokens=0 \
    --set train.log_every=500 --set checkpoint.dir=\""$scratch/reference_checkpoints"\" --run-dir "$scratch/reference" >"$scratch/reference.out" 2>&1 ||
    { tail -n 5 "$scratch/reference.out"; fail "the uninterrupted run failed"; }

# The job: the submit directory is the source tree (configs/, data/, scripts/).
export LLMTRAIN_CONFIG=$config LLMTRAIN_BIN=$bin LLMTRAIN_SCRIPTS=$source_dir/scripts LLMTRAIN_RUN_DIR="$scratch/job.{restart}.{attempt}"
export LLMTRAIN_ARGS="${run[*]:1}"
job=$(sbatch --parsable --ntasks=2 --output="$scratch/job.out" --chdir="$source_dir" "$source_dir/scripts/slurm/llmtrain.sbatch") ||
    fail "sbatch refused the script"
echo "submitted job $job"

# Signal the batch script once the first run has passed step 10.
for _ in $(seq 600); do
    grep -q '"step":10,' "$scratch/job.0.0/log.jsonl" 2>/dev/null && break
    sleep 0.05
done
grep -q '"step":10,' "$scratch/job.0.0/log.jsonl" 2>/dev/null || { cat "$scratch/job.out"; fail "the job did not reach step 10 in 30 s"; }
scancel --signal=USR1 --batch "$job" || fail "scancel --signal=USR1 --batch $job failed"
echo "sent SIGUSR1 to the batch script after step 10"

for _ in $(seq 450); do
    state_now=$(scontrol show job "$job" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    case $state_now in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) break ;; esac
    sleep 0.2
done
scontrol show job "$job" | grep -oE "JobState=[A-Z_]+|Restarts=[0-9]+|ExitCode=[0-9:]+" | paste -sd' ' -
cat "$scratch/job.out"
[ "$state_now" = COMPLETED ] || fail "job $job ended $state_now, not COMPLETED"
scontrol show job "$job" | grep -q "Restarts=1 " || fail "job $job was not requeued exactly once"
grep -q "llmtrain.sbatch: exit 75 (resume me): requeueing job $job" "$scratch/job.out" || fail "the first run did not exit 75 and requeue"
stopped_at=$(sed -n "s/.*stopped by SIGUSR1 after step \([0-9]*\).*/\1/p" "$scratch/job.out" | head -n 1)
[ -n "$stopped_at" ] || fail "no rank reported \"stopped by SIGUSR1 after step N\""
grep -o "resumed from '[^']*' at step [0-9]*" "$scratch/job.out" || fail "the requeued run did not resume from a checkpoint"

# "step loss grad_norm" of every step record, as printed (full precision).
figures() { cat "$@" | grep '"event":"step"' | sed -E 's/.*"grad_norm":([^,]*).*"loss":([^,]*).*"step":([0-9]+),.*/\3 \2 \1/' | sort -n; }
figures "$scratch/reference/log.jsonl" >"$scratch/reference.figures"
figures "$scratch"/job.0.*/log.jsonl >"$scratch/first.figures"
figures "$scratch"/job.1.*/log.jsonl >"$scratch/resumed.figures"
first=$(wc -l <"$scratch/first.figures") resumed=$(wc -l <"$scratch/resumed.figures")
last=$(tail -n 1 "$scratch/resumed.figures" | cut -d' ' -f1)
echo "first run: $first steps${stopped_at:+ (stopped at step $stopped_at)}; requeued run: $resumed steps, to step $last"
[ "$first" -ge 10 ] && [ "$first" -lt 4000 ] || fail "the first run logged $first steps: the stop did not land part way"
[ "$last" = 4000 ] || fail "the requeued run ended at step $last, not 4000"
for part in first resumed; do
    grep -Fxf "$scratch/$part.figures" "$scratch/reference.figures" | cmp -s - "$scratch/$part.figures" ||
        { diff "$scratch/$part.figures" "$scratch/reference.figures" | head -n 5; fail "the $part run's steps differ from the uninterrupted run's"; }
done
echo "PASS: stopped by SIGUSR1, exit 75, requeued, resumed and completed with the uninterrupted run's losses"
