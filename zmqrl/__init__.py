"""zmqrl: distributed off-policy reinforcement learning on ZeroMQ.

The Python API (:mod:`zmqrl.api`): ``load_config``, ``train``, ``run_local``, ``load_policy``,
``plot_runs`` and the errors ``ConfigError`` and ``CheckpointError``. Each loads on first use,
so ``import zmqrl`` imports neither torch nor gymnasium.

``zmqrl.train`` is also the module of the single-process trainer: the package makes that module
callable, so ``zmqrl.train(cfg, run_dir=...)`` runs :func:`zmqrl.api.train` while
``from zmqrl.train import train`` and ``zmqrl.train.train`` keep working.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__version__ = "0.1.0"

_LAZY = {  # attribute -> the module that defines it
    "load_config": "zmqrl.api",
    "run_local": "zmqrl.api",
    "load_policy": "zmqrl.api",
    "TrainedPolicy": "zmqrl.enjoy",
    "plot_runs": "zmqrl.plot",
    "Config": "zmqrl.config",
    "ConfigError": "zmqrl.config",
    "CheckpointError": "zmqrl.checkpoint",
}
__all__ = ["__version__", "train", *_LAZY]


class _TrainModule(types.ModuleType):
    """The trainer module, callable as :func:`zmqrl.api.train`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from zmqrl.api import train

        return train(*args, **kwargs)


class _Package(types.ModuleType):
    """The ``zmqrl`` package: binding its ``train`` submodule makes that module callable."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "train" and type(value) is types.ModuleType:
            value.__class__ = _TrainModule
        super().__setattr__(name, value)


def __getattr__(name: str) -> Any:
    if name == "train":
        return importlib.import_module("zmqrl.train")  # bound (and made callable) by the import itself
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'zmqrl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


sys.modules[__name__].__class__ = _Package
