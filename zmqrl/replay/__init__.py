"""Experience replay (uniform and prioritized) and n-step transition building.

Depends on numpy and the standard library only.
"""

from __future__ import annotations

from zmqrl.replay.frames import FramePool
from zmqrl.replay.nstep import NStepBuilder
from zmqrl.replay.prioritized import PrioritizedReplay
from zmqrl.replay.sumtree import SumTree
from zmqrl.replay.uniform import UniformReplay

__all__ = ["FramePool", "NStepBuilder", "PrioritizedReplay", "SumTree", "UniformReplay", "make_replay"]


def make_replay(
    capacity: int,
    prioritized: bool = False,
    alpha: float = 0.6,
    beta0: float = 0.4,
    beta_steps: int = 100_000,
    eps: float = 1e-6,
    seed: int | None = None,
    frame_stack: int = 0,
) -> UniformReplay:
    """Build a ``PrioritizedReplay`` if ``prioritized`` else a ``UniformReplay``.

    ``frame_stack`` >= 1 stores each distinct image frame once (see ``UniformReplay``).
    """
    if prioritized:
        return PrioritizedReplay(capacity, alpha=alpha, beta0=beta0, beta_steps=beta_steps, eps=eps, seed=seed,
                                 frame_stack=frame_stack)
    return UniformReplay(capacity, seed=seed, frame_stack=frame_stack)
