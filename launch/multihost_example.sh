#!/usr/bin/env bash
# One learner machine and any number of actor machines, by hand: run the part for each machine on
# that machine. `zmqrl head` and `zmqrl host` supervise their roles (a role that dies is restarted).
# Ports come from the config's net section: hosts reach the learner on net.data_port (5555),
# net.model_port (5556) and net.snapshot_port (5559); net.eval_port (5558) stays on the learner
# machine; each host's proxy listens on its own loopback and relays models to its actors. Run directory: ZMQRL_RUN_DIR (default runs/multihost).
#
#   learner machine:   launch/multihost_example.sh head [--set key=value ...]
#   actor machine i:   LEARNER=10.0.0.1 ACTORS=4 FIRST_ID=$((4 * i)) TOTAL_ACTORS=8 launch/multihost_example.sh host
#
# TOTAL_ACTORS is the number of actors over all actor machines (actor.num_actors; default ACTORS);
# every machine's actor ids FIRST_ID..FIRST_ID+ACTORS-1 must be below it and unique.
set -euo pipefail
source "$(dirname "$0")/_zmqrl.sh"
run_dir=${ZMQRL_RUN_DIR:-runs/multihost}
part=${1:-}
[ $# -gt 0 ] && shift
case "$part" in
  head)
    exec "$ZMQRL" head "$ZMQRL_CONFIG" --run-dir "$run_dir" --bind "${ZMQRL_BIND_HOST:-0.0.0.0}" --auto-resume "$@" ;;
  host)
    learner=${LEARNER:-${LEARNER_IP:-}}
    [ -n "$learner" ] || { echo "$0 host: set LEARNER to the learner machine's name or address" >&2; exit 2; }
    n=${ACTORS:-2}
    first=${FIRST_ID:-0}
    exec "$ZMQRL" host "$ZMQRL_CONFIG" --learner "$learner" --actors "$n" --first-id "$first" --run-dir "$run_dir" \
        --set "actor.num_actors=${TOTAL_ACTORS:-$n}" "$@" ;;
  *)
    echo "usage: $0 head | host  [--set key=value ...]   (see the comments at the top)" >&2
    exit 2 ;;
esac
