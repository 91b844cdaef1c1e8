#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, so that tests can submit submit.sh for real.
#
#   sudo tools/slurm_test_cluster.sh start    # start munged, slurmctld and slurmd (does nothing if up)
#   sudo tools/slurm_test_cluster.sh status   # sinfo against the test cluster
#   sudo tools/slurm_test_cluster.sh stop     # stop slurmctld and slurmd (munged is left running)
#   SLURM_CONF=/tmp/slurm-test-cluster/slurm.conf sinfo    # talk to it yourself
#
# Needs root and Debian's packages:  apt-get install -y slurm-wlm munge
# No systemd: the daemons are started directly. The configuration, state and logs live in
# $SLURM_TEST_DIR (default /tmp/slurm-test-cluster), never in the repository and never in
# /etc/slurm, so a real SLURM set-up on this machine is left alone. tests/test_launch.py finds
# the cluster through the same variable.
set -euo pipefail

dir=${SLURM_TEST_DIR:-/tmp/slurm-test-cluster}
conf=$dir/slurm.conf
export SLURM_CONF=$conf  # read by slurmctld, slurmd and every client command below

die() { echo "slurm_test_cluster: $*" >&2; exit 1; }

responding() {  # the controller answers and our node is usable
    local state
    state=$(timeout 10 sinfo --noheader --format=%t 2>/dev/null | head -n 1) || return 1
    [[ $state == idle* || $state == mix* || $state == alloc* ]]
}

start_munge() {
    # One munged per machine, on the standard socket, so reuse one that is already running.
    if timeout 5 munge -n </dev/null 2>/dev/null | timeout 5 unmunge >/dev/null 2>&1; then
        return
    fi
    if [[ ! -s /etc/munge/munge.key ]]; then
        # the munge package normally creates the key; make one if it did not
        install -d -o munge -g munge -m 0700 /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    fi
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
    runuser -u munge -- munged || die "munged did not start: see /var/log/munge/munged.log"
    for _ in $(seq 50); do
        if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
        sleep 0.1
    done
    die "munged started but does not answer: see /var/log/munge/munged.log"
}

write_conf() {
    local host node
    host=$(hostname -s)
    # slurmd describes this machine exactly (CPUs, sockets, memory); a node line that
    # claimed more than the machine has would leave the node drained.
    node=$(slurmd -C | head -n 1)
    [[ $node == NodeName=* ]] || die "slurmd -C did not describe this machine: $node"
    mkdir -p "$dir/state" "$dir/spool"
    # Every job runs as the submitting user (root in CI), with no cgroups, accounting or GPUs:
    # enough to run submit.sh on the CPUs of one node, nothing more.
    cat >"$conf.new" <<EOF
# Written by tools/slurm_test_cluster.sh: a one-node test cluster. Not for production.
ClusterName=testcluster
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
# keep finished jobs visible to scontrol for 10 minutes (tests read their state)
MinJobAge=600
$node
PartitionName=debug Nodes=$host Default=YES MaxTime=60 State=UP
EOF
    mv "$conf.new" "$conf"
}

start() {
    [[ $(id -u) == 0 ]] || die "run as root (sudo): slurmd starts jobs as other users and needs it"
    for tool in munged slurmctld slurmd sinfo sbatch; do
        command -v "$tool" >/dev/null ||
            die "$tool not found: install SLURM and munge first:  apt-get install -y slurm-wlm munge"
    done
    if [[ -f $conf ]] && responding; then
        echo "slurm_test_cluster: already running (SLURM_CONF=$conf)"
        return
    fi
    start_munge
    stop_daemons  # leftovers of an earlier run that no longer answer
    write_conf
    # -c: start from a clean state. Nothing in a test cluster is worth keeping, and a node
    # left drained or down by an earlier run would otherwise stay so.
    slurmctld -c || die "slurmctld did not start: see $dir/slurmctld.log"
    slurmd || die "slurmd did not start: see $dir/slurmd.log"
    for _ in $(seq 60); do
        if responding; then
            echo "slurm_test_cluster: running (SLURM_CONF=$conf)"
            return
        fi
        sleep 0.5
    done
    die "the daemons started but the node is not idle after 30 s: see $dir/slurmctld.log and $dir/slurmd.log"
}

stop_daemons() {
    local name pid
    for name in slurmd slurmctld; do
        [[ -f $dir/$name.pid ]] || continue
        pid=$(cat "$dir/$name.pid")
        # only a process that really is this daemon: the pid may have been reused since
        if [[ $pid =~ ^[0-9]+$ ]] && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$name" ]]; then
            kill "$pid"
            for _ in $(seq 50); do
                [[ -d /proc/$pid ]] || break
                sleep 0.1
            done
        fi
        rm -f "$dir/$name.pid"
    done
}

case ${1:-start} in
    start) start ;;
    stop) stop_daemons; echo "slurm_test_cluster: stopped" ;;
    status) sinfo ;;
    *) die "usage: $0 [start|stop|status]" ;;
esac
