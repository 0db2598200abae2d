#!/usr/bin/env bash
# A proxy for this host's actors, forwarding to the learner at ZMQRL_LEARNER (HOST, HOST:PORT or tcp://HOST:PORT).
#   ZMQRL_LEARNER=10.0.0.1 ZMQRL_PROXY_BIND=tcp://127.0.0.1:5557 launch/proxy.sh [--set k=v ...]
set -euo pipefail
source "$(dirname "$0")/_zmqrl.sh"
args=()
[ -n "${ZMQRL_LEARNER:-}" ] && args+=(--learner "$ZMQRL_LEARNER")
[ -n "${ZMQRL_PROXY_BIND:-}" ] && args+=(--bind "$ZMQRL_PROXY_BIND")
[ -n "${ZMQRL_RUN_DIR:-}" ] && args+=(--run-dir "$ZMQRL_RUN_DIR")
exec "$ZMQRL" proxy "$ZMQRL_CONFIG" "${args[@]}" "$@"
