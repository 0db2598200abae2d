"""Stepping a vector of envs: for every env, the observation the action was taken on, the one it led
to (the final one at an episode end) and the ``terminated``/``truncated`` flags, so no transition
crosses an episode boundary and truncation can bootstrap. The vector runs in gymnasium's
*same-step* autoreset mode: when an episode ends, ``step`` returns the first observation of the
next episode and the final observation of the finished one separately; :class:`VectorStepper`
hides that."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium.vector import SyncVectorEnv

from zmqrl.envs.atari import GAME_LENGTH, GAME_RETURN, GameStats
from zmqrl.envs.state import capture_vector, plan_restore_vector, wrapper_chain


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
    valid: np.ndarray | None = None  # envs that took this step (None: all; see zmqrl.envs.pool)
    env_ids: np.ndarray | None = None  # the env of each row (None: row i is env i, every env stepped)


class VectorStepper:
    """Steps a vector env and tracks episode returns; holds the current observations."""

    restorable = True  # its state() puts every env back as it was
    env_ids = None  # its observations are every env's, in order

    def __init__(self, vec: SyncVectorEnv, seed: int) -> None:
        self.vec = vec
        self.num_envs = vec.num_envs
        # Envs that count whole games (Atari with a life per episode) report those, not episodes.
        self.games = any(isinstance(layer, GameStats) for env in vec.envs for layer in wrapper_chain(env))
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
            returns, lengths = ended_games(info, done)
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


def ended_games(info: dict[str, Any], done: np.ndarray) -> tuple[list[float], list[int]]:
    """Return and length of each game that ended in a vector step (``final_info`` of GameStats)."""
    final = info.get("final_info") or {}
    ended = final.get(f"_{GAME_RETURN}")
    if ended is None:
        return [], []
    ended = np.asarray(ended) & done
    return (np.asarray(final[GAME_RETURN])[ended].astype(float).tolist(),
            np.asarray(final[GAME_LENGTH])[ended].astype(int).tolist())
