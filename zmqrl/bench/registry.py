"""Bench group names (``zmqrl bench --only NAME``) and the modules that measure them, imported on use."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zmqrl.bench.harness import Context, Row

GROUPS: dict[str, str] = {  # name -> module whose run(ctx) returns the group's rows; the suite runs them in this order
    "replay": "zmqrl.bench.replay",
    "envs": "zmqrl.bench.envs",
    "actor": "zmqrl.bench.actor",
    "transport": "zmqrl.bench.transport",
    "learner": "zmqrl.bench.learner",
    "fanin": "zmqrl.bench.fanin",
    "cnn": "zmqrl.bench.cnn",
    "broadcast": "zmqrl.bench.broadcast",
    "startup": "zmqrl.bench.startup",
    "scaling": "zmqrl.bench.scaling",
    "onpolicy": "zmqrl.bench.onpolicy",
    "scale": "zmqrl.bench.scale",
    "solve": "zmqrl.bench.solve",
    "rewards": "zmqrl.bench.rewards",
    "cheetah": "zmqrl.bench.cheetah",
}


def group(name: str) -> Callable[[Context], list[Row]]:
    """The ``run`` function of group ``name`` (KeyError for an unknown name)."""
    return importlib.import_module(GROUPS[name]).run  # type: ignore[no-any-return]
