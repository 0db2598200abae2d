#!/usr/bin/env bash
# The GPU sprint, one command for a host with one GPU and N cores: the CUDA tests (tests/agents/test_graphs.py
# and tests/replay/test_device_replay.py -k test_cuda_), the cnn bench rows on CUDA (eager and CUDA-graph
# updates, replay on the GPU against host replay), then
# Pong (configs/pong_dqn_gpu.yaml) through `zmqrl local` with N-2 actors and the learner on the GPU,
# all inside --budget-s (default 540 s, so the whole command fits 9 minutes). Writes report.txt,
# sprint.json, summary.json, config.yaml, curve.png, tests_cuda.log and bench_cnn.json into OUTDIR
# (the run in OUTDIR/run).
#   launch/gpu_sprint.sh OUTDIR [--budget-s 540] [--train-s S] [--actors N] [--config FILE] [--tests none] [--set KEY=VALUE ...]
# Without .venv (a host with torch already installed): PYTHON=python3 launch/gpu_sprint.sh OUTDIR
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 OUTDIR [zmqrl sprint flags]" >&2; exit 2; }
source "$(dirname "$0")/_zmqrl.sh"
if [ -n "${PYTHON:-}" ] || ! command -v "$ZMQRL" >/dev/null; then
    export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
    exec "${PYTHON:-python3}" -m zmqrl.cli sprint "$@"
fi
exec "$ZMQRL" sprint "$@"
