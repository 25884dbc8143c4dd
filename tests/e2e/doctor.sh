#!/usr/bin/env bash
# doctor.sh SCRATCH LLMTRAIN MPIEXEC FAKE_NVML_DIR: `llmtrain doctor` on this machine. With the
# tiny config its MPI, config, data, host and storage checks run for real and pass (alone and
# as 2 ranks under mpirun, where the MPI point-to-point bandwidth between the 2 local ranks is
# measured and reported as intra-node) and the GPU and inter-node checks say SKIP with the
# reason. Through a fake NVML (FAKE_NVML_DIR/libnvidia-ml.so.1) the GPU health checks read a
# healthy GPU (PASS, exit 0), then one fault at a time: ECC errors since the driver loaded
# (FAIL), only in the GPU's past (WARN), an NVLink link down (WARN), a failed row remapping
# (FAIL), an XID (FAIL); each with a hint. Its checkpoint.dir on a read-only tmpfs
# FAILs (exit 2); on a 4 MB tmpfs no checkpoint fits (FAIL), on a 24 MB one fewer than
# keep_last + 1 do (WARN, exit 1); each with a hint. The tmpfs lives in a user + mount
# namespace; where the kernel refuses one, those cases are skipped (exit 77) and say why.
set -u
scratch=$1 bin=$2 mpiexec=$3 fake_nvml=$4
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
    node=gpu.node.$(hostname)
    for check in gpu.devices gpu.driver "$node" gpu.ecc gpu.retired_memory gpu.nvlink gpu.health gpu.p2p_copy gpu.nccl_allreduce \
                 mpi.intranode_bandwidth mpi.internode_bandwidth; do
        expect_status "$check" SKIP "$scratch/alone.json"
    done
    grep -q '"check":"gpu.nccl_allreduce","detail":"one rank: no peer to reduce with"' "$scratch/alone.json" || fail "NCCL skip without its reason"
    grep -q '"check":"gpu.ecc","detail":"libnvidia-ml.so.1 (NVML, the NVIDIA driver'"'"'s) cannot be loaded' "$scratch/alone.json" || fail "ECC skip without its reason"
    grep -q '"check":"storage.throughput","detail":"write [0-9]* MB/s, read [0-9]* MB/s' "$scratch/alone.json" || fail "no MB/s figures"
    echo "ok: alone: every check passes, the GPU's is skipped; $(grep -o 'write [0-9]* MB/s, read [0-9]* MB/s' "$scratch/alone.json")"
    "$mpiexec" --oversubscribe -np 2 "$bin" doctor "${config[@]}" --set checkpoint.dir=\""$scratch/checkpoints"\" --json >"$scratch/mpi.json" ||
        fail "doctor under mpirun -np 2 failed: $(cat "$scratch/mpi.json")"
    grep -q '"detail":"2 rank(s) on 1 node(s); this node holds 2 (local rank 0)"' "$scratch/mpi.json" || fail "the world is not reported: $(cat "$scratch/mpi.json")"
    expect_status config PASS "$scratch/mpi.json"
    expect_status mpi.intranode_bandwidth PASS "$scratch/mpi.json"
    grep -q '"check":"mpi.intranode_bandwidth","detail":"MPI point-to-point rank 0 -> rank 1 on [^"]*: [0-9.]* GB/s' "$scratch/mpi.json" ||
        fail "no intra-node MPI bandwidth: $(cat "$scratch/mpi.json")"
    expect_status mpi.internode_bandwidth SKIP "$scratch/mpi.json"
    grep -q '"check":"mpi.internode_bandwidth","detail":"one node: nothing crosses the network"' "$scratch/mpi.json" || fail "inter-node skip without its reason"
    expect_status gpu.nccl_allreduce SKIP "$scratch/mpi.json"
    echo "ok: under mpirun: 2 ranks on 1 node, every check passes; $(grep -o 'rank 0 -> rank 1 on [^"]*GB/s' "$scratch/mpi.json") (intra-node), inter-node SKIP (one node)"

    # nvml_case NAME FAULTS: doctor on the fake NVML showing FAULTS; its JSON and exit code.
    nvml_case() {
        LD_LIBRARY_PATH="$fake_nvml" FAKE_NVML_FAULTS=$2 "$bin" doctor "${config[@]}" --set checkpoint.dir=\""$scratch/checkpoints"\" --json >"$scratch/nvml_$1.json"
        echo $? >"$scratch/nvml_$1.code"
    }
    expect_code() { [ "$(cat "$scratch/nvml_$1.code")" = "$2" ] || fail "fake NVML $1: exit $(cat "$scratch/nvml_$1.code"), expected $2: $(cat "$scratch/nvml_$1.json")"; }
    expect_hint() { grep -q "\"check\":\"$2\",[^}]*\"hint\":\"$3" "$scratch/nvml_$1.json" || fail "fake NVML $1: $2 without the hint '$3': $(cat "$scratch/nvml_$1.json")"; }
    nvml_case healthy ""
    expect_code healthy 0
    for check in "$node" gpu.ecc gpu.retired_memory gpu.nvlink gpu.health; do expect_status "$check" PASS "$scratch/nvml_healthy.json"; done
    grep -q "\"check\":\"$node\",\"detail\":\"1 x Fake GPU (NVML stand-in); 1 rank(s) here\"" "$scratch/nvml_healthy.json" || fail "no GPU line for the node"
    grep -q '"check":"gpu.nvlink","detail":"2 NVLink link(s) on 1 GPU(s), all active"' "$scratch/nvml_healthy.json" || fail "NVLink links not counted"
    echo "ok: fake NVML, healthy GPU: node, ECC, retired memory, NVLink and XID checks PASS, exit 0"
    nvml_case ecc ecc_volatile
    expect_code ecc 2
    expect_status gpu.ecc FAIL "$scratch/nvml_ecc.json"
    expect_hint ecc gpu.ecc "uncorrectable memory errors corrupt training: drain the node"
    nvml_case ecc_past ecc_aggregate
    expect_code ecc_past 1
    expect_status gpu.ecc WARN "$scratch/nvml_ecc_past.json"
    nvml_case link link_down
    expect_code link 1
    expect_status gpu.nvlink WARN "$scratch/nvml_link.json"
    grep -q '"check":"gpu.nvlink","detail":"2 NVLink link(s); down: GPU 0 link 1"' "$scratch/nvml_link.json" || fail "the link down is not named"
    expect_hint link gpu.nvlink "collectives fall back to slower paths"
    nvml_case remap remap_failed
    expect_code remap 2
    expect_status gpu.retired_memory FAIL "$scratch/nvml_remap.json"
    expect_hint remap gpu.retired_memory "the GPU has no spare memory rows left"
    nvml_case xid xid
    expect_code xid 2
    expect_status gpu.health FAIL "$scratch/nvml_xid.json"
    grep -q '"detail":"critical XID event(s) while doctor ran: XID 79 on GPU 0 (GPU has fallen off the bus)"' "$scratch/nvml_xid.json" || fail "the XID is not named"
    echo "ok: fake NVML faults: ECC now FAIL, ECC in the past WARN, NVLink link down WARN, row remapping failed FAIL, XID 79 FAIL; each with a hint"
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
