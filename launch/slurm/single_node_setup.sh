#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, from Debian's packages: munged, slurmctld and slurmd,
# the node being this host. For trying the sbatch scripts here and for tests/system/test_slurm.py; not
# for production. Needs root. Idempotent: daemons already running are left as they are.
#
#   sudo launch/slurm/single_node_setup.sh          # then: sinfo; sbatch launch/slurm/zmqrl.sbatch ...
#   sudo launch/slurm/single_node_setup.sh --stop   # stop the daemons it started (listed in $STARTED)
#
# Exit codes: 0 Slurm is up, 3 it cannot be set up here (not root, no apt-get, or a Slurm
# configuration this script did not write), 4 apt-get failed (no package archive reachable),
# anything else a failure (the message says which step).
set -euo pipefail

MARKER="# written by zmqrl launch/slurm/single_node_setup.sh"
CONF=/etc/slurm/slurm.conf
STATE=/var/spool/slurmctld
SPOOL=/var/spool/slurmd
LOGS=/var/log/slurm
STARTED=/run/zmqrl-slurm-started  # pid files of the daemons this script started, for --stop

unavailable() { echo "single_node_setup: $*" >&2; exit 3; }
fail() { echo "single_node_setup: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || unavailable "needs root (it installs packages and starts munged, slurmctld, slurmd)"

if [ "${1:-}" = "--stop" ]; then
    [ -f "$STARTED" ] || exit 0
    while read -r pidfile; do
        [ -s "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
    done < <(tac "$STARTED")  # the reverse of the order they started in
    rm -f "$STARTED"
    exit 0
fi
started() { echo "$1" >>"$STARTED"; }

# --- packages ---------------------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
        || ! command -v sbatch >/dev/null; then
    command -v apt-get >/dev/null || unavailable "Slurm is not installed and there is no apt-get to install it"
    echo "single_node_setup: installing slurm-wlm and munge" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || { echo "single_node_setup: apt-get update failed" >&2; exit 4; }
    apt-get install -y -qq slurm-wlm munge >/dev/null \
        || { echo "single_node_setup: apt-get install slurm-wlm munge failed" >&2; exit 4; }
fi

# --- munge: a key readable only by the munge user, the daemon running as that user -------------
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged || fail "munged did not start (see /var/log/munge/munged.log)"
    started /run/munge/munged.pid
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n | unmunge >/dev/null || fail "munge does not work after starting munged"
fi

# --- slurm.conf: this host is controller and only node --------------------------------------------
host=$(hostname -s)
if [ -e "$CONF" ] && ! grep -qF "$MARKER" "$CONF"; then
    unavailable "$CONF exists and was not written by this script; not touching an existing Slurm setup"
fi
node=$(slurmd -C | head -1)  # NodeName=HOST CPUs=.. Boards=.. SocketsPerBoard=.. ... RealMemory=..
case "$node" in NodeName=*) ;; *) fail "slurmd -C did not describe this node: $node" ;; esac
mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$node")
node=${node/RealMemory=$mem/RealMemory=$((mem * 9 / 10))}  # leave the system some memory
install -d -m 0755 /etc/slurm "$STATE" "$SPOOL" "$LOGS"
new_conf=$(cat <<EOF
$MARKER
ClusterName=zmqrl
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
DefMemPerCPU=$((mem * 9 / 10 / cpus))
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
KillWait=30
$node State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
)
if [ ! -e "$CONF" ] || [ "$(cat "$CONF")" != "$new_conf" ]; then
    printf '%s\n' "$new_conf" >"$CONF"
    changed=1
fi

# --- daemons ----------------------------------------------------------------------------------
if [ -n "${changed:-}" ] && pgrep -x slurmctld >/dev/null; then
    scontrol reconfigure || true
fi
if ! pgrep -x slurmctld >/dev/null; then
    slurmctld || fail "slurmctld did not start (see $LOGS/slurmctld.log)"
    started /run/slurmctld.pid
fi
if ! pgrep -x slurmd >/dev/null; then
    slurmd || fail "slurmd did not start (see $LOGS/slurmd.log)"
    started /run/slurmd.pid
fi

state=""
for _ in $(seq 300); do  # up to 30 s for the node to register
    state=$(sinfo -h -n "$host" -o %T 2>/dev/null | head -1 || true)
    case "$state" in
        idle*|mixed*|allocated*) echo "single_node_setup: Slurm is up; node $host is $state" >&2; exit 0 ;;
        down*|drain*|fail*) scontrol update NodeName="$host" State=RESUME 2>/dev/null || true ;;
    esac
    sleep 0.1
done
fail "node $host did not become ready within 30 s (state '${state}'; see $LOGS/slurmctld.log and $LOGS/slurmd.log)"
