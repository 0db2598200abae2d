#!/usr/bin/env bash
# Every role on this machine: learner, proxy, ZMQRL_ACTORS actors (default 2) and the evaluator.
#   ZMQRL_CONFIG=configs/cartpole_dqn.yaml ZMQRL_ACTORS=2 ZMQRL_RUN_DIR=runs/x launch/local.sh [--set k=v ...]
set -euo pipefail
source "$(dirname "$0")/_zmqrl.sh"
args=(--actors "${ZMQRL_ACTORS:-2}")
[ -n "${ZMQRL_RUN_DIR:-}" ] && args+=(--run-dir "$ZMQRL_RUN_DIR")
exec "$ZMQRL" local "$ZMQRL_CONFIG" "${args[@]}" "$@"
