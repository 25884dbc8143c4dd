#!/usr/bin/env bash
# checkpoint_crash_safety.sh LLMTRAIN SCRATCH CONFIG [--set ...]:
#  1. A run whose checkpoint writer is slowed down (a test hook) is killed with SIGKILL at 10
#     random points of a save: each time the checkpoint `latest` names is complete, and
#     `--resume auto` loads it; `checkpoint verify` (where built) names the incomplete save.
#  2. A flipped byte in a tensor chunk and a truncated rank file are each passed over by
#     `--resume auto`, with a message naming the file, which resumes from the one before.
set -u
bin=$1 scratch=$2
shift 2
config=("$@" --set train.sample_tokens=0 --set train.log_every=1000 --set checkpoint.every_steps=5)
rm -rf "$scratch"
mkdir -p "$scratch"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# The step the resumed run starts at, from its console ("resumed from '...step_N' at step N").
resume_once() {  # CHECKPOINT_DIR RUN_DIR STEPS
    "$bin" train "${config[@]}" --set checkpoint.dir=\""$1"\" --set checkpoint.every_steps=0 --set train.steps="$3" --resume auto --run-dir "$2" >"$2.out" 2>&1
}

for attempt in $(seq 10); do
    dir=$scratch/kill_$attempt
    LLMTRAIN_CHECKPOINT_WRITE_DELAY_MS=15 "$bin" train "${config[@]}" --set train.steps=100000 --set checkpoint.dir=\""$dir/checkpoints"\" \
        --run-dir "$dir/run" >"$dir.out" 2>&1 &
    pid=$!
    # Once step 5 is committed and the save of step 10 is under way: somewhere in that save.
    for _ in $(seq 600); do
        [ -e "$dir/checkpoints/latest" ] && [ -d "$dir/checkpoints/step_00000010.tmp" ] && break
        sleep 0.05
    done
    sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
    kill -KILL "$pid"
    wait "$pid" 2>/dev/null
    latest=$(cat "$dir/checkpoints/latest")
    [ -f "$dir/checkpoints/$latest/manifest.json" ] || fail "attempt $attempt: latest names '$latest', which has no manifest"
    step=${latest#step_}
    step=$((10#$step))
    resume_once "$dir/checkpoints" "$dir/resumed" $((step + 1))
    grep -q "resumed from '$dir/checkpoints/$latest' at step $step" "$dir/resumed.out" ||
        { fail "attempt $attempt: --resume auto did not load $latest:"; tail -3 "$dir/resumed.out"; }
    incomplete=$(ls -d "$dir"/checkpoints/*.tmp 2>/dev/null | wc -l)
    if "$bin" checkpoint --help >/dev/null 2>&1 && [ "$incomplete" -gt 0 ]; then
        "$bin" checkpoint verify "$dir/checkpoints" >"$dir/verify.out" 2>&1
        grep -q "incomplete" "$dir/verify.out" || { fail "attempt $attempt: checkpoint verify does not name the incomplete save:"; cat "$dir/verify.out"; }
    fi
    echo "ok   attempt $attempt: killed with $latest committed ($incomplete save(s) incomplete); --resume auto loads $latest"
done

# Damaged checkpoints: a run saving at steps 5 and 10, then step 10's file damaged.
damaged() {  # NAME DAMAGE-COMMAND (run on step 10's rank file)
    local name=$1 dir=$scratch/$1
    shift
    "$bin" train "${config[@]}" --set train.steps=10 --set checkpoint.dir=\""$dir/checkpoints"\" --run-dir "$dir/run" >"$dir.out" 2>&1 ||
        { fail "$name: the run failed"; return; }
    local file=$dir/checkpoints/step_00000010/rank_00000.h5
    "$@" "$file"
    resume_once "$dir/checkpoints" "$dir/resumed" 11
    if grep -q "step_00000010' cannot be loaded: .*rank_00000.h5" "$dir/resumed.out" && grep -q "resumed from '$dir/checkpoints/step_00000005' at step 5" "$dir/resumed.out"; then
        echo "ok   $name: passed over with '$(grep -o "step_00000010' cannot be loaded: [^;]*" "$dir/resumed.out")'; resumed from step 5"
    else
        fail "$name: --resume auto did not pass over the damaged checkpoint:"; cat "$dir/resumed.out"
    fi
}
flip_byte() { local size; size=$(stat -c %s "$1"); printf '\xff' | dd of="$1" bs=1 seek=$((size / 2)) conv=notrunc status=none; }
truncate_half() { truncate -s $(($(stat -c %s "$1") / 2)) "$1"; }
damaged flipped_byte flip_byte
damaged truncated truncate_half

[ "$failures" -eq 0 ] || exit 1
echo "every kill left a loadable latest checkpoint; damaged checkpoints were passed over"
