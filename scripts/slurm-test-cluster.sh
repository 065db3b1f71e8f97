#!/usr/bin/env bash
# A real single-host SLURM cluster for tests and benchmarks: munged, slurmctld and two slurmd daemons
# (nodes named after this machine's hostname and `localhost`, both on loopback), so that 2-node jobs
# really run. Everything lives under one state directory; nothing listens beyond 127.0.0.1's ports.
#
#   scripts/slurm-test-cluster.sh install        # Debian's slurmctld slurmd slurm-client munge (root)
#   scripts/slurm-test-cluster.sh start [DIR]    # prints `export SLURM_CONF=...` on stdout
#   scripts/slurm-test-cluster.sh stop [DIR]     # stops the daemons by pid
#
# Needs root (slurmd runs jobs as their submitting user). DIR defaults to /tmp/trainyard-slurm.
set -euo pipefail
cmd=${1:-}
dir=${2:-/tmp/trainyard-slurm}

install() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
        && command -v munged >/dev/null; then
        return 0
    fi
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
}

stop() {
    for pidfile in "$dir"/run/*.pid; do
        [ -f "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$pidfile"
    done
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

start() {
    [ "$(id -u)" -eq 0 ] || { echo "slurm-test-cluster: needs root (slurmd runs jobs as their user)" >&2; exit 3; }
    for tool in slurmctld slurmd munged sbatch; do
        command -v $tool >/dev/null || { echo "slurm-test-cluster: $tool is not installed (run: $0 install)" >&2; exit 3; }
    done
    stop
    mkdir -p "$dir"/{run,log,spool,state,munge}
    chmod 700 "$dir/munge"
    local host cpus mem user ctld_port d1 d2
    host=$(hostname)
    cpus=$(nproc)
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 4 ))
    user=$(id -un)
    ctld_port=$(free_port); d1=$(free_port); d2=$(free_port)
    # munge: a private key and socket, so a system munged (if any) is left alone.
    [ -f "$dir/munge/munge.key" ] || dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$dir/munge/munge.key"
    munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
        --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed"
    # cred_expire=20: a requeued job may start again only cred_expire + 1 s after its requeue; SLURM's default
    # (120 s) was most of tests/launchers.rs's time (the requeue scenario: 132 of its 152 s). Job steps'
    # credentials live as long, plenty on one host.
    cat >"$dir/slurm.conf" <<EOF
ClusterName=trainyard
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=$user
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=20
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
MessageTimeout=20
JobRequeue=1
PrologFlags=NoHold
NodeName=$host NodeHostname=$host NodeAddr=127.0.0.1 Port=$d1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
NodeName=localhost NodeHostname=$host NodeAddr=127.0.0.1 Port=$d2 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host,localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
    export SLURM_CONF="$dir/slurm.conf"
    mkdir -p "$dir/spool/$host" "$dir/spool/localhost"
    slurmctld -c -f "$SLURM_CONF"
    slurmd -f "$SLURM_CONF" -N "$host"
    slurmd -f "$SLURM_CONF" -N localhost
    for _ in $(seq 100); do
        if [ "$(sinfo -h -o '%T' 2>/dev/null | grep -c idle)" -ge 1 ] \
            && [ "$(sinfo -h -N -o '%N %T' 2>/dev/null | grep -c idle)" -ge 2 ]; then
            echo "export SLURM_CONF=$SLURM_CONF"
            return 0
        fi
        sleep 0.2
    done
    echo "slurm-test-cluster: the nodes did not come up; see $dir/log" >&2
    sinfo -N >&2 || true
    exit 1
}

case "$cmd" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 install|start|stop [DIR]" >&2; exit 2 ;;
esac
