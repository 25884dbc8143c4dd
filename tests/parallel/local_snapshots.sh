#!/usr/bin/env bash
# local_snapshots.sh SCRATCH LLMTRAIN MPIEXEC SUPERVISE CONFIG [--set ...]: recovery from
# node-local snapshots ([checkpoint.local]) on 4 ranks on 2 simulated nodes (ranks 0-1 on node
# "a", 2-3 on node "b": LLMTRAIN_NODE_NAME, and checkpoint.local.dir holds "{node}", so each
# node has a directory of its own). Local snapshots every 2 steps, persistent checkpoints every
# 6. In each scenario world rank 2 stops at step 13 (the fault `hang`: the snapshot of step 10
# is then complete on both nodes, that of step 12 captured but not yet copied) and is killed
# with SIGKILL; scripts/llmtrain-supervise restarts the job, which must end with the final
# weights and AdamW moments of an uninterrupted run, bit for bit (h5diff), and log the same
# losses for every step after the one it resumed from.
#   node_lost     node b's directory deleted before the kill (the node was replaced): the
#                 restart resumes from step 10, ranks 2 and 3 fetching their pieces from the
#                 replicas on node a
#   process_lost  node b's directory kept: resumes from step 10 from the own copies (no piece
#                 fetched, the persistent checkpoint not read)
#   both_lost     node b's directory deleted and rank 2's replicas on node a damaged: every
#                 local snapshot is passed over, saying why, and the job resumes from the
#                 persistent checkpoint of step 6
# and, without a restart,
#   disk_full     rank 1's snapshot of step 4 fails as a full /dev/shm fails it (the fault
#                 `localfull`): a warning, the next snapshot complete, the run's final weights
#                 those of the uninterrupted run
#   rollback      a loss spike rolled back to the persistent checkpoint of step 18 deletes the
#                 local snapshots (they hold the abandoned steps and predate the skipped
#                 data); the snapshots after it are the new timeline's
#   shared_dir    a checkpoint.local.dir both nodes see is refused before training (exit 2).
set -u
scratch=$1 bin=$2 mpiexec=$3 supervise=$4
shift 4
readonly steps=16
rm -rf "$scratch"
mkdir -p "$scratch"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# checkpoint.local.when_busy = "wait": every due step is snapshotted whatever this machine's
# speed, so that the snapshot of step 10 is complete when rank 2 stops at step 13.
common=("$@" --set train.steps=$steps --set checkpoint.every_steps=6 --set checkpoint.local.every_steps=2 --set checkpoint.local.keep=3
        --set checkpoint.local.when_busy=wait
        --set train.sample_tokens=0 --set train.log_every=1 --set train.eval_every=0 --resume auto)
final=$(printf 'step_%08d' $steps)

