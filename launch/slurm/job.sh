#!/usr/bin/env bash
# The body of the zmqrl Slurm jobs (zmqrl.sbatch, zmqrl_het.sbatch exec it): `zmqrl head` as one step
# on the learner's node and `zmqrl host` as one step on every actor node, then wait.
#
#   job.sh CONFIG [--set key=value ...]     (inside an allocation; the sbatch scripts pass their arguments)
#
# Nodes: in a heterogeneous job, component 0 is the learner's node and component 1 the actor
# nodes; otherwise the first node is the learner's and the others are actor nodes (a one-node
# allocation runs both there). The learner binds every interface; hosts reach it by its node name
# (ZMQRL_LEARNER_HOST overrides, e.g. an InfiniBand interface's name).
#
# Environment: ZMQRL_RUN_DIR (on a filesystem every node shares; default
# $SLURM_SUBMIT_DIR/runs/zmqrl-$SLURM_JOB_ID, the same after a requeue), ZMQRL_ACTORS_PER_HOST
# (default: the host step's CPUs less one, for the proxy), ZMQRL (the zmqrl command; default
# $ZMQRL_HOME/.venv/bin/zmqrl, else zmqrl on PATH), ZMQRL_HOME (the zmqrl checkout; default the
# directory sbatch was run in).
#
# Stopping: when the head's step ends (training done, or it failed), the host steps are told to
# stop. On USR1 (sent by --signal=B:USR1@SECONDS before the time limit) every step is told to stop
# (the learner saves checkpoints/latest), then the job requeues itself; started again, the head
# resumes from that checkpoint (--auto-resume). scancel signals every step itself: this script only
# waits for them. USR1 rather than TERM, because scancel sends TERM to this shell too.
set -uo pipefail

log() { echo "zmqrl job $SLURM_JOB_ID: $*" >&2; }
[ -n "${SLURM_JOB_ID:-}" ] || { echo "job.sh: run it inside a Slurm job (sbatch launch/slurm/zmqrl.sbatch ...)" >&2; exit 2; }
config=${1:?usage: sbatch [options] launch/slurm/zmqrl.sbatch CONFIG [--set key=value ...]}
shift

home=${ZMQRL_HOME:-${SLURM_SUBMIT_DIR:-.}}
if [ -z "${ZMQRL:-}" ]; then
    if [ -x "$home/.venv/bin/zmqrl" ]; then ZMQRL=$home/.venv/bin/zmqrl; else ZMQRL=zmqrl; fi
fi
run_dir=${ZMQRL_RUN_DIR:-${SLURM_SUBMIT_DIR:-.}/runs/zmqrl-$SLURM_JOB_ID}

if [ -n "${SLURM_HET_SIZE:-}" ]; then
    mapfile -t head_nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_0")
    mapfile -t actor_nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_1")
    head_group=(--het-group=0)
    host_group=(--het-group=1)
    head_cpus=${SLURM_CPUS_PER_TASK_HET_GROUP_0:-1}
else
    mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
    head_nodes=("${nodes[0]}")
    actor_nodes=("${nodes[@]:1}")
    head_group=()
    host_group=()
    head_cpus=${SLURM_CPUS_ON_NODE:-1}
fi
head_node=${head_nodes[0]}
shared=""
if [ ${#actor_nodes[@]} -eq 0 ]; then  # one node: the head and one host share it
    actor_nodes=("$head_node")
    shared=1
fi
node_cpus=${SLURM_CPUS_ON_NODE:-2}
host_cpus=$node_cpus
if [ -n "$shared" ]; then
    head_cpus=1
    host_cpus=$(( node_cpus > 1 ? node_cpus - 1 : 1 ))
fi
per_host=${ZMQRL_ACTORS_PER_HOST:-$(( host_cpus > 1 ? host_cpus - 1 : 1 ))}  # a CPU for the proxy
total=$(( per_host * ${#actor_nodes[@]} ))
learner=${ZMQRL_LEARNER_HOST:-$head_node}
sets=(--set "actor.num_actors=$total" "$@")

mkdir -p "$run_dir"
log "run directory $run_dir; head on $head_node; ${#actor_nodes[@]} host(s) with $per_host actor(s) each" \
    "(restart ${SLURM_RESTART_COUNT:-0})"

requeue=""
stopping=""  # every step has been signalled already: never twice (a second TERM means "stop now" to zmqrl)
stop_steps() {
    [ -n "$stopping" ] && return
    stopping=1
    scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null  # every step's processes, not this shell
}
on_time_limit() {
    log "time limit near: stopping every step, then requeueing"
    requeue=1
    stop_steps
}
on_cancel() {
    log "cancelled: waiting for the steps to stop"
    stopping=1  # scancel has signalled every step itself
}
trap on_time_limit USR1
trap on_cancel TERM INT

# wait_pid PID: wait for it to exit (a trapped signal interrupts wait; wait again), return its status.
wait_pid() {
    local rc
    while true; do
        wait "$1"
        rc=$?
        kill -0 "$1" 2>/dev/null || return "$rc"
    done
}

srun --exact --nodes=1 --ntasks=1 --cpus-per-task="$head_cpus" "${head_group[@]}" --nodelist="$head_node" \
    --job-name=zmqrl-head --kill-on-bad-exit=0 \
    "$ZMQRL" head "$config" --run-dir "$run_dir" --bind 0.0.0.0 --auto-resume "${sets[@]}" &
head_pid=$!
host_pids=()
for i in "${!actor_nodes[@]}"; do
    node=${actor_nodes[$i]}
    srun --exact --nodes=1 --ntasks=1 --cpus-per-task="$host_cpus" "${host_group[@]}" --nodelist="$node" \
        --job-name="zmqrl-host-$i" --kill-on-bad-exit=0 \
        "$ZMQRL" host "$config" --learner "$learner" --actors "$per_host" --first-id $(( i * per_host )) \
        --run-dir "$run_dir" --name "$node-$i" "${sets[@]}" &
    host_pids+=($!)
done

wait_pid "$head_pid"
head_rc=$?
log "head step ended with code $head_rc; stopping the host steps"
stop_steps
for pid in "${host_pids[@]}"; do wait_pid "$pid"; done
if [ -n "$requeue" ]; then
    log "requeueing; the head resumes from $run_dir/checkpoints/latest when the job starts again"
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$head_rc"
