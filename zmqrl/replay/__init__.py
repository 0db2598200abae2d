"""Experience replay (uniform and prioritized) and n-step transition building.

Depends on numpy and the standard library only.
"""

from __future__ import annotations

from zmqrl.replay.frames import FramePool
from zmqrl.replay.nstep import NStepBuilder
from zmqrl.replay.prioritized import PRIORITY_CAP, PrioritizedReplay
from zmqrl.replay.sumtree import SumTree
from zmqrl.replay.uniform import Schema, UniformReplay, read_stamp

__all__ = ["PRIORITY_CAP", "FramePool", "NStepBuilder", "PrioritizedReplay", "Schema", "SumTree", "UniformReplay",
           "make_replay", "read_stamp"]


def make_replay(
    capacity: int,
    prioritized: bool = False,
    alpha: float = 0.6,
    beta0: float = 0.4,
    beta_steps: int = 100_000,
    eps: float = 1e-6,
    seed: int | None = None,
    frame_stack: int = 0,
    *,
    schema: Schema | None = None,
    priority_cap: float = PRIORITY_CAP,
) -> UniformReplay:
    """Build a ``PrioritizedReplay`` if ``prioritized`` else a ``UniformReplay``.

    ``frame_stack`` >= 1 stores each distinct image frame once (see ``UniformReplay``).
    ``schema`` (key -> (dtype, per-item shape)) fixes the stored items from the start; without
    it the first batch does. ``priority_cap`` bounds raw priorities (prioritized only).
    """
    if prioritized:
        return PrioritizedReplay(capacity, alpha=alpha, beta0=beta0, beta_steps=beta_steps, eps=eps, seed=seed,
                                 frame_stack=frame_stack, schema=schema, priority_cap=priority_cap)
    return UniformReplay(capacity, seed=seed, frame_stack=frame_stack, schema=schema)
