# Sourced by the Slurm e2e tests: a real single-node Slurm cluster (munged, slurmctld and
# slurmd on 127.0.0.1, as the current user, with their own slurm.conf, munge key, state and
# spool directories and free ports). The caller defines skip (exit 77 with the reason) and
# sets scratch (emptied); start_slurm_cluster starts the daemons and exports SLURM_CONF, or
# skips with the daemon's own words where they cannot start here (no permission, no munge,
# ...). The daemons, and the caller's $job if it set one, are stopped on any exit; their logs
# are kept in $scratch/daemon-logs.
# shellcheck shell=bash

pids=()
stop_cluster() {
    [ -n "${job:-}" ] && scancel "$job" 2>/dev/null && for _ in $(seq 50); do squeue -h -j "$job" 2>/dev/null | grep -q . || break; sleep 0.2; done
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
    [ -f "$state/munge/munged.pid" ] && kill "$(cat "$state/munge/munged.pid")" 2>/dev/null
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
    cp -r "$state/log" "$scratch/daemon-logs" 2>/dev/null
    rm -rf "$state"
}

# The first line that says why a daemon stopped, for the skip message.
why() { grep -m1 -iE "fatal|error" "$1" 2>/dev/null || tail -n 1 "$1" 2>/dev/null || echo "no log at $1"; }

# start_slurm_cluster [TOOL...]: also skips when one of the TOOLs (sbatch, salloc, ...) is missing.
start_slurm_cluster() {
    for tool in munged slurmctld slurmd scontrol scancel sinfo squeue srun python3 "$@"; do
        command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/install-deps.sh installs slurmctld, slurmd, slurm-client and munge)"
    done

    rm -rf "$scratch"
    mkdir -p "$scratch"
    # The daemons' files in a short path: munge's socket path must fit a sockaddr_un (108 bytes).
    state=$(mktemp -d /tmp/llmtrain-slurm.XXXXXX)
    chmod 755 "$state"
    mkdir -p "$state/munge" "$state/ctld" "$state/spool"
    chmod 700 "$state/munge"

    trap stop_cluster EXIT

    # munge: its own key and socket. As root munged wants --force.
    dd if=/dev/urandom of="$state/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$state/munge/munge.key"
    mkdir -p "$state/log"
    munged --socket="$state/munge/munge.socket" --key-file="$state/munge/munge.key" --pid-file="$state/munge/munged.pid" \
        --log-file="$state/log/munged.log" --seed-file="$state/munge/seed" $([ "$(id -u)" -eq 0 ] && echo --force) 2>"$state/log/munged.err" ||
        skip "munged does not start: $(cat "$state/log/munged.err") $(why "$state/log/munged.log")"

    read -r ctld_port slurmd_port < <(python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
    user=$(id -un)
    # Two CPUs for two tasks whatever the machine has (config_overrides: slurmd believes slurm.conf).
    cores=$(getconf _NPROCESSORS_ONLN)
    [ "$cores" -ge 2 ] || cores=2
    # No cgroups: processes tracked by parentage, no task binding, no accounting. cred_expire
    # (default 120 s) is also how long a requeued job waits before it may start again.
    cat >"$state/slurm.conf" <<EOF
ClusterName=llmtraintest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$state/munge/munge.socket,cred_expire=5
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
PlugStackConfig=$state/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
SlurmdParameters=config_overrides
JobRequeue=1
SchedulerType=sched/builtin
NodeName=node0 NodeHostname=$(hostname) NodeAddr=127.0.0.1 CPUs=$cores State=UNKNOWN
PartitionName=test Nodes=node0 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
    touch "$state/plugstack.conf"
    export SLURM_CONF=$state/slurm.conf

    slurmctld -D -i -f "$SLURM_CONF" >"$state/log/slurmctld.out" 2>&1 &
    pids+=($!)
    slurmd -D -N node0 -f "$SLURM_CONF" >"$state/log/slurmd.out" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do
        [ "$(sinfo -h -N -o %T 2>/dev/null)" = idle ] && break
        for daemon in slurmctld slurmd; do
            kill -0 "${pids[$([ $daemon = slurmctld ] && echo 0 || echo 1)]}" 2>/dev/null ||
                skip "$daemon does not start: $(why "$state/log/$daemon.log") $(tail -n 2 "$state/log/$daemon.out")"
        done
        sleep 0.2
    done
    [ "$(sinfo -h -N -o %T 2>/dev/null)" = idle ] ||
        skip "the node never became idle (sinfo: '$(sinfo -h -N -o '%T %E' 2>&1)'): slurmctld: $(why "$state/log/slurmctld.log"); slurmd: $(why "$state/log/slurmd.log")"
    echo "cluster up: slurmctld :$ctld_port, slurmd :$slurmd_port, node0 with $cores CPUs, user $user"
}
