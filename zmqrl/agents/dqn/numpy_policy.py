"""DQN's acting half for MLP Q-networks in plain numpy (see :mod:`zmqrl.agents.numpy_mlp`)."""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
import numpy as np

from zmqrl.agents.base import epsilon_greedy
from zmqrl.agents.dqn.config import DQNConfig
from zmqrl.agents.numpy_mlp import (
    as_rows,
    check_params,
    linear_stack_shapes,
    relu_stack,
    stack_layers,
    torch_default_init,
)


def mlp_param_shapes(cfg: DQNConfig, obs_dim: int, num_actions: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of :class:`~zmqrl.agents.dqn.networks.MLPQNetwork`'s parameters."""
    shapes = linear_stack_shapes("torso", obs_dim, cfg.hidden)
    last = cfg.hidden[-1] if cfg.hidden else obs_dim
    shapes["head.advantage.weight"] = (num_actions, last)
    shapes["head.advantage.bias"] = (num_actions,)
    if cfg.dueling:
        shapes["head.value.weight"] = (1, last)
        shapes["head.value.bias"] = (1,)
    return shapes


def td_priorities(batch: Mapping[str, np.ndarray], first: np.ndarray, boot: np.ndarray) -> np.ndarray:
    """Ape-X actors' initial priorities: ``|reward + discount * max_a boot[a] - first[action]|`` from
    the Q-values of ``obs`` (``first``) and ``next_obs`` (``boot``), the local network standing in
    for the target. The max is also double DQN's rule here: with one network for both, its argmax
    evaluated by itself is the max. Both DQN policies compute their priorities with this."""
    n = len(first)
    q_taken = first[np.arange(n), np.asarray(batch["action"], dtype=np.intp)]
    target = boot.max(axis=1)
    target *= batch["discount"]
    target += batch["reward"]
    target -= q_taken
    return np.abs(target, out=target).astype(np.float32, copy=False)  # type: ignore[no-any-return]


def initial_mlp_params(cfg: DQNConfig, obs_dim: int, num_actions: int, seed: int) -> dict[str, np.ndarray]:
    """The MLP Q-network's parameters drawn like torch's default ``nn.Linear`` init."""
    return torch_default_init(mlp_param_shapes(cfg, obs_dim, num_actions), seed)


class NumpyMLPPolicy:
    """Epsilon-greedy policy over an MLP Q-network, evaluated with numpy (float32)."""

    def __init__(self, cfg: DQNConfig, obs_space: gym.spaces.Space, action_space: gym.spaces.Discrete,
                 seed: int = 0) -> None:
        self.cfg = cfg
        self.num_actions = int(action_space.n)
        self.shapes = mlp_param_shapes(cfg, int(np.prod(obs_space.shape or ())), self.num_actions)
        self.rng = np.random.default_rng(seed)
        init = np.random.default_rng(seed)
        self.load_params({k: (init.standard_normal(s) * 0.1).astype(np.float32) for k, s in self.shapes.items()})

    def load_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Take named arrays from the learner; names and shapes must match exactly."""
        check_params(params, self.shapes)
        self.torso = stack_layers(params, "torso", len(self.cfg.hidden))
        self.head = self._head(params)

    def _head(self, params: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """The Q head as one linear layer ``(W, b)``, ``q = x @ W + b``.

        The dueling combination ``v + a - mean(a)`` is linear in the features, so it folds into
        the weights: ``W = Wv + Wa - mean_j(Wa_j)`` (likewise for the bias), computed in float64.
        """
        w = np.asarray(params["head.advantage.weight"], dtype=np.float64)
        b = np.asarray(params["head.advantage.bias"], dtype=np.float64)
        if self.cfg.dueling:
            w = w - w.mean(axis=0) + np.asarray(params["head.value.weight"], dtype=np.float64)
            b = b - b.mean() + np.asarray(params["head.value.bias"], dtype=np.float64)
        return np.ascontiguousarray(w.T, dtype=np.float32), b.astype(np.float32)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values of a batch of observations, shape ``(len(obs), num_actions)``."""
        x = relu_stack(as_rows(obs), self.torso)
        q = x @ self.head[0]
        q += self.head[1]
        return q

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        return self.q_values(obs).argmax(axis=1)

    def act(self, obs: np.ndarray, explore: float | np.ndarray) -> np.ndarray:
        """Epsilon-greedy actions; ``explore`` is epsilon, a scalar or one value per row."""
        return epsilon_greedy(self.greedy(obs), explore, self.rng, self.num_actions)

    def priorities(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """|TD error| with the local network standing in for the target (:func:`td_priorities`).

        ``obs`` and ``next_obs`` go through the network in one forward pass of ``2n`` rows:
        for the small batches an actor sends, numpy's per-call overhead costs more than the rows.
        For the same reason this policy does not reuse its acting Q-values
        (:class:`~zmqrl.core.ReusesActingValues`): carrying them along cost the acting loop about
        20 us per CartPole step of 4 envs, several times what this pass costs per step (~4 us).
        """
        obs, next_obs = np.asarray(batch["obs"]), np.asarray(batch["next_obs"])
        n = len(obs)
        q = self.q_values(np.concatenate((obs.reshape(n, -1), next_obs.reshape(n, -1))))
        return td_priorities(batch, q[:n], q[n:])
