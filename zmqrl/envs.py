"""Environments from config: gymnasium id, wrappers, per-index seeds, and a vector of envs.

The vector uses gymnasium's ``SyncVectorEnv`` in *same-step* autoreset mode: when an episode
ends, ``step`` returns the first observation of the next episode and the final observation of
the finished one separately. :class:`VectorStepper` hides that and hands out, for every env,
the observation the action was taken on, the observation it led to (the final one at an
episode end) and the ``terminated``/``truncated`` flags, so no transition crosses an episode
boundary and truncation can bootstrap.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from zmqrl.config import ConfigError, EnvConfig


def _atari(env: gym.Env, cfg: EnvConfig) -> gym.Env:
    env = gym.wrappers.AtariPreprocessing(env, frame_skip=1 if "NoFrameskip" not in str(env.spec) else 4)
    return gym.wrappers.FrameStackObservation(env, cfg.frame_stack)


def _frame_stack(env: gym.Env, cfg: EnvConfig) -> gym.Env:
    return gym.wrappers.FrameStackObservation(env, cfg.frame_stack)


def _clip_reward(env: gym.Env, cfg: EnvConfig) -> gym.Env:
    return gym.wrappers.TransformReward(env, lambda r: float(np.sign(float(r))))


def _float32_obs(env: gym.Env, cfg: EnvConfig) -> gym.Env:
    return gym.wrappers.DtypeObservation(env, np.float32)


WRAPPERS: dict[str, Callable[[gym.Env, EnvConfig], gym.Env]] = {
    "atari": _atari,
    "frame_stack": _frame_stack,
    "clip_reward": _clip_reward,
    "float32_obs": _float32_obs,
}


def _resolve_wrapper(name: str) -> Callable[[gym.Env, EnvConfig], gym.Env]:
    if name in WRAPPERS:
        return WRAPPERS[name]
    if ":" in name:  # "package.module:function" taking (env, env_config)
        module, _, attr = name.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"env.wrappers: cannot load {name!r}: {exc}") from None
    raise ConfigError(f"env.wrappers: unknown wrapper {name!r}; known: {', '.join(WRAPPERS)} "
                      "or 'module:function'")


def make_env(cfg: EnvConfig) -> gym.Env:
    """One environment with the configured wrappers (seeded later, at reset)."""
    kwargs: dict[str, Any] = dict(cfg.kwargs)
    if cfg.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    try:
        env = gym.make(cfg.id, **kwargs)
    except gym.error.Error as exc:
        raise ConfigError(f"env.id: cannot make {cfg.id!r}: {exc}") from None
    for name in cfg.wrappers:
        env = _resolve_wrapper(name)(env, cfg)
    return env


def make_vector_env(cfg: EnvConfig, num_envs: int, seed: int) -> SyncVectorEnv:
    """``num_envs`` envs stepped together; env ``i`` is seeded with ``seed + i`` at the first reset."""
    vec = SyncVectorEnv([lambda: make_env(cfg) for _ in range(num_envs)],
                        autoreset_mode=AutoresetMode.SAME_STEP)
    vec.action_space.seed(seed)
    return vec


def spaces(cfg: EnvConfig) -> tuple[gym.spaces.Space, gym.spaces.Space]:
    """The (single-env) observation and action spaces."""
    env = make_env(cfg)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


@dataclass
class Step:
    """One vector step, ready to become transitions."""

    obs: np.ndarray  # observations the actions were taken on
    action: np.ndarray
    reward: np.ndarray
    next_obs: np.ndarray  # the observation each action led to (final one at an episode end)
    terminated: np.ndarray
    truncated: np.ndarray
    episode_returns: list[float]  # episodes that ended in this step
    episode_lengths: list[int]


class VectorStepper:
    """Steps a vector env and tracks episode returns; holds the current observations."""

    def __init__(self, vec: SyncVectorEnv, seed: int) -> None:
        self.vec = vec
        self.num_envs = vec.num_envs
        self.obs, _ = vec.reset(seed=[seed + i for i in range(self.num_envs)])
        self._ret = np.zeros(self.num_envs, dtype=np.float64)
        self._len = np.zeros(self.num_envs, dtype=np.int64)

    def step(self, action: np.ndarray) -> Step:
        obs = self.obs
        new_obs, reward, terminated, truncated, info = self.vec.step(action)
        done = terminated | truncated
        next_obs = new_obs
        if done.any():
            next_obs = new_obs.copy()
            for i in np.flatnonzero(done):
                next_obs[i] = info["final_obs"][i]
        self._ret += reward
        self._len += 1
        returns = self._ret[done].tolist()
        lengths = self._len[done].tolist()
        self._ret[done] = 0.0
        self._len[done] = 0
        self.obs = new_obs
        return Step(obs, action, np.asarray(reward, dtype=np.float32), next_obs,
                    np.asarray(terminated), np.asarray(truncated), returns, lengths)

    def close(self) -> None:
        self.vec.close()


class GreedyEvaluator:
    """Runs ``episodes`` greedy episodes at once, one per env of a vector, batched forwards."""

    def __init__(self, cfg: EnvConfig, episodes: int, seed: int) -> None:
        self.vec = SyncVectorEnv([lambda: make_env(cfg) for _ in range(episodes)],
                                 autoreset_mode=AutoresetMode.SAME_STEP)
        self.episodes = episodes
        self.seed = seed
        self.calls = 0

    def run(self, greedy: Callable[[np.ndarray], np.ndarray]) -> tuple[list[float], list[int]]:
        """Returns and lengths of one episode per env; each call uses fresh, deterministic seeds."""
        base = self.seed + 100_003 * self.calls
        self.calls += 1
        obs, _ = self.vec.reset(seed=[base + i for i in range(self.episodes)])
        returns = np.zeros(self.episodes)
        lengths = np.zeros(self.episodes, dtype=np.int64)
        running = np.ones(self.episodes, dtype=bool)
        while running.any():
            obs, reward, terminated, truncated, _ = self.vec.step(greedy(obs))
            returns += np.where(running, reward, 0.0)
            lengths += running
            running &= ~(terminated | truncated)
        return returns.tolist(), lengths.tolist()

    def close(self) -> None:
        self.vec.close()
