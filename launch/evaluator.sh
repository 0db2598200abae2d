#!/usr/bin/env bash
# The evaluator: greedy episodes on new model versions from ZMQRL_LEARNER; keeps the best model
# in ZMQRL_RUN_DIR/checkpoints/best.
#   ZMQRL_LEARNER=10.0.0.1 ZMQRL_RUN_DIR=runs/x launch/evaluator.sh
set -euo pipefail
source "$(dirname "$0")/_zmqrl.sh"
args=()
[ -n "${ZMQRL_LEARNER:-}" ] && args+=(--learner "$ZMQRL_LEARNER")
[ -n "${ZMQRL_RUN_DIR:-}" ] && args+=(--run-dir "$ZMQRL_RUN_DIR")
exec "$ZMQRL" evaluator "$ZMQRL_CONFIG" "${args[@]}" "$@"
