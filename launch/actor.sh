#!/usr/bin/env bash
# One actor. ZMQRL_ACTOR_ID picks its seed and exploration rate (of ZMQRL_NUM_ACTORS in all);
# batches go to ZMQRL_PROXY, models come from ZMQRL_LEARNER.
#   ZMQRL_ACTOR_ID=0 ZMQRL_NUM_ACTORS=4 ZMQRL_PROXY=127.0.0.1 ZMQRL_LEARNER=10.0.0.1 launch/actor.sh
set -euo pipefail
source "$(dirname "$0")/_zmqrl.sh"
args=(--id "${ZMQRL_ACTOR_ID:-0}")
[ -n "${ZMQRL_NUM_ACTORS:-}" ] && args+=(--set "actor.num_actors=$ZMQRL_NUM_ACTORS")
[ -n "${ZMQRL_PROXY:-}" ] && args+=(--proxy "$ZMQRL_PROXY")
[ -n "${ZMQRL_LEARNER:-}" ] && args+=(--learner "$ZMQRL_LEARNER")
[ -n "${ZMQRL_RUN_DIR:-}" ] && args+=(--run-dir "$ZMQRL_RUN_DIR")
exec "$ZMQRL" actor "$ZMQRL_CONFIG" "${args[@]}" "$@"
