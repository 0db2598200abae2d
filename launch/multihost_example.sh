#!/usr/bin/env bash
# One learner host and one actor host, by hand. Run the part for each machine on that machine;
# LEARNER_IP is the learner host's address as the actor host sees it. Ports come from the
# config's net section (5555 data, 5556 models, 5557 proxy, 5558 evaluations).
#
#   learner host:  launch/multihost_example.sh learner
#   actor host:    LEARNER_IP=10.0.0.1 ACTORS=4 launch/multihost_example.sh actors
set -euo pipefail
here=$(dirname "$0")
case "${1:-}" in
  learner)
    ZMQRL_BIND_HOST=0.0.0.0 ZMQRL_RUN_DIR=${ZMQRL_RUN_DIR:-runs/multihost} "$here/learner.sh" &
    ZMQRL_LEARNER=127.0.0.1 ZMQRL_RUN_DIR=${ZMQRL_RUN_DIR:-runs/multihost} "$here/evaluator.sh" &
    trap 'kill -TERM $(jobs -p) 2>/dev/null; wait' INT TERM
    wait ;;
  actors)
    : "${LEARNER_IP:?set LEARNER_IP to the learner host's address}"
    n=${ACTORS:-2}
    ZMQRL_LEARNER=$LEARNER_IP "$here/proxy.sh" &
    for ((i = 0; i < n; i++)); do
      ZMQRL_ACTOR_ID=$i ZMQRL_NUM_ACTORS=$n ZMQRL_PROXY=127.0.0.1 ZMQRL_LEARNER=$LEARNER_IP "$here/actor.sh" &
    done
    trap 'kill -TERM $(jobs -p) 2>/dev/null; wait' INT TERM
    wait ;;
  *) echo "usage: $0 learner | actors" >&2; exit 2 ;;
esac
