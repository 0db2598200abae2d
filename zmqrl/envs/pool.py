"""Atari through EnvPool: the ``atari`` chain's preprocessing run in C++ worker threads.

``env.backend: envpool`` (or ``auto`` where EnvPool is installed) makes an Atari config's envs
an EnvPool pool with the semantics of :mod:`zmqrl.envs.atari`: sticky actions as the env id's
version says (``ALE/...-v5``: 0.25, ``...NoFrameskip-v4``: 0) unless ``env.kwargs`` sets them, up
to 30 no-op starts, a frame skip of 4 max-pooling the last two frames, 84x84 grayscale
(INTER_AREA), a stack of ``env.frame_stack``; a lost life ends the learner's episode and rewards
are clipped for training only; evaluation plays whole games; game scores are always the game's
own (EnvPool's ``info["reward"]``). Held to the gymnasium chain by ``tests/envs/test_pool.py``:
same rewards and terminals for the same actions, frames within one grey level.

EnvPool resets an env on the step *after* its episode ends (the action of that step is
ignored). :class:`PoolStepper` marks those rows of a step as not ``valid``, and the n-step builder
skips them, so no transition spans a reset and no env step is counted twice.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from zmqrl.config import ConfigError, EnvConfig
from zmqrl.envs.stepper import Step

NOOP_MAX = 30  # no-op starts, as the atari chain draws them
_ALE_V5 = re.compile(r"^ALE/(?P<game>[A-Za-z]+)-v5$")
_NO_FRAMESKIP = re.compile(r"^(?P<game>[A-Za-z]+)NoFrameskip-v4$")
# env.kwargs of the gymnasium ids that mean the same in EnvPool (frameskip 1 is the chain's own
# setting: EnvPool skips frames itself, like the chain's wrapper).
_SAME_KWARGS = ("repeat_action_probability", "full_action_space", "mode", "difficulty")


def installed() -> bool:
    try:
        import envpool  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=1)
def _pool_ids() -> frozenset[str]:
    import envpool

    return frozenset(envpool.list_all_envs())


def pool_task(env_id: str) -> tuple[str, float] | None:
    """EnvPool's task id for an Atari env id and the sticky-action chance its version means;
    None for ids that are not Atari."""
    for pattern, sticky in ((_ALE_V5, 0.25), (_NO_FRAMESKIP, 0.0)):
        match = pattern.match(env_id)
        if match:
            return f"{match['game']}-v5", sticky
    return None


def uses_pool(cfg: EnvConfig) -> bool:
    """Whether ``cfg`` runs on EnvPool: ``env.backend: envpool``, or ``auto`` for an Atari id with
    the ``atari`` chain where EnvPool is installed and has the game. ConfigError naming the key when
    ``envpool`` is asked for and cannot be had."""
    if cfg.backend == "gymnasium":
        return False
    if cfg.fn:
        if cfg.backend == "envpool":
            raise ConfigError("env.backend: envpool runs Atari ids; the env of env.fn (a callable from Python) runs "
                              "on gymnasium: set env.backend to auto or gymnasium")
        return False
    task = pool_task(cfg.id)
    fits = task is not None and list(cfg.wrappers) == ["atari"]
    if cfg.backend == "auto":
        return fits and installed() and task is not None and task[0] in _pool_ids()
    if not fits:
        raise ConfigError(f"env.backend: envpool runs Atari ids (ALE/Pong-v5, PongNoFrameskip-v4) with "
                          f"env.wrappers [atari] only; this config has env.id {cfg.id!r}, wrappers {cfg.wrappers}")
    if not installed():
        raise ConfigError("env.backend: envpool is not installed: pip install 'zmqrl[envpool]' "
                          "(or env.backend: gymnasium)")
    assert task is not None
    if task[0] not in _pool_ids():
        raise ConfigError(f"env.backend: EnvPool has no {task[0]!r} for env.id {cfg.id!r}")
    return True


def pool_options(cfg: EnvConfig, training: bool) -> tuple[str, dict[str, Any]]:
    """EnvPool's task id and ``envpool.make`` options for ``cfg`` (ConfigError naming a key it
    cannot express)."""
    task = pool_task(cfg.id)
    if task is None:
        raise ConfigError(f"env.id: {cfg.id!r} is not an Atari id EnvPool runs")
    options: dict[str, Any] = {"repeat_action_probability": task[1]}
    for key, value in cfg.kwargs.items():
        if key == "frameskip":
            if value != 1:
                raise ConfigError("env.kwargs: the atari chain repeats each action itself; make the env with "
                                  "`frameskip: 1` in env.kwargs")
        elif key == "max_num_frames_per_episode":
            options["max_episode_steps"] = int(value) // 4
        elif key in _SAME_KWARGS:
            options[key] = value
        else:
            raise ConfigError(f"env.kwargs: {key!r} has no EnvPool equivalent (env.backend: gymnasium runs it)")
    if cfg.max_episode_steps is not None:
        options["max_episode_steps"] = cfg.max_episode_steps
    options.update(stack_num=cfg.frame_stack, frame_skip=4, noop_max=NOOP_MAX, img_height=84, img_width=84,
                   gray_scale=True, use_inter_area_resize=True, use_fire_reset=False,
                   episodic_life=training, reward_clip=training)
    return task[0], options


def make_pool(cfg: EnvConfig, seeds: Sequence[int], training: bool, noop_max: int | None = None,
              batch: int = 0) -> Any:
    """An EnvPool pool of ``len(seeds)`` envs (gymnasium API); env ``i`` seeded with ``seeds[i]``;
    synchronous, or with ``batch`` below the number of envs, handing out ``batch`` ready envs at a
    time. ``noop_max`` overrides the no-op starts (1: exactly one no-op frame, for tests)."""
    import envpool

    task, options = pool_options(cfg, training)
    if noop_max is not None:
        options["noop_max"] = max(1, noop_max)  # EnvPool crashes on 0
    num_envs = len(seeds)
    threads = max(1, min(cfg.threads, num_envs))
    return envpool.make(task, env_type="gymnasium", num_envs=num_envs, batch_size=batch or num_envs,
                        num_threads=threads, env_seed=[int(s) for s in seeds], **options)


def _in_env_order(pool_out: tuple[Any, ...], info: dict[str, Any]) -> tuple[Any, ...]:
    """A synchronous pool's results are in env order already; this keeps them so if a pool ever is not."""
    ids = np.asarray(info["env_id"])
    if np.all(np.diff(ids) > 0):
        return pool_out
    order = np.argsort(ids)
    return tuple(x[order] if isinstance(x, np.ndarray) else x for x in pool_out)


