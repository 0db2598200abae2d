"""Environments from config: gymnasium id, wrappers, per-index seeds, and a vector of envs.

The vector uses gymnasium's ``SyncVectorEnv`` in *same-step* autoreset mode: when an episode
ends, ``step`` returns the first observation of the next episode and the final observation of
the finished one separately. :class:`VectorStepper` hides that and hands out, for every env,
the observation the action was taken on, the observation it led to (the final one at an
episode end) and the ``terminated``/``truncated`` flags, so no transition crosses an episode
boundary and truncation can bootstrap.

For exact resumes, :func:`capture_vector` takes the state of a vector env as plain data (see
:func:`zmqrl.run.checkpoint.is_plain`) and :func:`restore_vector` puts it back into a freshly made
one. gymnasium has no state API and pickling an env rebuilds it from its constructor arguments,
so each sub-env's wrapper chain is walked instead: attributes that are plain data, every
``numpy.random.Generator`` (its bit generator's state), the RNGs of spaces, enum members, and
MuJoCo's integration state. Constructor arguments, specs, renderers and callables are
configuration, not state. Anything else cannot be captured; it is named in the capture's
``missed`` list, and a resume from that capture is not exact.
"""

from __future__ import annotations

import enum
import functools
import importlib
import inspect
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from zmqrl.config import ConfigError, EnvConfig
from zmqrl.envs import atari
from zmqrl.envs.atari import GAME_LENGTH, GAME_RETURN, GameStats
from zmqrl.run.checkpoint import is_plain, plain_copy


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
        atari.register()
    elif env_id.startswith("zmqrl/"):
        import zmqrl.envs.catch  # noqa: F401  (registers on import)


def make_env(cfg: EnvConfig, training: bool = True) -> gym.Env:
    """One environment with the configured wrappers (seeded later, at reset).

    ``training=False`` builds it as evaluation sees it (see :data:`EVAL_WRAPPERS`).
    """
    kwargs: dict[str, Any] = dict(cfg.kwargs)
    if cfg.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    register_namespace(cfg.id)
    try:
        env = gym.make(cfg.id, **kwargs)
    except gym.error.Error as exc:
        raise ConfigError(f"env.id: cannot make {cfg.id!r}: {exc}") from None
    for name in cfg.wrappers:
        wrapper = EVAL_WRAPPERS[name] if not training and name in EVAL_WRAPPERS else _resolve_wrapper(name)
        if wrapper is not None:
            env = wrapper(env, cfg)
    return env


def make_vector_env(cfg: EnvConfig, num_envs: int, seed: int) -> SyncVectorEnv:
    """``num_envs`` envs stepped together; env ``i`` is seeded with ``seed + i`` at the first reset.

    The spaces' RNGs are seeded too: batching the spaces draws sub-env 0's from OS entropy.
    """
    vec = SyncVectorEnv([lambda: make_env(cfg) for _ in range(num_envs)],
                        autoreset_mode=AutoresetMode.SAME_STEP)
    vec.action_space.seed(seed)
    vec.observation_space.seed(seed)
    for i, env in enumerate(vec.envs):
        env.action_space.seed(seed + i)
        env.observation_space.seed(seed + i)
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


# --- env state as plain data (exact resumes) ------------------------------------------------

# Attributes that are configuration, links or rendering, never state: the next wrapper or the
# sub-envs (walked on their own), constructor arguments, specs, renderers.
NOT_STATE = frozenset({"env", "envs", "env_fns", "_saved_kwargs", "_ezpickle_args", "_ezpickle_kwargs", "spec",
                       "_cached_spec", "metadata", "_metadata", "mujoco_renderer", "viewer", "renderer", "screen",
                       "clock"})
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")  # those a saved RNG may name


def _is_config(value: Any) -> bool:
    """Functions, classes, modules, specs, envs (walked separately) and MuJoCo models: not state."""
    if inspect.isroutine(value) or isinstance(value, (type, types.ModuleType, functools.partial, gym.Env,
                                                       gym.envs.registration.EnvSpec)):
        return True
    return type(value).__module__.startswith("mujoco") and type(value).__name__ == "MjModel"


def _is_mjdata(value: Any) -> bool:
    return type(value).__module__.startswith("mujoco") and type(value).__name__ == "MjData"


