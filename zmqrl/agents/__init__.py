"""Learning agents (torch, plus a numpy acting path; nothing here knows about sockets).

Imports are lazy so that a process which only acts with the numpy policy never loads torch.
"""

from __future__ import annotations

from typing import Any

from zmqrl.agents.policy import make_policy

__all__ = ["DQNAgent", "DQNPolicy", "NumpyMLPPolicy", "make_agent", "make_policy", "resolve_device"]

_LAZY = {"DQNAgent": "zmqrl.agents.dqn", "DQNPolicy": "zmqrl.agents.dqn", "make_agent": "zmqrl.agents.dqn",
         "resolve_device": "zmqrl.agents.dqn", "NumpyMLPPolicy": "zmqrl.agents.numpy_policy"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'zmqrl.agents' has no attribute {name!r}")
