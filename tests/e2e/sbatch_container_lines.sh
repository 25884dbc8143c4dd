#!/usr/bin/env bash
# sbatch_container_lines.sh SBATCH: the task command lines scripts/slurm/llmtrain.sbatch forms
# with LLMTRAIN_CONTAINER, as srun receives them (docs/container.md quotes them; neither Pyxis
# nor Apptainer is here to run them): a stand-in srun on PATH records its arguments and exits
# 0. An image reference goes to Pyxis (srun --container-image, the submit directory mounted
# and the working directory), a .sif file to Apptainer (apptainer exec --nv, the same bind
# and directory); each task runs the image's `llmtrain` from PATH, with --resume auto from
# the supervisor. Refused with exit 2 and the reason: a container without
# LLMTRAIN_CHECKPOINT_DIR, Pyxis under LLMTRAIN_LAUNCHER=mpirun, an unknown runtime.
set -u
sbatch=$1
fail() { echo "FAIL: $*"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
# shellcheck disable=SC2016  # the stand-in's own "$*"
printf '#!/bin/sh\nprintf "%%s\\n" "$*" >>"$SRUN_RECORD"\n' >"$work/bin/srun"
chmod +x "$work/bin/srun"
submit_dir=$PWD
job() { env PATH="$work/bin:$PATH" SRUN_RECORD="$work/srun.args" SLURM_JOB_ID=7 SLURM_SUBMIT_DIR="$submit_dir" \
            LLMTRAIN_CONFIG=configs/tiny.toml LLMTRAIN_CHECKPOINT_DIR="$work/checkpoints" "$@" bash "$sbatch" >"$work/job.out" 2>&1; }
# expect_task CONTAINER LINE: the job with LLMTRAIN_CONTAINER=CONTAINER gives srun LINE.
expect_task() {
    rm -f "$work/srun.args"
    job LLMTRAIN_CONTAINER="$1" || fail "the job with LLMTRAIN_CONTAINER=$1 failed: $(cat "$work/job.out")"
    [ "$(cat "$work/srun.args")" = "$2" ] || fail "LLMTRAIN_CONTAINER=$1: srun got '$(cat "$work/srun.args")', expected '$2'"
    echo "ok: LLMTRAIN_CONTAINER=$1: srun $2"
}
# The default run directory is the job's: every restart and requeue continues the run there.
task="llmtrain train configs/tiny.toml --run-dir runs/llmtrain-7 --resume auto"
expect_task 'registry#llmtrain:cuda' \
    "--mpi=pmix --kill-on-bad-exit=1 --container-image=registry#llmtrain:cuda --container-mounts=$submit_dir:$submit_dir --container-workdir=$submit_dir $task"
expect_task "$work/llmtrain.sif" \
    "--mpi=pmix --kill-on-bad-exit=1 apptainer exec --nv --bind $submit_dir:$submit_dir --pwd $submit_dir $work/llmtrain.sif $task"

# expect_refusal REASON ENV...: the job exits 2 saying REASON.
expect_refusal() {
    local reason=$1
    shift
    job "$@"
    local code=$?
    { [ $code -eq 2 ] && grep -qF "$reason" "$work/job.out"; } || fail "$*: exit $code, expected 2 with '$reason': $(cat "$work/job.out")"
    echo "ok: $*: exit 2, '$reason'"
}
expect_refusal "with LLMTRAIN_CONTAINER, set LLMTRAIN_CHECKPOINT_DIR" LLMTRAIN_CONTAINER=llmtrain.sqsh LLMTRAIN_CHECKPOINT_DIR=
expect_refusal "Pyxis containers need LLMTRAIN_LAUNCHER=srun" LLMTRAIN_CONTAINER=llmtrain.sqsh LLMTRAIN_LAUNCHER=mpirun
expect_refusal "LLMTRAIN_CONTAINER_RUNTIME='docker': expected pyxis or apptainer" LLMTRAIN_CONTAINER=llmtrain.sqsh LLMTRAIN_CONTAINER_RUNTIME=docker
echo "PASS: the container launch lines are those docs/container.md gives"