def _space_rngs(space: gym.spaces.Space) -> list[gym.spaces.Space]:
    """A space and, depth first, the spaces it is made of (each has its own RNG)."""
    subs = getattr(space, "spaces", None)
    children = list(subs.values()) if isinstance(subs, dict) else list(subs) if isinstance(subs, (list, tuple)) else []
    return [space] + [s for child in children if isinstance(child, gym.spaces.Space) for s in _space_rngs(child)]


def _kind(value: Any) -> str | None:
    """How an attribute is captured: rng, space, enum, mujoco, value; "" when it cannot be;
    None when it is not state."""
    if _is_config(value):
        return None
    if isinstance(value, np.random.Generator):
        return "rng"
    if isinstance(value, gym.spaces.Space):
        return "space"
    if isinstance(value, enum.Enum):
        return "enum"
    if _is_mjdata(value):
        return "mujoco"
    return "value" if is_plain(value) else ""


def _mujoco_spec() -> Any:
    return sys.modules["mujoco"].mjtState.mjSTATE_INTEGRATION


def _capture(obj: Any, kind: str, value: Any) -> Any:
    if kind == "rng":
        return plain_copy(value.bit_generator.state)
    if kind == "space":
        return [None if s._np_random is None else plain_copy(s._np_random.bit_generator.state)
                for s in _space_rngs(value)]
    if kind == "enum":
        return value.name
    if kind == "mujoco":
        # The integration state (time, qpos, qvel, act, warm start, controls, ...: all mj_step reads)
        # and every array of MjData: quantities an env reads between steps, such as body
        # positions, are those the last step computed.
        mujoco, model = sys.modules["mujoco"], obj.model
        state = np.empty(mujoco.mj_stateSize(model, _mujoco_spec()), dtype=np.float64)
        mujoco.mj_getState(model, value, state, _mujoco_spec())
        return {"state": state, "arrays": _mjdata_arrays(value, copy=True)}
    return plain_copy(value)


def _mjdata_arrays(data: Any, copy: bool = False) -> dict[str, np.ndarray]:
    out = {}
    for name in dir(data):
        if not name.startswith("_"):
            value = getattr(data, name)
            if isinstance(value, np.ndarray) and not value.dtype.hasobject:
                out[name] = value.copy() if copy else value
    return out


def capture_object(obj: Any, where: str = "") -> tuple[dict[str, Any], list[str]]:
    """The state of one object: ``({attribute: {"kind", "value"}}, missed)``, where ``missed``
    names the attributes that are neither state it can capture nor configuration."""
    where = where or type(obj).__name__
    attrs: dict[str, Any] = {}
    missed: list[str] = []
    for name, value in vars(obj).items():
        if name in NOT_STATE:
            continue
        kind = _kind(value)
        if kind is None:
            continue
        if kind:
            attrs[name] = {"kind": kind, "value": _capture(obj, kind, value)}
        else:
            missed.append(f"{where}.{name} ({type(value).__name__})")
    return attrs, missed


def _new_generator(state: Any, where: str) -> np.random.Generator:
    name = state.get("bit_generator") if isinstance(state, dict) else None
    if name not in _BIT_GENERATORS:
        raise ValueError(f"{where}: unknown bit generator {name!r}")
    gen = np.random.Generator(getattr(np.random, name)())
    gen.bit_generator.state = state
    return gen


def _set_rng(current: Any, state: Any, where: str) -> Any:
    """``current`` with ``state`` (in place when it is a generator of the same kind)."""
    if state is None:
        return None
    if isinstance(current, np.random.Generator) and current.bit_generator.state.get("bit_generator") == \
            state.get("bit_generator"):
        current.bit_generator.state = state
        return current
    return _new_generator(state, where)


