#!/usr/bin/env bash
# checkpoint_save_failure.sh LLMTRAIN SCRATCH CONFIG [--set ...]: checkpoint.dir on a full
# disk and on a read-only filesystem (a small tmpfs in a user + mount namespace): a failed
# save warns with the system's reason and training goes on (checkpoint.on_save_error =
# "warn"), or ends the run with exit 1 ("abort"); the checkpoints saved before stay intact
# and `latest` names one of them. Skipped (77) where the kernel refuses the namespace.
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
config=("$@" --set train.sample_tokens=0 --set train.log_every=1000 --set checkpoint.every_steps=5 --set checkpoint.keep_last=100
        --set checkpoint.dir=\""$scratch/disk/checkpoints"\")
# Room for two checkpoints and a half.
mount -t tmpfs -o size=2200k tmpfs "$scratch/disk" || { echo "FAIL: cannot mount a tmpfs"; exit 1; }

"$bin" train "${config[@]}" --set train.steps=30 --run-dir "$scratch/full_warn" >"$scratch/full_warn.out" 2>&1
status=$?
[ "$status" -eq 0 ] || fail "full disk, warn: exit $status, want 0 (training goes on)"
grep -q "checkpoint at step [0-9]* failed on rank 0: .*No space left on device" "$scratch/full_warn.out" ||
    fail "full disk, warn: no warning with the system's reason"
latest=$(cat "$scratch/disk/checkpoints/latest")
"$bin" checkpoint verify "$scratch/disk/checkpoints/$latest" >"$scratch/verify.out" 2>&1 || fail "full disk: latest ($latest) does not verify: $(cat "$scratch/verify.out")"
echo "ok   full disk, warn: exit $status; $(grep -o 'checkpoint at step [0-9]* failed[^:]*' "$scratch/full_warn.out" | head -1); latest $latest verifies"

rm -rf "$scratch/disk/checkpoints"
"$bin" train "${config[@]}" --set train.steps=30 --set checkpoint.on_save_error=\"abort\" --run-dir "$scratch/full_abort" >"$scratch/full_abort.out" 2>&1
status=$?
[ "$status" -eq 1 ] || fail "full disk, abort: exit $status, want 1"
grep -q "^llmtrain: I/O error: checkpoint at step [0-9]* failed: .*No space left on device.*on_save_error = \"abort\"" "$scratch/full_abort.out" ||
    fail "full disk, abort: no error line with the reason: $(tail -2 "$scratch/full_abort.out")"
latest=$(cat "$scratch/disk/checkpoints/latest")
"$bin" checkpoint verify "$scratch/disk/checkpoints/$latest" >/dev/null 2>&1 || fail "full disk, abort: latest ($latest) does not verify"
echo "ok   full disk, abort: exit $status; latest $latest verifies"

rm -rf "$scratch/disk/checkpoints"
"$bin" train "${config[@]}" --set train.steps=5 --run-dir "$scratch/before_read_only" >/dev/null 2>&1 || fail "the run before the read-only one failed"
mount -o remount,ro "$scratch/disk"
"$bin" train "${config[@]}" --set train.steps=10 --resume auto --run-dir "$scratch/read_only" >"$scratch/read_only.out" 2>&1
status=$?
[ "$status" -eq 0 ] || fail "read-only, warn: exit $status, want 0"
grep -q "checkpoint at step 10 failed on rank 0: .*Read-only file system" "$scratch/read_only.out" || fail "read-only: no warning with the system's reason: $(grep -i checkpoint "$scratch/read_only.out")"
[ "$(cat "$scratch/disk/checkpoints/latest")" = step_00000005 ] || fail "read-only: latest moved"
"$bin" checkpoint verify "$scratch/disk/checkpoints/step_00000005" >/dev/null 2>&1 || fail "read-only: step 5 does not verify"
echo "ok   read-only: exit $status; step_00000005 intact"
[ "$failures" -eq 0 ] || exit 1
INNER