class PoolStepper:
    """:class:`~zmqrl.envs.stepper.VectorStepper`'s interface over an EnvPool pool.

    Each step's ``valid`` marks the envs that took it; the others were resetting (their episode
    ended the step before; EnvPool ignores their action and returns a new episode's first
    observation). Episode returns and lengths are whole games' (``games``), unclipped.

    With ``batch`` below ``num_envs`` the pool runs asynchronously: :attr:`obs` holds the
    observations of the ``batch`` envs named by :attr:`env_ids`; :meth:`step` sends their actions
    and returns the next ``batch`` envs to finish a step (any of them, in any order), each row
    with the observation and action its step began with. Envs step in the pool's threads while the
    policy acts for the others.
    """

    games = True
    restorable = False  # EnvPool envs cannot be saved: a resumed run starts new episodes

    def __init__(self, cfg: EnvConfig, num_envs: int, seed: int) -> None:
        self.num_envs = num_envs
        batch = cfg.batch if 0 < cfg.batch < num_envs else 0
        self.pool = make_pool(cfg, [seed + i for i in range(num_envs)], training=True, batch=batch)
        self.env_ids: np.ndarray | None = None
        if batch:
            self.pool.async_reset()
            self.obs, _, _, _, info = self.pool.recv()
            self.env_ids = np.asarray(info["env_id"], dtype=np.int64)
            self._obs_of = np.zeros((num_envs, *self.obs.shape[1:]), dtype=self.obs.dtype)  # what each env acted on
            self._action_of: np.ndarray | None = None
        else:
            obs, info = self.pool.reset()
            (self.obs,) = _in_env_order((obs,), info)
        self._resetting = np.zeros(num_envs, dtype=bool)
        if self.env_ids is not None:  # the others' first rows to come are their resets, not steps
            self._resetting[:] = True
            self._resetting[self.env_ids] = False
        self._ret = np.zeros(num_envs, dtype=np.float64)
        self._len = np.zeros(num_envs, dtype=np.int64)

    def step(self, action: np.ndarray) -> Step:
        action = np.asarray(action)
        rows: Any  # the envs of the returned rows: all (a slice), or those the pool handed out
        if self.env_ids is None:
            obs = self.obs
            out = self.pool.step(action)
            new_obs, reward, terminated, truncated, info = _in_env_order(out, out[4])
            rows = slice(None)
        else:
            if self._action_of is None:
                self._action_of = np.zeros((self.num_envs, *action.shape[1:]), dtype=action.dtype)
            self._obs_of[self.env_ids] = self.obs
            self._action_of[self.env_ids] = action
            self.pool.send(action, self.env_ids)
            new_obs, reward, terminated, truncated, info = self.pool.recv()
            rows = np.asarray(info["env_id"], dtype=np.int64)
            obs, action = self._obs_of[rows], self._action_of[rows]
        valid = ~self._resetting[rows]
        terminated = np.asarray(terminated, dtype=bool) & valid
        truncated = np.asarray(truncated, dtype=bool) & valid
        done = terminated | truncated
        self._ret[rows] += np.where(valid, info["reward"], 0.0)
        self._len[rows] += valid
        over = np.zeros(self.num_envs, dtype=bool)
        over[rows] = done & (np.asarray(info["terminated"], dtype=bool) | truncated)
        returns, lengths = self._ret[over].tolist(), self._len[over].tolist()
        self._ret[over] = 0.0
        self._len[over] = 0
        self._resetting[rows] = done
        self.obs = new_obs
        env_ids: np.ndarray | None = None
        if self.env_ids is not None:
            self.env_ids = env_ids = rows
        return Step(obs, action, np.where(valid, reward, 0.0).astype(np.float32), new_obs, terminated, truncated,
                    returns, lengths, valid=valid, env_ids=env_ids)

    def state(self) -> tuple[dict[str, Any], list[str]]:
        return {}, ["EnvPool envs (a resumed run starts new episodes)"]

    def plan_load(self, state: Any) -> Callable[[], None]:
        return lambda: None

    def close(self) -> None:
        self.pool.close()


