"""The acting half of the configured algorithm, on the backend that runs it fastest."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from zmqrl.config import AgentConfig, ConfigError


def epsilon_greedy(greedy_actions: np.ndarray, epsilon: float | np.ndarray, rng: np.random.Generator,
                   num_actions: int) -> np.ndarray:
    """Replace each greedy action by a uniform random one with probability ``epsilon`` (scalar or per row)."""
    explore = rng.random(len(greedy_actions)) < epsilon
    if explore.any():
        greedy_actions[explore] = rng.integers(num_actions, size=int(explore.sum()))
    return greedy_actions


def resolve_backend(cfg: AgentConfig, backend: str, device: str = "cpu") -> str:
    """``auto`` picks numpy for MLP policies on the CPU (several times faster per step), else torch."""
    if backend == "auto":
        return "numpy" if cfg.network == "mlp" and str(device) == "cpu" else "torch"
    if backend not in ("numpy", "torch"):
        raise ConfigError(f"actor.backend: must be auto, numpy or torch, got {backend!r}")
    return backend


def make_policy(cfg: AgentConfig, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                device: str = "cpu", seed: int = 0, backend: str = "torch") -> Any:
    """A policy with ``act``, ``greedy``, ``priorities`` and ``load_params`` (see :class:`zmqrl.core.Policy`)."""
    if resolve_backend(cfg, backend, device) == "numpy":
        from zmqrl.agents.numpy_policy import NumpyMLPPolicy

        return NumpyMLPPolicy(cfg, obs_space, action_space, seed=seed)
    import torch

    from zmqrl.agents.dqn import DQNPolicy

    torch.set_num_threads(1)
    return DQNPolicy(cfg, obs_space, action_space, device, seed)
