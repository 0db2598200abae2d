"""The mask_velocity wrapper: CartPole's positions without their velocities, for training and evaluation."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from zmqrl.config import ConfigError, EnvConfig
from zmqrl.envs.factory import make_env, make_vector_env


@pytest.mark.parametrize("training", [True, False])
def test_mask_velocity_keeps_cart_position_and_pole_angle(training: bool) -> None:
    full = make_env(EnvConfig(id="CartPole-v1"), training=training)
    masked = make_env(EnvConfig(id="CartPole-v1", wrappers=["mask_velocity"]), training=training)
    space, whole = masked.observation_space, full.observation_space
    assert isinstance(space, gym.spaces.Box) and isinstance(whole, gym.spaces.Box) and space.shape == (2,)
    np.testing.assert_array_equal(space.low, whole.low[[0, 2]])
    np.testing.assert_array_equal(space.high, whole.high[[0, 2]])
    seen, _ = full.reset(seed=3)
    kept, _ = masked.reset(seed=3)
    np.testing.assert_array_equal(kept, seen[[0, 2]])
    for action in [0, 1, 1, 0, 1]:
        seen = full.step(action)[0]
        kept = masked.step(action)[0]
        np.testing.assert_array_equal(kept, seen[[0, 2]])
        assert masked.observation_space.contains(kept)
    assert np.abs(seen[[1, 3]]).max() > 0  # the velocities it hides are not trivially zero


def test_mask_velocity_in_a_vector_env_and_only_for_cartpole() -> None:
    vec = make_vector_env(EnvConfig(id="CartPole-v1", wrappers=["mask_velocity"]), 3, seed=0)
    obs, _ = vec.reset(seed=[0, 1, 2])
    assert obs.shape == (3, 2) and obs.dtype == np.float32
    with pytest.raises(ConfigError, match=r"env\.wrappers: mask_velocity"):
        make_env(EnvConfig(id="Pendulum-v1", wrappers=["mask_velocity"]))
