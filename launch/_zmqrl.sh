# Sourced by the role scripts: find the zmqrl command and the default config.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -x "$here/.venv/bin/zmqrl" ]; then
    ZMQRL=${ZMQRL:-$here/.venv/bin/zmqrl}
else
    ZMQRL=${ZMQRL:-zmqrl}
fi
ZMQRL_CONFIG=${ZMQRL_CONFIG:-$here/configs/cartpole_dqn.yaml}
