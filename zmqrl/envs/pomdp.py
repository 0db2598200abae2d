"""Partially observed tasks for recurrent agents: classic-control envs with part of the observation hidden."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from zmqrl.config import ConfigError, EnvConfig

CARTPOLE_POSITIONS = (0, 2)  # cart position and pole angle; indices 1 and 3 are their velocities


class KeepObservation(gym.ObservationWrapper):
    """Only the entries ``keep`` of a 1-D Box observation (its bounds with them)."""

    def __init__(self, env: gym.Env, keep: Sequence[int]) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ValueError(f"KeepObservation needs a 1-D Box observation space, got {space}")
        self.keep = np.asarray(keep, dtype=np.intp)
        self.observation_space = gym.spaces.Box(space.low[self.keep], space.high[self.keep], dtype=space.dtype)

    def observation(self, observation: Any) -> np.ndarray:
        return np.asarray(observation)[self.keep]


def mask_velocity(env: gym.Env, cfg: EnvConfig) -> gym.Env:
    """CartPole without its velocities: the cart's position and the pole's angle only (RLlib's stateless
    CartPole), so a policy must infer the velocities from what it saw before: a memory task."""
    shape = env.observation_space.shape
    if "CartPole" not in cfg.id or shape != (4,):
        raise ConfigError(f"env.wrappers: mask_velocity hides CartPole's velocities (keeps observation indices 0 "
                          f"and 2); {cfg.id!r} has observations of shape {shape}")
    return KeepObservation(env, CARTPOLE_POSITIONS)
