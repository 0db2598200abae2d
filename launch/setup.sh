#!/usr/bin/env bash
# Set up zmqrl in ./.venv: torch 2.13.0 first (only when torch is missing, so pip never picks a
# multi-GB build on its own), then zmqrl itself with every extra the shipped configs need (Atari,
# MuJoCo, video) and the test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[all,dev]"
echo "zmqrl is set up in .venv (activate with: source .venv/bin/activate)" >&2
