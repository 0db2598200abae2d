"""Learning algorithms behind one seam (see :mod:`zmqrl.agents.base`), reached by name.

Each algorithm is a folder ``zmqrl/agents/<algo>/`` whose ``__init__`` defines ``ALGORITHM``
without importing torch, so a process that only acts with a numpy policy never loads torch.
Adding an algorithm: its folder, one line in :data:`ALGORITHMS`, and its configs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zmqrl.agents.base import Algorithm

ALGORITHMS: dict[str, str] = {  # agent.algo -> the module that defines ALGORITHM
    "dqn": "zmqrl.agents.dqn",
    "sac": "zmqrl.agents.sac",
    "iqn": "zmqrl.agents.iqn",
}


def algorithm(name: str) -> Algorithm:
    """The registered algorithm called ``name``; an unknown name is a :class:`ConfigError`."""
    if name not in ALGORITHMS:
        from zmqrl.config import ConfigError

        raise ConfigError(f"agent.algo: unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    return importlib.import_module(ALGORITHMS[name]).ALGORITHM  # type: ignore[no-any-return]


__all__ = ["ALGORITHMS", "algorithm"]
