"""Tests for the env factory, the vector stepper (episode boundaries) and the greedy evaluator."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from zmqrl.config import ConfigError, EnvConfig
from zmqrl.envs import GreedyEvaluator, VectorStepper, make_env, make_vector_env, spaces


def angle_policy(obs: np.ndarray) -> np.ndarray:
    """A deterministic, mediocre CartPole controller: push towards the side the pole leans to."""
    return (obs[:, 2] > 0).astype(np.int64)


def single_episode_return(cfg: EnvConfig, seed: int) -> float:
    env = make_env(cfg)
    obs, _ = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(int(angle_policy(obs[None])[0]))
        total += float(reward)
        done = terminated or truncated
    env.close()
    return total


# ---------------------------------------------------------------- make_env


def test_make_env_passes_kwargs_and_max_episode_steps() -> None:
    env = make_env(EnvConfig(id="Pendulum-v1", kwargs={"g": 3.5}, max_episode_steps=7))
    try:
        assert env.unwrapped.g == 3.5  # type: ignore[attr-defined]
        assert env.spec is not None and env.spec.max_episode_steps == 7
        env.reset(seed=0)
        truncated = [env.step(env.action_space.sample())[3] for _ in range(7)]
        assert truncated == [False] * 6 + [True]
    finally:
        env.close()


def test_make_env_applies_wrappers_in_order() -> None:
    cfg = EnvConfig(id="CartPole-v1", wrappers=["float32_obs", "frame_stack"], frame_stack=3)
    env = make_env(cfg)
    try:
        obs, _ = env.reset(seed=0)
        assert obs.shape == (3, 4) and obs.dtype == np.float32
        assert env.observation_space.shape == (3, 4)
    finally:
        env.close()


def test_clip_reward_wrapper_takes_the_sign() -> None:
    env = make_env(EnvConfig(id="Pendulum-v1", wrappers=["clip_reward"]))
    try:
        env.reset(seed=0)
        rewards = {env.step(np.array([2.0], dtype=np.float32))[1] for _ in range(20)}
        assert rewards <= {-1.0, 0.0, 1.0} and -1.0 in rewards
    finally:
        env.close()


def test_wrapper_by_module_path() -> None:
    env = make_env(EnvConfig(id="CartPole-v1", wrappers=["zmqrl.envs:_frame_stack"], frame_stack=2))
    try:
        assert env.observation_space.shape == (2, 4)
    finally:
        env.close()


def test_unknown_wrapper_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="env.wrappers: unknown wrapper 'nope'"):
        make_env(EnvConfig(wrappers=["nope"]))
    with pytest.raises(ConfigError, match="env.wrappers: cannot load 'no_such_module_xyz:f'"):
        make_env(EnvConfig(wrappers=["no_such_module_xyz:f"]))


def test_unknown_env_id_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="env.id: cannot make 'NoSuchEnv-v0'"):
        make_env(EnvConfig(id="NoSuchEnv-v0"))


def test_spaces() -> None:
    obs_space, act_space = spaces(EnvConfig(id="CartPole-v1"))
    assert isinstance(obs_space, gym.spaces.Box) and obs_space.shape == (4,)
    assert isinstance(act_space, gym.spaces.Discrete) and act_space.n == 2


# ---------------------------------------------------------------- VectorStepper


def test_vector_stepper_matches_independent_envs_across_episode_ends() -> None:
    """next_obs is the final observation at an episode end; stepper.obs is the reset one."""
    cfg, num_envs, seed = EnvConfig(id="CartPole-v1"), 3, 10
    stepper = VectorStepper(make_vector_env(cfg, num_envs, seed), seed)
    singles = [make_env(cfg) for _ in range(num_envs)]
    current = [env.reset(seed=seed + i)[0] for i, env in enumerate(singles)]
    returns = [0.0] * num_envs
    lengths = [0] * num_envs
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(200):
        action = rng.integers(2, size=num_envs)
        step = stepper.step(action)
        expected_returns, expected_lengths = [], []
        for i, env in enumerate(singles):
            np.testing.assert_array_equal(step.obs[i], current[i])
            obs, reward, terminated, truncated, _ = env.step(int(action[i]))
            returns[i] += float(reward)
            lengths[i] += 1
            assert step.reward[i] == reward
            assert bool(step.terminated[i]) == terminated and bool(step.truncated[i]) == truncated
            np.testing.assert_array_equal(step.next_obs[i], obs)  # the final one at an episode end
            if terminated or truncated:
                ends += 1
                expected_returns.append(returns[i])
                expected_lengths.append(lengths[i])
                returns[i], lengths[i] = 0.0, 0
                current[i] = env.reset()[0]
                assert not np.array_equal(stepper.obs[i], step.next_obs[i])
            else:
                current[i] = obs
            np.testing.assert_array_equal(stepper.obs[i], current[i])
        assert step.episode_returns == expected_returns
        assert step.episode_lengths == expected_lengths
        np.testing.assert_array_equal(step.action, action)
    assert ends >= 10  # random actions end CartPole episodes every ~20 steps
    stepper.close()
    for env in singles:
        env.close()


def test_vector_stepper_reports_truncation_with_lengths() -> None:
    stepper = VectorStepper(make_vector_env(EnvConfig(id="CartPole-v1", max_episode_steps=5), 3, 0), 0)
    rng = np.random.default_rng(1)
    ended: list[int] = []
    for t in range(15):
        step = stepper.step(rng.integers(2, size=3))
        assert not step.terminated.any()
        if (t + 1) % 5 == 0:
            assert step.truncated.all()
            assert step.episode_lengths == [5, 5, 5]
            assert step.episode_returns == [5.0, 5.0, 5.0]
            # the transition ends on the final obs; the stepper already holds the reset one
            assert not np.array_equal(step.next_obs, stepper.obs)
        else:
            assert not step.truncated.any()
            assert step.episode_lengths == [] and step.episode_returns == []
            np.testing.assert_array_equal(step.next_obs, stepper.obs)
        ended += step.episode_lengths
    assert len(ended) == 9
    stepper.close()


def test_vector_stepper_next_obs_does_not_alias_when_done() -> None:
    """Editing next_obs of a finished episode must not change the stepper's reset observation."""
    stepper = VectorStepper(make_vector_env(EnvConfig(id="CartPole-v1", max_episode_steps=2), 2, 3), 3)
    stepper.step(np.zeros(2, dtype=np.int64))
    step = stepper.step(np.zeros(2, dtype=np.int64))
    assert step.truncated.all()
    before = stepper.obs.copy()
    step.next_obs[:] = 99.0
    np.testing.assert_array_equal(stepper.obs, before)
    stepper.close()


