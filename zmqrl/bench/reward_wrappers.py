"""Env wrappers that pay a game's rewards at another scale (``env.wrappers: [..., "zmqrl.bench.reward_wrappers:
times_100"]``): the rewards bench's tasks. Imported by every role of a run that names one, so it imports
gymnasium alone."""

from __future__ import annotations

from typing import Any

import gymnasium as gym


def _scaled(env: gym.Env, factor: float) -> gym.Env:
    return gym.wrappers.TransformReward(env, lambda r: float(r) * factor)


def times_0_01(env: gym.Env, cfg: Any) -> gym.Env:
    """The game's rewards times 0.01 (evaluations see them so too)."""
    return _scaled(env, 0.01)


def times_100(env: gym.Env, cfg: Any) -> gym.Env:
    """The game's rewards times 100 (evaluations see them so too)."""
    return _scaled(env, 100.0)


# factor -> its name in env.wrappers
SCALES: dict[float, str] = {0.01: f"{__name__}:times_0_01", 100.0: f"{__name__}:times_100"}
