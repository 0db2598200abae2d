"""DQN through the algorithm seam: double, dueling, n-step, prioritized (Ape-X's learner).

Torch-free at import: the torch agent and policy load only when asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from zmqrl.agents.base import Algorithm, Exploration, check_discrete_spaces, epsilon_exploration, resolve_backend
from zmqrl.agents.dqn.config import DQNConfig
from zmqrl.agents.numpy_mlp import torch_default_init
from zmqrl.config import Config

if TYPE_CHECKING:
    from zmqrl.core import Agent, Params, Policy


def _cfg(cfg: Config) -> DQNConfig:
    assert isinstance(cfg.agent, DQNConfig), "the agent section is not DQN's"
    return cfg.agent


class DQN(Algorithm):
    name = "dqn"
    config_class = DQNConfig

    def check_spaces(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space) -> None:
        check_discrete_spaces(cfg, obs_space, action_space, _cfg(cfg).network)

    def make_policy(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                    seed: int = 0, backend: str = "auto", device: str = "cpu") -> Policy:
        ac = _cfg(cfg)
        assert isinstance(action_space, gym.spaces.Discrete)
        if resolve_backend(backend, ac.network == "mlp", device) == "numpy":
            from zmqrl.agents.dqn.numpy_policy import NumpyMLPPolicy

            return NumpyMLPPolicy(ac, obs_space, action_space, seed=seed)
        import torch

        from zmqrl.agents.dqn.agent import DQNPolicy

        torch.set_num_threads(1)
        return DQNPolicy(ac, obs_space, action_space, device, seed)

    def exploration(self, cfg: Config, actor_index: int | None) -> Exploration:
        """ε-greedy: a linear decay in ``zmqrl train``; Ape-X's fixed ε per actor index otherwise."""
        return epsilon_exploration(cfg, actor_index)

    def make_agent(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                   device: Any = "cpu", seed: int = 0) -> Agent:
        from zmqrl.agents.dqn.agent import DQNAgent

        assert isinstance(action_space, gym.spaces.Discrete)
        return DQNAgent(_cfg(cfg), obs_space, action_space, device, seed)

    def initial_params(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                       seed: int) -> Params | None:
        """The MLP Q-network drawn like torch's default init; None for the CNN (built first)."""
        ac = _cfg(cfg)
        if ac.network != "mlp" or not isinstance(action_space, gym.spaces.Discrete):
            return None
        from zmqrl.agents.dqn.numpy_policy import mlp_param_shapes

        return torch_default_init(mlp_param_shapes(ac, int(np.prod(obs_space.shape or ())), int(action_space.n)),
                                  seed)


ALGORITHM = DQN()