def plan_restore(obj: Any, saved: Any, where: str = "") -> list[Callable[[], None]]:
    """Check ``saved`` (from :func:`capture_object`) against ``obj`` and return the steps that
    put it back; ValueError naming ``where`` and the attribute when it does not fit. Nothing
    changes until the steps run."""
    where = where or type(obj).__name__
    if not isinstance(saved, dict) or not all(isinstance(e, dict) for e in saved.values()):
        raise ValueError(f"{where}: no saved attributes")
    current = {name: kind for name, value in vars(obj).items()
               if name not in NOT_STATE and (kind := _kind(value))}
    if set(current) != set(saved):
        raise ValueError(f"{where}: the saved attributes {sorted(set(saved) - set(current))} are not on this env, "
                         f"and {sorted(set(current) - set(saved))} of this env were not saved")
    steps: list[Callable[[], None]] = []
    for name, entry in saved.items():
        kind, value = entry.get("kind"), entry.get("value")
        # None and a value of another kind may take each other's place (a lazily made RNG, say)
        if kind != current[name] and not (kind == "value" and value is None) and getattr(obj, name) is not None:
            raise ValueError(f"{where}.{name}: saved as {kind}, this env has {current[name]}")
        steps.append(_restore_step(obj, name, kind, value, f"{where}.{name}"))
    return steps


def _restore_step(obj: Any, name: str, kind: str, value: Any, where: str) -> Callable[[], None]:
    cur = getattr(obj, name)
    if kind in ("space", "enum", "mujoco") and _kind(cur) != kind:
        raise ValueError(f"{where}: saved as {kind}, this env has {type(cur).__name__}")
    if kind == "rng":
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an RNG state, got {type(value).__name__}")
        _new_generator(value, where)  # checks the state now
        return lambda: setattr(obj, name, _set_rng(cur, value, where))
    if kind == "space":
        spaces_ = _space_rngs(cur)
        if not isinstance(value, list) or len(value) != len(spaces_):
            raise ValueError(f"{where}: the space has {len(spaces_)} RNGs, the file "
                             f"{len(value) if isinstance(value, list) else type(value).__name__}")
        for state in value:
            if state is not None:
                _new_generator(state, where)

        def restore_space() -> None:
            for space, state in zip(spaces_, value, strict=True):
                space._np_random = _set_rng(space._np_random, state, where)
        return restore_space
    if kind == "enum":
        if value not in type(cur).__members__:
            raise ValueError(f"{where}: {value!r} is not a member of {type(cur).__name__}")
        return lambda: setattr(obj, name, type(cur)[value])
    if kind == "mujoco":
        mujoco, model = sys.modules["mujoco"], obj.model
        size = mujoco.mj_stateSize(model, _mujoco_spec())
        state, arrays = (value.get("state"), value.get("arrays")) if isinstance(value, dict) else (None, None)
        if not isinstance(state, np.ndarray) or state.shape != (size,) or state.dtype != np.float64:
            raise ValueError(f"{where}: expected {size} float64 MuJoCo state values, got "
                             f"{getattr(state, 'shape', type(state).__name__)}")
        mine = _mjdata_arrays(cur)
        # arrays sized by the model must fit; those sized by this step's contacts and constraints
        # are computed afresh at the next step, and are copied only where they happen to fit
        derived = {k: v for k, v in (arrays or {}).items() if k in mine and mine[k].shape == np.shape(v)}

        def restore_mujoco() -> None:
            for key, saved in derived.items():
                mine[key][...] = saved
            mujoco.mj_setState(model, cur, state, _mujoco_spec())
        return restore_mujoco
    return lambda: setattr(obj, name, plain_copy(value))


def _layers(env: gym.Env) -> list[gym.Env]:
    """An env's wrapper chain, outermost first, down to the unwrapped env."""
    layers = [env]
    while isinstance(layers[-1], gym.Wrapper):
        layers.append(layers[-1].env)
    return layers


def capture_vector(vec: SyncVectorEnv) -> tuple[dict[str, Any], list[str]]:
    """The state of a vector env and of each sub-env's wrapper chain, and what it missed
    (each missed attribute once, however many sub-envs have it)."""
    attrs, missed = capture_object(vec)
    envs = []
    for env in vec.envs:
        chain = []
        for layer in _layers(env):
            layer_attrs, layer_missed = capture_object(layer)
            chain.append({"class": type(layer).__name__, "attrs": layer_attrs})
            missed += [m for m in layer_missed if m not in missed]
        envs.append(chain)
    return {"class": type(vec).__name__, "attrs": attrs, "envs": envs}, missed