class PoolVector:
    """What :class:`~zmqrl.envs.evaluator.GreedyEvaluator` needs of a vector env, over EnvPool
    evaluation envs (whole games, unclipped): ``reset(seed=[...])`` starts every env anew with those
    seeds (a new pool when they differ from the last ones), ``step`` steps them all."""

    def __init__(self, cfg: EnvConfig, num_envs: int) -> None:
        self.cfg = cfg
        self.num_envs = num_envs
        self.pool: Any = None
        self._seeds: list[int] = []
        probe = make_pool(cfg, [0], training=False)
        self.single_observation_space, self.single_action_space = probe.observation_space, probe.action_space
        probe.close()

    def reset(self, seed: Sequence[int | None] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        seeds = [0 if s is None else int(s) for s in (seed or [None] * self.num_envs)]
        if self.pool is None or seeds != self._seeds:
            self.close()
            self.pool, self._seeds = make_pool(self.cfg, seeds, training=False), seeds
        obs, info = self.pool.reset()
        return _in_env_order((obs, info), info)  # type: ignore[return-value]

    def step(self, action: np.ndarray) -> tuple[Any, ...]:
        out = self.pool.step(np.asarray(action))
        return _in_env_order(out, out[4])

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


class PoolEnv(gym.Env):
    """One EnvPool env as a gymnasium env (``zmqrl enjoy`` and the spaces of a config): whole games
    for evaluation, or the training view. ``reset(seed=s)`` starts a new game seeded ``s``."""

    def __init__(self, cfg: EnvConfig, training: bool = False) -> None:
        self.cfg, self.training = cfg, training
        self._seed: int | None = None
        self.pool = make_pool(cfg, [0], training=training)
        self.observation_space = self.pool.observation_space
        self.action_space = self.pool.action_space

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        if seed is not None and seed != self._seed:
            self.pool.close()
            self.pool, self._seed = make_pool(self.cfg, [seed], training=self.training), seed
        obs, info = self.pool.reset()
        return obs[0], {"lives": int(info["lives"][0])}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.pool.step(np.array([action]))
        return (obs[0], float(reward[0]), bool(terminated[0]), bool(truncated[0]),
                {"lives": int(info["lives"][0]), "game_reward": float(info["reward"][0])})

    def close(self) -> None:
        self.pool.close()
