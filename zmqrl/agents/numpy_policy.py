"""DQN's acting half for MLP Q-networks in plain numpy.

Actors run one small forward pass per env step; for an MLP that is a few matrix products,
which numpy does several times faster than torch's per-call overhead allows, and a process
that never imports torch also starts seconds sooner. Parameters are the torch network's
``state_dict`` names and shapes (see :class:`zmqrl.agents.networks.MLPQNetwork`), so the
learner publishes the same arrays whichever backend an actor uses.
"""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
import numpy as np

from zmqrl.agents.policy import epsilon_greedy
from zmqrl.config import AgentConfig, ConfigError


def mlp_param_shapes(cfg: AgentConfig, obs_dim: int, num_actions: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of :class:`MLPQNetwork`'s parameters (torso Linear layers at even indices)."""
    shapes: dict[str, tuple[int, ...]] = {}
    last = obs_dim
    for i, size in enumerate(cfg.hidden):
        shapes[f"torso.{2 * i}.weight"] = (size, last)
        shapes[f"torso.{2 * i}.bias"] = (size,)
        last = size
    shapes["head.advantage.weight"] = (num_actions, last)
    shapes["head.advantage.bias"] = (num_actions,)
    if cfg.dueling:
        shapes["head.value.weight"] = (1, last)
        shapes["head.value.bias"] = (1,)
    return shapes


class NumpyMLPPolicy:
    """Epsilon-greedy policy over an MLP Q-network, evaluated with numpy (float32)."""

    def __init__(self, cfg: AgentConfig, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                 seed: int = 0) -> None:
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ConfigError(f"agent.algo: dqn needs a Discrete action space, got {action_space}")
        if cfg.network != "mlp":
            raise ConfigError(f"actor.backend: numpy supports agent.network=mlp only, got {cfg.network!r}")
        self.cfg = cfg
        self.num_actions = int(action_space.n)
        self.shapes = mlp_param_shapes(cfg, int(np.prod(obs_space.shape or ())), self.num_actions)
        self.rng = np.random.default_rng(seed)
        init = np.random.default_rng(seed)
        self.load_params({k: (init.standard_normal(s) * 0.1).astype(np.float32) for k, s in self.shapes.items()})

    def load_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Take named arrays from the learner; names and shapes must match exactly."""
        if set(params) != set(self.shapes):
            missing, extra = sorted(set(self.shapes) - set(params)), sorted(set(params) - set(self.shapes))
            raise ValueError(f"parameter names differ: missing {missing}, unexpected {extra}")
        for name, shape in self.shapes.items():
            if tuple(params[name].shape) != shape:
                raise ValueError(f"parameter {name}: shape {params[name].shape}, expected {shape}")
        # Weights are stored transposed and contiguous: x @ W.T becomes x @ Wt without a strided view.
        self.torso = [(np.ascontiguousarray(params[f"torso.{2 * i}.weight"].T, dtype=np.float32),
                       np.array(params[f"torso.{2 * i}.bias"], dtype=np.float32)) for i in range(len(self.cfg.hidden))]
        self.adv = (np.ascontiguousarray(params["head.advantage.weight"].T, dtype=np.float32),
                    np.array(params["head.advantage.bias"], dtype=np.float32))
        self.value = ((np.ascontiguousarray(params["head.value.weight"].T, dtype=np.float32),
                       np.array(params["head.value.bias"], dtype=np.float32)) if self.cfg.dueling else None)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs, dtype=np.float32).reshape(len(obs), -1)
        for w, b in self.torso:
            x = x @ w
            x += b
            np.maximum(x, 0.0, out=x)
        adv = x @ self.adv[0] + self.adv[1]
        if self.value is None:
            return adv
        value = x @ self.value[0] + self.value[1]
        return value + adv - adv.mean(axis=1, keepdims=True)  # type: ignore[no-any-return]

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        return self.q_values(obs).argmax(axis=1)

    def act(self, obs: np.ndarray, epsilon: float | np.ndarray) -> np.ndarray:
        """Epsilon-greedy actions; ``epsilon`` is a scalar or one value per row."""
        return epsilon_greedy(self.greedy(obs), epsilon, self.rng, self.num_actions)

    def priorities(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """|TD error| with the local network standing in for the target (Ape-X actors)."""
        q = self.q_values(batch["obs"])
        q_taken = q[np.arange(len(q)), np.asarray(batch["action"], dtype=np.int64)]
        target = batch["reward"] + batch["discount"] * self.q_values(batch["next_obs"]).max(axis=1)
        return np.abs(target - q_taken).astype(np.float32)
