#!/usr/bin/env bash
# checkpoint_save_failure.sh LLMTRAIN SCRATCH CONFIG [--set ...]: checkpoint.dir on a small
# tmpfs (in a user + mount namespace), as a new user meets a full disk:
#   - the start-up check warns that checkpoint.keep_last + 1 checkpoints do not fit (and
#     --strict refuses, exit 74);
#   - under on_save_error = "warn" each failed save warns with the system's reason and names
#     the newest checkpoint that really exists, log.jsonl has a `checkpoint_failed` record of
#     each, /metrics counts them (llmtrain_checkpoint_failures_total), and a run whose final
#     save failed exits 74, not 0;
#   - checkpoint.max_failed_saves failures in a row stop the run (exit 74); "abort" stops it
#     at the first (exit 74);
#   - a read-only checkpoint.dir is refused at the door (exit 74: its lock cannot be made).
# The checkpoints saved before stay intact and `latest` names one of them. Skipped (77)
# where the kernel refuses the namespace.
set -u
bin=$1 scratch=$2
shift 2
if ! unshare --user --map-root-user --mount true 2>/dev/null; then
    echo "skipped: this kernel refuses a user + mount namespace (unshare), so no small filesystem can be made without root"
    exit 77
fi
rm -rf "$scratch"
mkdir -p "$scratch/disk"
export bin scratch
exec unshare --user --map-root-user --mount bash -s -- "$@" <<'INNER'
set -u
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ck=$scratch/disk/checkpoints
config=("$@" --set train.sample_tokens=0 --set train.log_every=1000 --set checkpoint.every_steps=5 --set checkpoint.keep_last=100
        --set checkpoint.dir=\""$ck"\")
# Room for two checkpoints and a half.
mount -t tmpfs -o size=2200k tmpfs "$scratch/disk" || { echo "FAIL: cannot mount a tmpfs"; exit 1; }
latest_verifies() {  # WHAT
    local latest
    latest=$(cat "$ck/latest" 2>/dev/null)
    "$bin" checkpoint verify "$ck/$latest" >"$scratch/verify.out" 2>&1 || fail "$1: latest ($latest) does not verify: $(cat "$scratch/verify.out")"
}

# --strict refuses where keep_last + 1 checkpoints cannot fit; nothing is written.
"$bin" train "${config[@]}" --set train.steps=30 --strict --run-dir "$scratch/strict" >"$scratch/strict.out" 2>&1
status=$?
[ "$status" -eq 74 ] && grep -q "^llmtrain: storage error: checkpoint.dir '$ck' has [0-9.]* MB free: room for [0-9]* checkpoint(s) of about .*keep_last = 100 needs 101.*(--strict)" "$scratch/strict.out" ||
    fail "--strict on a small disk: exit $status: $(tail -2 "$scratch/strict.out")"
[ ! -e "$ck/step_00000005" ] || fail "--strict: a checkpoint was written"
echo "ok   --strict on a disk without room for keep_last + 1 checkpoints: exit 74"

# warn, with failures allowed to go on: the run trains to its end and exits 74 for its lost final save.
metrics=(--set metrics.enabled=\"on\" --set metrics.port=0 --set metrics.listen=\"127.0.0.1\" --set metrics.linger_seconds=4)
"$bin" train "${config[@]}" "${metrics[@]}" --set train.steps=30 --set checkpoint.max_failed_saves=100 --run-dir "$scratch/full_warn" >"$scratch/full_warn.out" 2>&1 &
pid=$!
# The last /metrics the run served (it lingers 4 s after its final save).
python3 - "$scratch/full_warn" "$pid" >"$scratch/full_warn.metrics" <<'PY'
import json, os, sys, time, urllib.request
run_dir, pid = sys.argv[1], int(sys.argv[2])
last = ""
while True:
    alive = os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    try:
        with open(os.path.join(run_dir, "metrics_targets.json")) as f:
            target = json.load(f)[0]["targets"][0]
        last = urllib.request.urlopen(f"http://{target}/metrics", timeout=2).read().decode()
    except Exception:
        pass
    if not alive:
        break
    time.sleep(0.3)
print(last)
PY
wait "$pid"
status=$?
[ "$status" -eq 74 ] || fail "full disk, warn: exit $status, want 74 (the final save failed)"
grep -q "warning: checkpoint.dir '$ck' has [0-9.]* MB free: room for [0-9]* checkpoint(s)" "$scratch/full_warn.out" || fail "full disk: no start-up warning about the room"
grep -q "checkpoint at step [0-9]* failed on rank 0: .*No space left on device" "$scratch/full_warn.out" ||
    fail "full disk, warn: no warning with the system's reason"
newest=$(ls -d "$ck"/step_* | tail -1)
grep -q "was not saved (.*training goes on.*the newest checkpoint of this run is '$newest'" "$scratch/full_warn.out" ||
    fail "full disk, warn: the warning does not name the newest checkpoint $newest: $(grep 'was not saved' "$scratch/full_warn.out" | tail -1)"
grep -q "^llmtrain: storage error: the checkpoint of the last step 30 was not saved (.*No space left on device.*the newest checkpoint is '$newest'" "$scratch/full_warn.out" ||
    fail "full disk, warn: the final error: $(tail -2 "$scratch/full_warn.out")"
failed_records=$(grep -c '"event":"checkpoint_failed"' "$scratch/full_warn/log.jsonl")
[ "$failed_records" -ge 2 ] || fail "log.jsonl has $failed_records checkpoint_failed record(s)"
grep '"event":"checkpoint_failed"' "$scratch/full_warn/log.jsonl" | tail -1 | grep -q "\"newest_checkpoint\":\"$newest\".*No space left on device\|No space left on device.*\"newest_checkpoint\":\"$newest\"" ||
    fail "the last checkpoint_failed record: $(grep '"event":"checkpoint_failed"' "$scratch/full_warn/log.jsonl" | tail -1)"
tail -n 1 "$scratch/full_warn/log.jsonl" | grep -q '"event":"error".*"exit_code":74' || fail "log.jsonl ends with $(tail -n 1 "$scratch/full_warn/log.jsonl")"
counted=$(sed -n 's/^llmtrain_checkpoint_failures_total{[^}]*} \([0-9.e+]*\)$/\1/p' "$scratch/full_warn.metrics")
[ -n "$counted" ] && python3 -c "import sys; sys.exit(0 if float('$counted') >= $failed_records else 1)" ||
    fail "/metrics counts '$counted' failed saves, log.jsonl $failed_records"
latest_verifies "full disk, warn"
echo "ok   full disk, warn: exit 74; $failed_records checkpoint_failed records, /metrics counts $counted; the warnings name $newest"

rm -rf "$ck"
"$bin" train "${config[@]}" --set train.steps=60 --run-dir "$scratch/full_in_a_row" >"$scratch/full_in_a_row.out" 2>&1
status=$?
[ "$status" -eq 74 ] && grep -q "^llmtrain: storage error: checkpoint at step [0-9]* failed: .*No space left on device.*that is 3 failed save(s) in a row (checkpoint.max_failed_saves = 3)" \
    "$scratch/full_in_a_row.out" || fail "full disk, 3 failures in a row: exit $status: $(tail -2 "$scratch/full_in_a_row.out")"
latest_verifies "full disk, 3 in a row"
echo "ok   full disk, warn: 3 failed saves in a row stop the run, exit 74"

rm -rf "$ck"
"$bin" train "${config[@]}" --set train.steps=30 --set checkpoint.on_save_error=\"abort\" --run-dir "$scratch/full_abort" >"$scratch/full_abort.out" 2>&1
status=$?
[ "$status" -eq 74 ] || fail "full disk, abort: exit $status, want 74"
grep -q "^llmtrain: storage error: checkpoint at step [0-9]* failed: .*No space left on device.*on_save_error = \"abort\"" "$scratch/full_abort.out" ||
    fail "full disk, abort: no error line with the reason: $(tail -2 "$scratch/full_abort.out")"
latest_verifies "full disk, abort"
echo "ok   full disk, abort: exit $status"

rm -rf "$ck"
"$bin" train "${config[@]}" --set train.steps=5 --run-dir "$scratch/before_read_only" >/dev/null 2>&1 || fail "the run before the read-only one failed"
mount -o remount,ro "$scratch/disk"
"$bin" train "${config[@]}" --set train.steps=10 --resume auto --run-dir "$scratch/read_only" >"$scratch/read_only.out" 2>&1
status=$?
[ "$status" -eq 74 ] && grep -q "^llmtrain: storage error: checkpoint.dir '$ck': cannot open its lock file .*Read-only file system" "$scratch/read_only.out" ||
    fail "read-only: exit $status: $(tail -2 "$scratch/read_only.out")"
[ "$(cat "$ck/latest")" = step_00000005 ] || fail "read-only: latest moved"
"$bin" checkpoint verify "$ck/step_00000005" >/dev/null 2>&1 || fail "read-only: step 5 does not verify"
echo "ok   read-only: refused at the door, exit $status; step_00000005 intact"
[ "$failures" -eq 0 ] || exit 1
INNER
