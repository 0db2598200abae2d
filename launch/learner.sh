#!/usr/bin/env bash
# The learner. Binds the data, model and evaluation ports on ZMQRL_BIND_HOST (default: the
# config's net.bind_host; use 0.0.0.0 to accept other machines).
#   ZMQRL_CONFIG=configs/cartpole_dqn.yaml ZMQRL_RUN_DIR=runs/x ZMQRL_BIND_HOST=0.0.0.0 launch/learner.sh [--resume] [--set k=v ...]
set -euo pipefail
source "$(dirname "$0")/_zmqrl.sh"
args=()
[ -n "${ZMQRL_RUN_DIR:-}" ] && args+=(--run-dir "$ZMQRL_RUN_DIR")
[ -n "${ZMQRL_BIND_HOST:-}" ] && args+=(--set "net.bind_host=$ZMQRL_BIND_HOST")
exec "$ZMQRL" learner "$ZMQRL_CONFIG" "${args[@]}" "$@"