# The command of a job in directory $1 (its checkpoints, run directory and local directories
# there), ranks 0-1 on node a and 2-3 on node b; $2 is the node directory pattern (default
# DIR/local/{node}), further arguments go to every rank.
job() {
    local dir=$1 local_dir=${2:-$1/local/\{node\}}
    shift 2 2>/dev/null || shift $#
    local args=("${common[@]}" --set checkpoint.dir=\""$dir/checkpoints"\" --set checkpoint.local.dir=\""$local_dir"\" --run-dir "$dir/run" "$@")
    echo "$mpiexec" --oversubscribe -np 2 -x LLMTRAIN_NODE_NAME=a -x LLMTRAIN_INJECT_FAULT "$bin" train "${args[@]}" \
        : -np 2 -x LLMTRAIN_NODE_NAME=b -x LLMTRAIN_INJECT_FAULT "$bin" train "${args[@]}"
}

# The loss of every step in a run's log.jsonl, "STEP LOSS" per line.
# (log.jsonl's keys are sorted: "loss" comes before "step").
losses() { grep '"event":"step"' "$1/run/log.jsonl" | sed -E 's/.*"loss":([^,]+),.*"step":([0-9]+),.*/\2 \1/' | LC_ALL=C sort -k1,1 -u; }

reference=$scratch/reference
mkdir -p "$reference"
read -ra command <<<"$(job "$reference")"
LLMTRAIN_INJECT_FAULT= "${command[@]}" >"$reference/out" 2>&1 || { echo "FAIL: the uninterrupted run failed"; tail -5 "$reference/out"; exit 1; }

# The pid of world rank $2 among the processes of run directory $1.
rank_pid() {
    local pid
    for pid in $(pgrep -f -- "--run-dir $1/run( |$)"); do
        tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$pid"; return; }
    done
}

# Scenario $1: runs the job under the supervisor, rank 2 hanging at step 13; $2 is what happens
# to the local directories while it hangs. Leaves the supervisor's output in DIR/supervise.out.
# The ranks start through a wrapper that drops the fault once DIR/killed exists, so that the
# restart does not hang again.
scenario() {
    local name=$1 damage=$2 dir=$scratch/$1
    mkdir -p "$dir"
    printf '#!/usr/bin/env bash\n[ -e %q ] && unset LLMTRAIN_INJECT_FAULT\nexec %q "$@"\n' "$dir/killed" "$bin" >"$dir/llmtrain-drill"
    chmod +x "$dir/llmtrain-drill"
    local real_bin=$bin
    bin=$dir/llmtrain-drill
    read -ra command <<<"$(job "$dir")"
    bin=$real_bin
    LLMTRAIN_INJECT_FAULT=hang:2:13 "$supervise" --backoff 1 --max-restarts 2 --checkpoint-dir "$dir/checkpoints" -- "${command[@]}" >"$dir/supervise.out" 2>&1 &
    local supervisor=$! pid=""
    for _ in $(seq 1200); do
        grep -q '"event":"step".*"step":12,' "$dir/run/log.jsonl" 2>/dev/null && pid=$(rank_pid "$dir" 2) && [ -n "$pid" ] && break
        sleep 0.05
    done
    [ -n "$pid" ] || { fail "$name: rank 2 never reached step 12"; kill $supervisor; wait $supervisor; return 1; }
    sleep 0.5  # rank 2 is hanging at step 13, the others wait for it
    $damage "$dir"
    touch "$dir/killed"
    kill -KILL "$pid"
    wait $supervisor
    local code=$?
    [ $code -eq 0 ] || { fail "$name: supervisor exit $code"; tail -15 "$dir/supervise.out"; return 1; }
    ! grep -q "local snapshot of step [0-9]* failed" "$dir/supervise.out" || fail "$name: a local snapshot failed: $(grep -m1 "local snapshot of step [0-9]* failed" "$dir/supervise.out")"
    for file in "$reference/checkpoints/$final"/rank_*.h5; do
        h5diff -q "$file" "$dir/checkpoints/$final/$(basename "$file")" || { fail "$name: $(basename "$file") differs from the uninterrupted run's"; return 1; }
    done
    return 0
}

node_b() { echo "$1/local/b"; }
delete_node_b() { rm -rf "$(node_b "$1")"; }
keep_all() { :; }
# Node b gone, and rank 2's replicas on node a damaged (one byte flipped in the middle).
delete_node_b_and_damage_replicas() {
    delete_node_b "$1"
    local file size
    for file in "$1"/local/a/*/step_*/rank_00002.h5; do
        size=$(stat -c %s "$file")
        printf '\xff' | dd of="$file" bs=1 seek=$((size / 2)) conv=notrunc status=none
    done
}

# The step a restart resumed from, from its log line.
resumed_from() { grep -o "resumed from '[^']*' at step [0-9]*" "$1/supervise.out" | tail -1; }

# Steps after $2 log the reference's losses in scenario $1.
same_losses_after() {
    local diffs
    local compared
    compared=$(LC_ALL=C join <(losses "$reference") <(losses "$scratch/$1" | awk -v s="$2" '$1 > s'))
    diffs=$(awk '$2 != $3' <<<"$compared" | head -3)
    [ -z "$diffs" ] || fail "$1: losses differ from the uninterrupted run's (step reference resumed): $diffs"
    [ "$(wc -l <<<"$compared")" -eq $((steps - $2)) ] || fail "$1: expected the losses of steps $(($2 + 1))-$steps after the restart, found $(wc -l <<<"$compared")"
}

if scenario node_lost delete_node_b; then
    line=$(resumed_from "$scratch/node_lost")
    [[ $line == *"/local/"*"step_00000010' at step 10" ]] || fail "node_lost: expected a resume from the local snapshot of step 10, got: $line"
    grep -q "2 rank(s) fetched their piece from a peer" "$scratch/node_lost/supervise.out" || fail "node_lost: ranks 2 and 3 did not fetch their pieces from a peer"
    grep -q "restart 1 of 2 from step 10 " "$scratch/node_lost/supervise.out" || fail "node_lost: the supervisor did not count the local snapshot of step 10 as the restorable state"
    same_losses_after node_lost 10
    restart=$(grep '"event":"restart"' "$scratch/node_lost/run/log.jsonl" | tail -1)
    for field in '"interrupted_step":12' '"source":"local snapshot"' '"steps_lost":2' '"communicators":' '"first_step":' '"launch":' '"load":'; do
        [[ $restart == *"$field"* ]] || fail "node_lost: the restart record lacks $field: $restart"
    done
    echo "node_lost: $line; 2 pieces fetched from node a; restart record: 2 steps lost; final weights and moments bitwise equal"
fi

if scenario process_lost keep_all; then
    line=$(resumed_from "$scratch/process_lost")
    [[ $line == *"/local/"*"step_00000010' at step 10" ]] || fail "process_lost: expected a resume from the local snapshot of step 10, got: $line"
    grep -q "0 rank(s) fetched their piece from a peer (0.0 MB)" "$scratch/process_lost/supervise.out" || fail "process_lost: a piece was fetched although every node kept its own"
    grep -q "checkpoint resume: read '$scratch/process_lost/local/" "$scratch/process_lost/supervise.out" || fail "process_lost: the resume read something else than the local snapshot"
    same_losses_after process_lost 10
    echo "process_lost: $line; nothing fetched, nothing read from the persistent checkpoint; final weights and moments bitwise equal"
fi

if scenario both_lost delete_node_b_and_damage_replicas; then
    line=$(resumed_from "$scratch/both_lost")
    [[ $line == *"/checkpoints/step_00000006' at step 6" ]] || fail "both_lost: expected a resume from the persistent checkpoint of step 6, got: $line"
    grep -q "local snapshot of step 10 passed over: no node holds a whole copy of the piece of rank 2 (missing, or failing its size or XXH64)" "$scratch/both_lost/supervise.out" ||
        fail "both_lost: the restart did not say why the snapshot of step 10 was passed over"
    same_losses_after both_lost 6
    echo "both_lost: $line; local snapshots passed over with the reason; final weights and moments bitwise equal"
fi

full=$scratch/disk_full
mkdir -p "$full"
read -ra command <<<"$(job "$full")"
LLMTRAIN_INJECT_FAULT=localfull:1:4 "${command[@]}" >"$full/out" 2>&1
code=$?
snapshots=$(grep '"event":"local_snapshot"' "$full/run/log.jsonl" 2>/dev/null | sed -E 's/.*"complete":([a-z]+),.*"step":([0-9]+),.*/\2:\1/' | tr '\n' ' ')
if [ $code -ne 0 ]; then
    fail "disk_full: the run ended with exit $code"; tail -5 "$full/out"
elif ! grep -q "local snapshot of step 4 failed on rank 1: .*No space left on device" "$full/out"; then
    fail "disk_full: no warning naming rank 1's failed snapshot"
elif [[ $snapshots != *"4:false 6:true"* ]]; then
    fail "disk_full: expected step 4 failed and step 6 complete in log.jsonl, got: $snapshots"
elif ! h5diff -q "$reference/checkpoints/$final/rank_00001.h5" "$full/checkpoints/$final/rank_00001.h5"; then
    fail "disk_full: the final weights differ from the uninterrupted run's"
else
    echo "disk_full: warned, training went on; snapshots $snapshots; final weights bitwise equal"
fi

rollback=$scratch/rollback
mkdir -p "$rollback"
read -ra command <<<"$(job "$rollback" "" --set train.steps=30 --set monitor.on_spike=rollback --set monitor.warmup_steps=4 --set monitor.window=8)"
LLMTRAIN_INJECT_FAULT=spike:22:1000 "${command[@]}" >"$rollback/out" 2>&1
code=$?
left=$(cd "$rollback/local/a"/*/ 2>/dev/null && ls -d step_* | tr '\n' ' ')
if [ $code -ne 0 ]; then
    fail "rollback: the run ended with exit $code"; tail -5 "$rollback/out"
elif ! grep -q '"action":"rollback".*"rollback_to":18' "$rollback/run/anomalies.jsonl"; then
    fail "rollback: no rollback to step 18: $(cat "$rollback/run/anomalies.jsonl")"
elif ! grep -q "local snapshots deleted after the rollback to step 18" "$rollback/out"; then
    fail "rollback: the local snapshots were not deleted at the rollback"
elif [ "$left" != "step_00000026 step_00000028 step_00000030 " ]; then
    fail "rollback: expected the new timeline's snapshots 26, 28 and 30 on node a, found: $left"
else
    echo "rollback: local snapshots deleted at the rollback to step 18; node a keeps $left"
fi

# A directory without "{node}" is the same for both simulated nodes: a shared file system.
shared=$scratch/shared_dir
mkdir -p "$shared"
read -ra command <<<"$(job "$shared" "$shared/local")"
LLMTRAIN_INJECT_FAULT= "${command[@]}" >"$shared/out" 2>&1
code=$?
if [ $code -eq 2 ] && grep -q "checkpoint.local.dir: .* is also seen by node" "$shared/out"; then
    echo "shared_dir: refused with exit 2: $(grep -o "checkpoint.local.dir: .* is also seen by node [a-z]*" "$shared/out" | head -1)"
else
    fail "shared_dir: expected exit 2 naming checkpoint.local.dir, got exit $code"
    tail -5 "$shared/out"
fi

[ $failures -eq 0 ] && echo "local snapshots: all scenarios passed"
[ $failures -eq 0 ]
