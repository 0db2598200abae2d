"""zmqrl: distributed off-policy reinforcement learning on ZeroMQ.

The Python API (:mod:`zmqrl.tools.api`): ``load_config``, ``run_train``, ``run_local``, ``load_policy``,
``save_callable``, ``plot_runs`` and the errors ``ConfigError`` and ``CheckpointError``. Each loads on first use,
so ``import zmqrl`` imports neither torch nor gymnasium.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {  # attribute -> the module that defines it
    "load_config": "zmqrl.tools.api",
    "run_train": "zmqrl.tools.api",
    "run_local": "zmqrl.tools.api",
    "load_policy": "zmqrl.tools.api",
    "save_callable": "zmqrl.tools.api",
    "TrainedPolicy": "zmqrl.tools.enjoy",
    "plot_runs": "zmqrl.tools.plot",
    "Config": "zmqrl.config",
    "ConfigError": "zmqrl.config",
    "CheckpointError": "zmqrl.run.checkpoint",
}
__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'zmqrl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