def restore_vector(vec: SyncVectorEnv, saved: Any) -> None:
    """Put a :func:`capture_vector` state into ``vec`` (made from the same env config);
    ValueError naming the sub-env, wrapper and attribute that do not fit, before anything changes."""
    for step in plan_restore_vector(vec, saved):
        step()


def plan_restore_vector(vec: SyncVectorEnv, saved: Any) -> list[Callable[[], None]]:
    """The checks of :func:`restore_vector`; returns the steps that restore."""
    if not isinstance(saved, dict) or not isinstance(saved.get("envs"), list):
        raise ValueError("no vector env state")
    if len(saved["envs"]) != vec.num_envs:
        raise ValueError(f"{len(saved['envs'])} sub-envs saved, this vector has {vec.num_envs}")
    steps = plan_restore(vec, saved["attrs"], type(vec).__name__)
    for i, (env, chain) in enumerate(zip(vec.envs, saved["envs"], strict=True)):
        layers = _layers(env)
        names = [type(layer).__name__ for layer in layers]
        if [c.get("class") for c in chain] != names:
            raise ValueError(f"sub-env {i}: saved wrapper chain {[c.get('class') for c in chain]}, "
                             f"this env has {names}")
        for layer, entry in zip(layers, chain, strict=True):
            steps += plan_restore(layer, entry["attrs"], f"sub-env {i} {type(layer).__name__}")
    return steps


class VectorStepper:
    """Steps a vector env and tracks episode returns; holds the current observations."""

    def __init__(self, vec: SyncVectorEnv, seed: int) -> None:
        self.vec = vec
        self.num_envs = vec.num_envs
        # Envs that count whole games (Atari with a life per episode) report those, not episodes.
        self.games = any(isinstance(layer, GameStats) for env in vec.envs for layer in _layers(env))
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
        if self.games:
            returns, lengths = _games(info, done)
        self._ret[done] = 0.0
        self._len[done] = 0
        self.obs = new_obs
        return Step(obs, action, np.asarray(reward, dtype=np.float32), next_obs,
                    np.asarray(terminated), np.asarray(truncated), returns, lengths)

    def state(self) -> tuple[dict[str, Any], list[str]]:
        """The vector env's state and this stepper's observations and running episodes (copies),
        and what could not be captured."""
        vec, missed = capture_vector(self.vec)
        return {"vector": vec, "obs": self.obs.copy(), "ret": self._ret.copy(), "len": self._len.copy()}, missed

    def plan_load(self, state: Any) -> Callable[[], None]:
        """Check a :meth:`state` against this stepper; returns the step that loads it."""
        if not isinstance(state, dict):
            raise ValueError("no stepper state")
        steps = plan_restore_vector(self.vec, state.get("vector"))
        arrays = {"obs": self.obs, "ret": self._ret, "len": self._len}
        for key, mine in arrays.items():
            saved = state.get(key)
            if not isinstance(saved, np.ndarray) or saved.shape != mine.shape or saved.dtype != mine.dtype:
                raise ValueError(f"stepper {key}: expected {mine.dtype} {mine.shape}, got "
                                 f"{getattr(saved, 'dtype', type(saved).__name__)} {getattr(saved, 'shape', '')}")

        def load() -> None:
            for step in steps:
                step()
            self.obs, self._ret, self._len = (state[k].copy() for k in ("obs", "ret", "len"))
        return load

    def close(self) -> None:
        self.vec.close()


def _games(info: dict[str, Any], done: np.ndarray) -> tuple[list[float], list[int]]:
    """Return and length of each game that ended in a vector step (``final_info`` of GameStats)."""
    final = info.get("final_info") or {}
    ended = final.get(f"_{GAME_RETURN}")
    if ended is None:
        return [], []
    ended = np.asarray(ended) & done
    return (np.asarray(final[GAME_RETURN])[ended].astype(float).tolist(),
            np.asarray(final[GAME_LENGTH])[ended].astype(int).tolist())


class GreedyEvaluator:
    """Runs ``episodes`` greedy episodes at once, one per env of a vector, batched forwards."""

    def __init__(self, cfg: EnvConfig, episodes: int, seed: int) -> None:
        self.vec = SyncVectorEnv([lambda: make_env(cfg, training=False) for _ in range(episodes)],
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
