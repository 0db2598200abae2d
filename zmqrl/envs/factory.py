"""Environments from config: a gymnasium id (or ``module:factory``, or a callables file of a factory from
Python: ``env.fn``), wrappers, and a vector of envs
with per-index seeds, in gymnasium's *same-step* autoreset mode (see :mod:`zmqrl.envs.stepper`);
or, for Atari where ``env.backend`` picks it, an EnvPool pool with the same semantics
(:mod:`zmqrl.envs.pool`)."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from zmqrl import callables
from zmqrl.config import ConfigError, EnvConfig
from zmqrl.envs import atari, pool
from zmqrl.envs.pomdp import mask_velocity
from zmqrl.envs.state import wrapper_chain
from zmqrl.envs.stepper import VectorStepper


def _atari(env: gym.Env, cfg: EnvConfig) -> gym.Env:
    return atari.wrap(env, cfg.frame_stack, training=True)


def _atari_eval(env: gym.Env, cfg: EnvConfig) -> gym.Env:
    return atari.wrap(env, cfg.frame_stack, training=False)


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
    "mask_velocity": mask_velocity,  # CartPole without its velocities: a memory task (zmqrl.envs.pomdp)
}


# How evaluation and `zmqrl enjoy` see an env: training-only wrappers left out (None), or replaced.
# Their scores are then the game's own: full games (not lives), unclipped rewards.
EVAL_WRAPPERS: dict[str, Callable[[gym.Env, EnvConfig], gym.Env] | None] = {
    "atari": _atari_eval,
    "clip_reward": None,
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


def register_namespace(env_id: str) -> None:
    """Register the envs of packages gymnasium does not load on its own: ``ALE/...`` (ale-py)
    and ``zmqrl/...`` (:mod:`zmqrl.envs.catch`)."""
    if env_id.startswith("ALE/") or env_id.endswith("NoFrameskip-v4"):
        atari.register(env_id)
    elif env_id.startswith("zmqrl/"):
        import zmqrl.envs.catch  # noqa: F401  (registers on import)


def make_env(cfg: EnvConfig, training: bool = True) -> gym.Env:
    """One environment with the configured wrappers (seeded later, at reset).

    ``training=False`` builds it as evaluation sees it (see :data:`EVAL_WRAPPERS`). An env that
    renders (``render_mode`` in ``env.kwargs``, as ``zmqrl enjoy --video`` asks) is always gymnasium's.
    """
    if "render_mode" not in cfg.kwargs and pool.uses_pool(cfg):
        return pool.PoolEnv(cfg, training=training)
    if cfg.fn:
        env = _from_callable(cfg)
    else:
        kwargs: dict[str, Any] = dict(cfg.kwargs)
        if cfg.max_episode_steps is not None:
            kwargs["max_episode_steps"] = cfg.max_episode_steps
        register_namespace(cfg.id)
        try:
            env = gym.make(cfg.id, **kwargs)
        except gym.error.DependencyNotInstalled as exc:
            extra = next((e for e in ("mujoco", "atari") if e in str(exc).lower()), None)
            hint = f"pip install 'zmqrl[{extra}]'" if extra else str(exc)
            raise ConfigError(f"env.id: {cfg.id!r} needs a package that is not installed: {hint}") from None
        except gym.error.Error as exc:
            raise ConfigError(f"env.id: cannot make {cfg.id!r}: {exc}") from None
    for name in cfg.wrappers:
        wrapper = EVAL_WRAPPERS[name] if not training and name in EVAL_WRAPPERS else _resolve_wrapper(name)
        if wrapper is not None:
            env = wrapper(env, cfg)
    if cfg.wrappers_fn:
        loaded = callables.load(cfg.wrappers_fn, "wrappers", "env.wrappers_fn")
        for user_wrapper in loaded.obj:
            env = _checked_env(_call(user_wrapper, "env.wrappers_fn", loaded, env), "env.wrappers_fn", loaded)
    return env


def _from_callable(cfg: EnvConfig) -> gym.Env:
    """The env of ``env.fn``'s factory, called with ``env.kwargs`` (as gymnasium.make is), under a time limit
    of ``env.max_episode_steps`` where that is set."""
    loaded = callables.load(cfg.fn, "env", "env.fn")
    env = _checked_env(_call(loaded.obj, "env.fn", loaded, **cfg.kwargs), "env.fn", loaded)
    if cfg.max_episode_steps is not None:
        env = gym.wrappers.TimeLimit(env, cfg.max_episode_steps)
    return env


def _call(fn: Callable[..., Any], key: str, loaded: callables.Loaded, *args: Any, **kwargs: Any) -> Any:
    """The user's callable called; what it raises is a ConfigError naming the key and the file (the
    original exception chained to it), for a role to exit 2 with rather than be restarted into the same."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        raise ConfigError(f"{key}: {callables.describe(fn)} from {loaded.path} raised {type(exc).__name__}: "
                          f"{exc}") from exc


