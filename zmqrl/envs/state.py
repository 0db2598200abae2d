"""The state of envs as plain data, for exact resumes.

:func:`capture_vector` takes the state of a vector env as plain data (:func:`is_plain`: what
:func:`zmqrl.run.checkpoint.write_tree` stores) and :func:`plan_restore_vector` puts it back into a
freshly made one. gymnasium has no state API and pickling an env rebuilds it from its constructor
arguments, so each sub-env's wrapper chain is walked instead: attributes that are plain data,
every ``numpy.random.Generator`` (its bit generator's state), the RNGs of spaces, enum members,
MuJoCo's integration state and the Atari emulator's (ale-py's ``cloneState`` with its RNG, so sticky
actions replay too). Constructor arguments, specs, renderers and callables are
configuration, not state. Anything else cannot be captured; it is named in the capture's
``missed`` list, and a resume from that capture is not exact.
"""

from __future__ import annotations

import collections
import enum
import functools
import inspect
import sys
import types
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import SyncVectorEnv


def is_plain(value: Any) -> bool:
    """Whether ``value`` is plain data :func:`write_tree` can store: None, bools, numbers, strings,
    numpy arrays and scalars (no object dtype), and lists, tuples, deques and str-keyed dicts of those."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (np.ndarray, np.generic)):
        return not value.dtype.hasobject
    if isinstance(value, (list, tuple, collections.deque)):
        return all(is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain(v) for k, v in value.items())
    return False


def plain_copy(value: Any) -> Any:
    """A deep copy of plain data (arrays copied too); TypeError for anything else."""
    if not is_plain(value):
        raise TypeError(f"{type(value).__name__} is not plain data")
    return _copy_plain(value)


def _copy_plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, list):
        return [_copy_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_copy_plain(v) for v in value)
    if isinstance(value, collections.deque):
        return collections.deque((_copy_plain(v) for v in value), maxlen=value.maxlen)
    if isinstance(value, dict):
        return {k: _copy_plain(v) for k, v in value.items()}
    return value  # immutable: None, bool, int, float, str, numpy scalar


# --- env state as plain data (exact resumes) ------------------------------------------------

# Attributes that are configuration, links or rendering, never state: the next wrapper or the
# sub-envs (walked on their own), constructor arguments, specs, renderers.
NOT_STATE = frozenset({"env", "envs", "env_fns", "_saved_kwargs", "_ezpickle_args", "_ezpickle_kwargs", "spec",
                       "_cached_spec", "metadata", "_metadata", "mujoco_renderer", "viewer", "renderer", "screen",
                       "clock",
                       "_action_set"})  # (ale-py's actions of the game and mode: configuration)
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
    if _is_ale(value):
        return "ale"
    return "value" if is_plain(value) else ""


def _is_ale(value: Any) -> bool:
    return type(value).__module__.startswith("ale_py") and type(value).__name__ == "ALEInterface"


def _mujoco_spec() -> Any:
    return sys.modules["mujoco"].mjtState.mjSTATE_INTEGRATION


def _capture(obj: Any, kind: str, value: Any) -> Any:
    if kind == "rng":
        return plain_copy(value.bit_generator.state)
    if kind == "space":
        return [plain_copy(s.np_random.bit_generator.state) for s in _space_rngs(value)]
    if kind == "enum":
        return value.name
    if kind == "ale":  # the emulator (RAM, CPU, TIA, frame counters) and its RNG, as ale-py serialises it
        return np.frombuffer(value.cloneState(include_rng=True).serialize(), dtype=np.uint8).copy()
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
    if kind in ("space", "enum", "mujoco", "ale") and _kind(cur) != kind:
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
                if state is not None:  # (None: saved by a version that left unused RNGs unmade)
                    space.np_random.bit_generator.state = state
        return restore_space
    if kind == "enum":
        if value not in type(cur).__members__:
            raise ValueError(f"{where}: {value!r} is not a member of {type(cur).__name__}")
        return lambda: setattr(obj, name, type(cur)[value])
    if kind == "ale":
        if not isinstance(value, np.ndarray) or value.dtype != np.uint8 or value.ndim != 1:
            raise ValueError(f"{where}: expected the emulator state as uint8 bytes, got "
                             f"{getattr(value, 'dtype', type(value).__name__)}")
        try:
            emulator = type(cur.cloneState())(value.tobytes())
        except Exception as exc:  # ale-py's own error for bytes it cannot read
            raise ValueError(f"{where}: ale-py cannot read the saved emulator state: {exc}") from None
        return lambda: cur.restoreState(emulator)
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


def wrapper_chain(env: gym.Env) -> list[gym.Env]:
    """An env's wrapper chain, outermost first, down to the unwrapped env."""
    chain = [env]
    while isinstance(chain[-1], gym.Wrapper):
        chain.append(chain[-1].env)
    return chain


def capture_vector(vec: SyncVectorEnv) -> tuple[dict[str, Any], list[str]]:
    """The state of a vector env and of each sub-env's wrapper chain, and what it missed
    (each missed attribute once, however many sub-envs have it)."""
    attrs, missed = capture_object(vec)
    envs = []
    for env in vec.envs:
        chain = []
        for layer in wrapper_chain(env):
            layer_attrs, layer_missed = capture_object(layer)
            chain.append({"class": type(layer).__name__, "attrs": layer_attrs})
            missed += [m for m in layer_missed if m not in missed]
        envs.append(chain)
    return {"class": type(vec).__name__, "attrs": attrs, "envs": envs}, missed


def plan_restore_vector(vec: SyncVectorEnv, saved: Any) -> list[Callable[[], None]]:
    """Check a :func:`capture_vector` state against ``vec`` (made from the same env config); returns the
    steps that put it back, or raises ValueError naming the sub-env, wrapper and attribute that do not fit."""
    if not isinstance(saved, dict) or not isinstance(saved.get("envs"), list):
        raise ValueError("no vector env state")
    if len(saved["envs"]) != vec.num_envs:
        raise ValueError(f"{len(saved['envs'])} sub-envs saved, this vector has {vec.num_envs}")
    steps = plan_restore(vec, saved["attrs"], type(vec).__name__)
    for i, (env, chain) in enumerate(zip(vec.envs, saved["envs"], strict=True)):
        env_layers = wrapper_chain(env)
        names = [type(layer).__name__ for layer in env_layers]
        if [c.get("class") for c in chain] != names:
            raise ValueError(f"sub-env {i}: saved wrapper chain {[c.get('class') for c in chain]}, "
                             f"this env has {names}")
        for layer, entry in zip(env_layers, chain, strict=True):
            steps += plan_restore(layer, entry["attrs"], f"sub-env {i} {type(layer).__name__}")
    return steps
