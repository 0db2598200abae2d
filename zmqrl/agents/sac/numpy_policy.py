"""SAC's acting half in plain numpy, and the action arithmetic both policies share (torch-free).

The actor gives a Gaussian over pre-tanh actions ``u``; the squashed action ``tanh(u)`` lies in
[-1, 1] and is scaled to the Box bounds. Both the numpy and the torch policy draw their noise,
the rows that explore and the uniform actions from one ``numpy.random.default_rng(seed)`` in
the order :func:`explore_actions` fixes, so with the same seed and parameters they act alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import gymnasium as gym
import numpy as np

from zmqrl.agents.numpy_mlp import (
    as_rows,
    check_params,
    linear_stack_shapes,
    relu_stack,
    stack_layers,
    torch_default_init,
)
from zmqrl.agents.sac.config import SACConfig


def actor_param_shapes(cfg: SACConfig, obs_dim: int, act_dim: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of :class:`~zmqrl.agents.sac.networks.Actor`'s parameters."""
    shapes = linear_stack_shapes("torso", obs_dim, cfg.hidden)
    last = cfg.hidden[-1] if cfg.hidden else obs_dim
    for head in ("mean", "log_std"):
        shapes[f"{head}.weight"] = (act_dim, last)
        shapes[f"{head}.bias"] = (act_dim,)
    return shapes


class ActionBounds:
    """The affine map between squashed actions in [-1, 1] and a Box's ``[low, high]``."""

    def __init__(self, space: gym.spaces.Box) -> None:
        self.low = np.asarray(space.low, dtype=np.float32).reshape(-1)
        self.high = np.asarray(space.high, dtype=np.float32).reshape(-1)
        self.half_range = (self.high - self.low) / np.float32(2.0)
        self.dtype = np.dtype(space.dtype or np.float32)

    def to_env(self, squashed: np.ndarray) -> np.ndarray:
        """Env actions, within the bounds (float rounding clipped away), in the space's dtype."""
        action = (squashed + np.float32(1.0)) * self.half_range + self.low
        np.clip(action, self.low, self.high, out=action)
        return action.astype(self.dtype, copy=False)


def explore_actions(n: int, act_dim: int, explore: float | np.ndarray, rng: np.random.Generator,
                    forward: Callable[[], tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Squashed actions for ``n`` rows: each row a uniform random action with probability
    ``explore`` (scalar or per row), else a sample ``tanh(mean + exp(log_std) * noise)``.

    ``forward`` gives the actor's ``(mean, log_std)``; it is not called when every row explores.
    RNG order: the noise, then (when ``explore`` may be positive) one uniform per row deciding
    whether it explores, then the uniform actions of the rows that do.
    """
    p = np.asarray(explore, dtype=np.float64)
    if p.ndim == 0 and p >= 1.0:
        return rng.uniform(-1.0, 1.0, (n, act_dim)).astype(np.float32)
    mean, log_std = forward()
    noise = rng.standard_normal((n, act_dim), dtype=np.float32)
    squashed = np.tanh(mean + np.exp(log_std) * noise)
    if p.ndim or p > 0.0:
        rows = rng.random(n) < p
        if rows.any():
            squashed[rows] = rng.uniform(-1.0, 1.0, (int(rows.sum()), act_dim))
    return squashed  # type: ignore[no-any-return]


class NumpySACPolicy:
    """SAC's tanh-Gaussian policy over an MLP actor, evaluated with numpy (float32)."""

    def __init__(self, cfg: SACConfig, obs_space: gym.spaces.Space, action_space: gym.spaces.Box,
                 seed: int = 0) -> None:
        self.cfg = cfg
        self.bounds = ActionBounds(action_space)
        self.act_dim = len(self.bounds.low)
        self.shapes = actor_param_shapes(cfg, int(np.prod(obs_space.shape or ())), self.act_dim)
        self.rng = np.random.default_rng(seed)
        self.load_params(torch_default_init(self.shapes, seed))

    def load_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Take named arrays from the learner; names and shapes must match exactly."""
        check_params(params, self.shapes)
        self.torso = stack_layers(params, "torso", len(self.cfg.hidden))
        # both heads in one product: columns [:act_dim] are the mean, the rest the log-std
        w = np.concatenate([np.asarray(params["mean.weight"]), np.asarray(params["log_std.weight"])])
        b = np.concatenate([np.asarray(params["mean.bias"]), np.asarray(params["log_std.bias"])])
        self.head = (np.ascontiguousarray(w.T, dtype=np.float32), b.astype(np.float32))

    def mean_log_std(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The actor's mean and clamped log-std for a batch of observations."""
        x = relu_stack(as_rows(obs), self.torso) @ self.head[0]
        x += self.head[1]
        log_std = np.clip(x[:, self.act_dim:], self.cfg.log_std_min, self.cfg.log_std_max)
        return x[:, :self.act_dim], log_std

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """``tanh(mean)`` scaled to the bounds."""
        return self.bounds.to_env(np.tanh(self.mean_log_std(obs)[0]))

    def act(self, obs: np.ndarray, explore: float | np.ndarray) -> np.ndarray:
        """Policy samples; ``explore`` is the probability per row of a uniform random action instead."""
        return self.bounds.to_env(explore_actions(len(obs), self.act_dim, explore, self.rng,
                                                  lambda: self.mean_log_std(obs)))

    def priorities(self, batch: Mapping[str, np.ndarray]) -> None:
        """None: the actor has no critic, so the learner gives new transitions the maximum priority."""
        return None