def _checked_env(env: Any, key: str, loaded: callables.Loaded) -> gym.Env:
    if not isinstance(env, gym.Env):
        raise ConfigError(f"{key}: {loaded.name} from {loaded.path} returned {type(env).__name__}, not a "
                          "gymnasium Env")
    return env


def make_vector_env(cfg: EnvConfig, num_envs: int, seed: int) -> SyncVectorEnv:
    """``num_envs`` envs stepped together; env ``i`` is seeded with ``seed + i`` at the first reset.

    The spaces' RNGs are seeded too: batching the spaces draws sub-env 0's from OS entropy, and a
    wrapper that changes a space (mask_velocity's observations) leaves the one under it unseeded,
    drawn from OS entropy when first read (by a capture of the env's state, say).
    """
    vec = SyncVectorEnv([lambda: make_env(cfg) for _ in range(num_envs)],
                        autoreset_mode=AutoresetMode.SAME_STEP)
    vec.action_space.seed(seed)
    vec.observation_space.seed(seed)
    for i, env in enumerate(vec.envs):
        for layer in reversed(wrapper_chain(env)):  # the outermost last: its spaces are what the env shows
            layer.action_space.seed(seed + i)
            layer.observation_space.seed(seed + i)
    return vec


def make_stepper(cfg: EnvConfig, num_envs: int, seed: int) -> VectorStepper | pool.PoolStepper:
    """The training envs an acting loop steps: ``num_envs`` of them, env ``i`` seeded ``seed + i``."""
    if pool.uses_pool(cfg):
        return pool.PoolStepper(cfg, num_envs, seed)
    return VectorStepper(make_vector_env(cfg, num_envs, seed), seed)


def make_eval_vector(cfg: EnvConfig, num_envs: int) -> SyncVectorEnv | pool.PoolVector:
    """``num_envs`` evaluation envs (whole games, unclipped), seeded at each reset."""
    if pool.uses_pool(cfg):
        return pool.PoolVector(cfg, num_envs)
    return SyncVectorEnv([lambda: make_env(cfg, training=False) for _ in range(num_envs)],
                         autoreset_mode=AutoresetMode.SAME_STEP)


def spaces(cfg: EnvConfig) -> tuple[gym.spaces.Space, gym.spaces.Space]:
    """The (single-env) observation and action spaces.

    An Atari config on ``env.backend: auto`` takes them from the gymnasium chain where ale-py is
    there: the same spaces as EnvPool's (``tests/envs/test_pool.py``), without the second and a half
    importing EnvPool costs a role that only needs the spaces (a learner, a proxy)."""
    if cfg.backend == "auto" and pool.pool_task(cfg.id) and importlib.util.find_spec("ale_py") is not None:
        cfg = dataclasses.replace(cfg, backend="gymnasium")
    env = make_env(cfg)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()
