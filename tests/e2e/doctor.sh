#!/usr/bin/env bash
# doctor.sh SCRATCH LLMTRAIN MPIEXEC: `llmtrain doctor` on this machine. With the tiny
# config its MPI, config, data, host and storage checks run for real and pass (alone and as
# 2 ranks under mpirun) and the GPU checks say SKIP. Its checkpoint.dir on a read-only tmpfs
# FAILs (exit 2); on a 4 MB tmpfs no checkpoint fits (FAIL), on a 24 MB one fewer than
# keep_last + 1 do (WARN, exit 1); each with a hint. The tmpfs lives in a user + mount
# namespace; where the kernel refuses one, those cases are skipped (exit 77) and say why.
set -u
scratch=$1 bin=$2 mpiexec=$3
config=(configs/tiny.toml --io-mb 8)
fail() { echo "FAIL: $*"; exit 1; }
# status NAME FILE: the status of check NAME in doctor's JSON.
status() { grep -o "\"check\":\"$1\",[^}]*" "$2" | grep -o '"status":"[A-Z]*"' | cut -d'"' -f4; }
expect_status() {
    local got
    got=$(status "$1" "$3")
    [ "$got" = "$2" ] || fail "check $1 is '$got', expected $2 ($(cat "$3"))"
}

if [ "${DOCTOR_INSIDE:-}" != 1 ]; then
    rm -rf "$scratch"
    mkdir -p "$scratch"
    "$bin" doctor "${config[@]}" --set checkpoint.dir=\""$scratch/checkpoints"\" --json >"$scratch/alone.json"
    code=$?
    [ $code -eq 0 ] || fail "doctor exits $code on a healthy machine: $(cat "$scratch/alone.json")"
    for check in mpi.world config data host.memory host.cores storage.directory storage.fsync_rename storage.free_space storage.throughput storage.file_locking; do
        expect_status $check PASS "$scratch/alone.json"
    done
    expect_status gpu.devices SKIP "$scratch/alone.json"
    grep -q '"check":"storage.throughput","detail":"write [0-9]* MB/s, read [0-9]* MB/s' "$scratch/alone.json" || fail "no MB/s figures"
    echo "ok: alone: every check passes, the GPU's is skipped; $(grep -o 'write [0-9]* MB/s, read [0-9]* MB/s' "$scratch/alone.json")"
    "$mpiexec" --oversubscribe -np 2 "$bin" doctor "${config[@]}" --set checkpoint.dir=\""$scratch/checkpoints"\" --json >"$scratch/mpi.json" ||
        fail "doctor under mpirun -np 2 failed: $(cat "$scratch/mpi.json")"
    grep -q '"detail":"2 rank(s) on 1 node(s); this node holds 2 (local rank 0)"' "$scratch/mpi.json" || fail "the world is not reported: $(cat "$scratch/mpi.json")"
    expect_status config PASS "$scratch/mpi.json"
    echo "ok: under mpirun: 2 ranks on 1 node, every check passes"
    if ! why=$(unshare --user --map-root-user --mount true 2>&1); then
        echo "SKIP: the kernel refuses a user + mount namespace (needed for a tmpfs without root): $why"
        exit 77
    fi
    DOCTOR_INSIDE=1 exec unshare --user --map-root-user --mount "$0" "$@"
fi

# Inside the namespace: the tmpfs cases.
mnt=$scratch/mnt
mkdir -p "$mnt"
case_of() {  # NAME SIZE [ro]: runs doctor with checkpoint.dir on a fresh tmpfs
    umount "$mnt" 2>/dev/null
    mount -t tmpfs -o "size=$2" tmpfs "$mnt" || fail "mount tmpfs"
    mkdir -p "$mnt/checkpoints"
    [ "${3:-}" = ro ] && { mount -o remount,ro "$mnt" || fail "remount read-only"; }
    "$bin" doctor "${config[@]}" --set checkpoint.dir=\""$mnt/checkpoints"\" --json >"$scratch/$1.json"
    echo $? >"$scratch/$1.code"
}
case_of read_only 16m ro
[ "$(cat "$scratch/read_only.code")" = 2 ] || fail "read-only: exit $(cat "$scratch/read_only.code"), expected 2"
expect_status storage.directory FAIL "$scratch/read_only.json"
grep -q '"check":"storage.directory","detail":"[^"]*Read-only file system","hint":"choose a writable checkpoint.dir"' "$scratch/read_only.json" ||
    fail "read-only: no reason or hint: $(cat "$scratch/read_only.json")"
echo "ok: read-only checkpoint.dir: FAIL, exit 2, with the system's reason and a hint"
case_of full 4m
[ "$(cat "$scratch/full.code")" = 2 ] || fail "4 MB: exit $(cat "$scratch/full.code"), expected 2"
expect_status storage.free_space FAIL "$scratch/full.json"
grep -q '"hint":"not even one checkpoint fits' "$scratch/full.json" || fail "4 MB: no hint"
echo "ok: 4 MB tmpfs: free space FAIL (no checkpoint fits), exit 2"
case_of nearly_full 24m
[ "$(cat "$scratch/nearly_full.code")" = 1 ] || fail "24 MB: exit $(cat "$scratch/nearly_full.code"), expected 1: $(cat "$scratch/nearly_full.json")"
expect_status storage.free_space WARN "$scratch/nearly_full.json"
grep -q '"hint":"fewer than checkpoint.keep_last + 1 checkpoints fit' "$scratch/nearly_full.json" || fail "24 MB: no hint"
echo "ok: 24 MB tmpfs: free space WARN (fewer than keep_last + 1 checkpoints fit), exit 1"
umount "$mnt"
