"""Experience replay: uniform and prioritized, over one ring, with image frames stored once.

Depends on numpy and the standard library only.
"""

from __future__ import annotations

from typing import Any

from zmqrl.replay.frames import FramePool
from zmqrl.replay.prioritized import PRIORITY_CAP, PrioritizedReplay
from zmqrl.replay.schema import Schema
from zmqrl.replay.sumtree import SumTree
from zmqrl.replay.uniform import UniformReplay

__all__ = ["PRIORITY_CAP", "FramePool", "PrioritizedReplay", "Schema", "SumTree", "UniformReplay",
           "make_replay"]


def make_replay(capacity: int, prioritized: bool = False, seed: int | None = None, frame_stack: int = 0, *,
                schema: Schema | None = None, compress: str = "none", **options: Any) -> UniformReplay:
    """A :class:`PrioritizedReplay` if ``prioritized`` (``options``: its ``alpha``, ``beta0``, ``beta_steps``,
    ``eps`` and ``priority_cap``), else a :class:`UniformReplay` (which has no use for them).

    ``frame_stack`` >= 1 stores each distinct image frame once (see ``UniformReplay``), compressed
    with ``compress`` ("lz4" or "zstd") if not "none".
    ``schema`` (key -> (dtype, per-item shape)) fixes the stored items from the start; without
    it the first batch does.
    """
    if prioritized:
        return PrioritizedReplay(capacity, seed=seed, frame_stack=frame_stack, schema=schema, compress=compress,
                                 **options)
    return UniformReplay(capacity, seed=seed, frame_stack=frame_stack, schema=schema, compress=compress)
