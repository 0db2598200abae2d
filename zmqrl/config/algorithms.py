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

ALGORITHMS: dict[str, str] = {  # agent.algo -> the module that defines ALGORITHM (or module:NAME, another name)
    "dqn": "zmqrl.agents.dqn",
    "sac": "zmqrl.agents.sac",
    "iqn": "zmqrl.agents.iqn",
    "r2d2": "zmqrl.agents.r2d2",
    "impala": "zmqrl.agents.impala",
    "appo": "zmqrl.agents.impala:APPO_ALGORITHM",
}


class UnknownAlgorithm(ValueError):
    """``agent.algo`` names no registered algorithm (the config's checks report it as a ConfigError)."""


def entry(name: str) -> Any:
    """The ``ALGORITHM`` object registered as ``name`` (an :class:`~zmqrl.agents.base.Algorithm`); an entry
    ``module:NAME`` names another object of the module (two algorithms of one folder: IMPALA and APPO)."""
    if name not in ALGORITHMS:
        raise UnknownAlgorithm(f"agent.algo: unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    module, _, attribute = ALGORITHMS[name].partition(":")
    return getattr(importlib.import_module(module), attribute or "ALGORITHM")


def config_class(name: str) -> type:
    """The ``agent:`` dataclass of the algorithm registered as ``name``."""
    return entry(name).config_class  # type: ignore[no-any-return]
