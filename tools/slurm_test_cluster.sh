#!/usr/bin/env bash
# A two-node SLURM cluster on this one machine (two slurmd, one controller), so that tests can
# submit submit.sh for real, on one node and on two.
#
#   sudo tools/slurm_test_cluster.sh start    # start munged, slurmctld and two slurmd (does nothing if up);
#                                             # up within 30 s, or it stops and says which daemon failed
#   sudo tools/slurm_test_cluster.sh status   # sinfo against the test cluster
#   sudo tools/slurm_test_cluster.sh stop     # stop slurmctld and slurmd (munged is left running)
#   SLURM_CONF=/tmp/slurm-test-cluster/slurm.conf sinfo    # talk to it yourself
#
# Needs root and Debian's packages:  apt-get install -y slurm-wlm munge
# No systemd: the daemons are started directly. The configuration, state and logs live in
# $SLURM_TEST_DIR (default /tmp/slurm-test-cluster), never in the repository and never in
# /etc/slurm, and the daemons listen on their own ports ($SLURM_TEST_PORT, default 16817 for
# slurmctld and the two after it for the slurmd, not SLURM's 6817-6818), so a real SLURM set-up
# on this machine is left alone. tests/test_launch.py finds the cluster through the same variable.
set -euo pipefail

dir=${SLURM_TEST_DIR:-/tmp/slurm-test-cluster}
conf=$dir/slurm.conf
port_base=${SLURM_TEST_PORT:-16817}  # slurmctld; the slurmd take the next two
start_seconds=30  # the stated limit: the cluster answers by then, or start fails
export SLURM_CONF=$conf  # read by slurmctld, slurmd and every client command below

die() { echo "slurm_test_cluster: $*" >&2; exit 1; }

# The two nodes' names. Both must resolve to this machine, because submit.sh gives the first
# node's name to torchrun as the rendezvous address: this machine's own name, and localhost.
nodes() { echo "$(hostname -s) localhost"; }

responding() {  # the controller answers and both nodes are usable
    local states name
    states=$(timeout 5 sinfo --noheader --Node --format="%N %t" 2>/dev/null) || return 1
    for name in $(nodes); do
        grep -qE "^$name (idle|mix|alloc)" <<<"$states" || return 1
    done
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
    local host cpus memory name port=$((port_base + 1))
    host=$(hostname -s)
    [[ $host != localhost ]] || die "this machine is called localhost, the name the second node needs"
    getent hosts "$host" >/dev/null || die "$host does not resolve: add it to /etc/hosts"
    # Half the machine's memory for each node, and half its cores but at least two: never more
    # than the machine has (a node that claims more than its hardware is drained), and enough
    # for two tasks on one node (srun's one task per GPU, tests/test_launchers.py). On a
    # 2-core machine both nodes claim both cores, so jobs on the two nodes share them.
    cpus=$(nproc)
    cpus=$((cpus >= 4 ? cpus / 2 : cpus))
    memory=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
    memory=$((${memory:-2048} / 2))
    mkdir -p "$dir/state"
    # Jobs run as the submitting user (root in CI), with no cgroups, accounting or GPUs.
    # Two slurmd on one machine (Debian builds SLURM with MULTIPLE_SLURMD) differ in their
    # port; %n in a path is the node's name.
    {
        cat <<EOF
# Written by tools/slurm_test_cluster.sh: a two-node test cluster on one machine. Not for production.
ClusterName=testcluster
SlurmctldHost=$host
SlurmctldPort=$port_base
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
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
EOF
        for name in $(nodes); do
            echo "NodeName=$name NodeHostname=$host NodeAddr=127.0.0.1 Port=$port CPUs=$cpus RealMemory=$memory"
            port=$((port + 1))
        done
        echo "PartitionName=debug Nodes=$(nodes | tr ' ' ',') Default=YES MaxTime=60 State=UP"
    } >"$conf.new"
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
    started=$SECONDS
    slurmctld -c || die "slurmctld did not start: see $dir/slurmctld.log"
    for name in $(nodes); do
        slurmd -N "$name" || die "slurmd for node $name did not start: see $dir/slurmd-$name.log"
    done
    local deadline=$((SECONDS + start_seconds))
    while ((SECONDS < deadline)); do
        check_alive
        if responding; then
            echo "slurm_test_cluster: running, nodes $(nodes) (SLURM_CONF=$conf)"
            return
        fi
        sleep 0.5
    done
    die "the daemons run but the nodes are not idle after $start_seconds s: see $dir/slurmctld.log and $dir/slurmd-*.log"
}

# Stop at once when a daemon has died (a port in use, a bad configuration), rather than ask a
# controller that is not there until the time is up. A daemon's pid file appears once it has
# detached: a missing one is a death only after a few seconds.
check_alive() {
    local name what pidfile pid log
    for name in slurmctld $(nodes); do
        what="slurmctld" pidfile=$dir/slurmctld.pid log=$dir/slurmctld.log
        if [[ $name != slurmctld ]]; then
            what="the slurmd of node $name" pidfile=$dir/slurmd-$name.pid log=$dir/slurmd-$name.log
        fi
        pid=$(cat "$pidfile" 2>/dev/null || true)
        if [[ $pid =~ ^[0-9]+$ ]] && [[ -d /proc/$pid ]]; then
            continue
        fi
        if [[ -n $pid ]] || ((SECONDS > started + 5)); then
            echo "slurm_test_cluster: $what is not running; the end of $log:" >&2
            tail -n 5 "$log" >&2 2>/dev/null || echo "  (no log)" >&2
            die "start failed: a daemon died (ports $port_base-$((port_base + 2)) in use? set SLURM_TEST_PORT)"
        fi
    done
}

stop_daemons() {
    local pidfile pid daemon
    for pidfile in "$dir"/slurmd-*.pid "$dir"/slurmd.pid "$dir"/slurmctld.pid; do
        [[ -f $pidfile ]] || continue
        pid=$(cat "$pidfile")
        daemon=$(basename "$pidfile" .pid)
        daemon=${daemon%%-*}  # slurmd-<node> -> slurmd
        # only a process that really is this daemon: the pid may have been reused since
        if [[ $pid =~ ^[0-9]+$ ]] && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$daemon" ]]; then
            kill "$pid"
            for _ in $(seq 50); do
                [[ -d /proc/$pid ]] || break
                sleep 0.1
            done
        fi
        rm -f "$pidfile"
    done
}

case ${1:-start} in
    start) start ;;
    stop) stop_daemons; echo "slurm_test_cluster: stopped" ;;
    status) sinfo ;;
    *) die "usage: $0 [start|stop|status]" ;;
esac
