"""The algorithms by name: ``agent.algo`` -> the module that defines its ``ALGORITHM``.

A leaf (it imports nothing of zmqrl), so the config schema can look an algorithm's ``agent:``
section up here while every algorithm imports the schema; :func:`zmqrl.agents.base.algorithm`
gives the algorithm itself. An algorithm's ``__init__`` defines ``ALGORITHM`` without importing
torch, so a process that only acts with a numpy policy never loads torch. Adding an algorithm:
its folder ``zmqrl/agents/<algo>/``, one line here, its configs.
"""

from __future__ import annotations

import importlib
from typing import Any

ALGORITHMS: dict[str, str] = {  # agent.algo -> the module that defines ALGORITHM
    "dqn": "zmqrl.agents.dqn",
    "sac": "zmqrl.agents.sac",
    "iqn": "zmqrl.agents.iqn",
    "r2d2": "zmqrl.agents.r2d2",
}


class UnknownAlgorithm(ValueError):
    """``agent.algo`` names no registered algorithm (the config's checks report it as a ConfigError)."""


def entry(name: str) -> Any:
    """The ``ALGORITHM`` object registered as ``name`` (an :class:`~zmqrl.agents.base.Algorithm`)."""
    if name not in ALGORITHMS:
        raise UnknownAlgorithm(f"agent.algo: unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    return importlib.import_module(ALGORITHMS[name]).ALGORITHM


def config_class(name: str) -> type:
    """The ``agent:`` dataclass of the algorithm registered as ``name``."""
    return entry(name).config_class  # type: ignore[no-any-return]