def test_vector_env_seeds_are_per_index() -> None:
    cfg = EnvConfig(id="CartPole-v1")
    a = VectorStepper(make_vector_env(cfg, 2, 7), 7)
    b = VectorStepper(make_vector_env(cfg, 2, 7), 7)
    np.testing.assert_array_equal(a.obs, b.obs)
    assert not np.array_equal(a.obs[0], a.obs[1])
    single = make_env(cfg)
    np.testing.assert_array_equal(a.obs[1], single.reset(seed=8)[0])
    for s in (a, b):
        s.close()
    single.close()


# ---------------------------------------------------------------- GreedyEvaluator


def test_greedy_evaluator_returns_one_episode_per_env_and_matches_single_envs() -> None:
    cfg = EnvConfig(id="CartPole-v1")
    evaluator = GreedyEvaluator(cfg, episodes=3, seed=5)
    returns, lengths = evaluator.run(angle_policy)
    assert len(returns) == 3 and len(lengths) == 3
    assert returns == [float(n) for n in lengths]  # CartPole pays 1 per step
    # episodes end at different times; later steps of finished envs are not counted
    assert returns == [single_episode_return(cfg, 5 + i) for i in range(3)]
    assert len(set(returns)) > 1
    evaluator.close()


def test_greedy_evaluator_is_deterministic_per_seed_and_call() -> None:
    cfg = EnvConfig(id="CartPole-v1")
    first, second = GreedyEvaluator(cfg, 4, seed=11), GreedyEvaluator(cfg, 4, seed=11)
    call0 = first.run(angle_policy)
    assert second.run(angle_policy) == call0
    call1 = first.run(angle_policy)
    assert call1 != call0  # each call draws fresh seeds
    assert second.run(angle_policy) == call1
    assert call1[0] == [single_episode_return(cfg, 11 + 100_003 + i) for i in range(4)]
    other = GreedyEvaluator(cfg, 4, seed=12)
    assert other.run(angle_policy) != call0
    for e in (first, second, other):
        e.close()


def test_greedy_evaluator_respects_time_limit() -> None:
    evaluator = GreedyEvaluator(EnvConfig(id="CartPole-v1", max_episode_steps=8), episodes=2, seed=0)
    returns, lengths = evaluator.run(lambda obs: (obs[:, 2] + obs[:, 3] > 0).astype(np.int64))
    assert lengths == [8, 8] and returns == [8.0, 8.0]
    evaluator.close()
