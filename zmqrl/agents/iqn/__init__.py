"""IQN through the algorithm seam: implicit quantile networks (Dabney et al. 2018), n-step,
prioritized, Ape-X exploration per actor.

Torch-free at import: the torch agent and policy load only when asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from zmqrl.agents.base import Algorithm, Exploration, check_discrete_spaces, epsilon_exploration, resolve_backend
from zmqrl.agents.iqn.config import IQNConfig
from zmqrl.config import Config, ConfigError

if TYPE_CHECKING:
    from zmqrl.core import Agent, Params, Policy


def _cfg(cfg: Config) -> IQNConfig:
    assert isinstance(cfg.agent, IQNConfig), "the agent section is not IQN's"
    return cfg.agent


def check_config(ac: IQNConfig) -> None:
    """What the range checks of the config cannot say about IQN's keys."""
    for key in ("hidden", "head_hidden"):
        sizes = getattr(ac, key)
        if any(size <= 0 for size in sizes):
            raise ConfigError(f"agent.{key}: layer sizes must be > 0, got {sizes}")


class IQN(Algorithm):
    name = "iqn"
    config_class = IQNConfig

    def check_spaces(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space) -> None:
        check_config(_cfg(cfg))
        check_discrete_spaces(cfg, obs_space, action_space, _cfg(cfg).network)

    def make_policy(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                    seed: int = 0, backend: str = "auto", device: str = "cpu") -> Policy:
        ac = _cfg(cfg)
        assert isinstance(action_space, gym.spaces.Discrete)
        if resolve_backend(backend, ac.network == "mlp", device) == "numpy":
            from zmqrl.agents.iqn.numpy_policy import NumpyIQNPolicy

            return NumpyIQNPolicy(ac, obs_space, action_space, seed=seed)
        import torch

        from zmqrl.agents.iqn.agent import IQNPolicy

        torch.set_num_threads(1)
        return IQNPolicy(ac, obs_space, action_space, device, seed)

    def exploration(self, cfg: Config, actor_index: int | None) -> Exploration:
        """ε-greedy, as DQN: a linear decay in ``zmqrl train``; Ape-X's fixed ε per actor index otherwise."""
        return epsilon_exploration(cfg, actor_index)

    def make_agent(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                   device: Any = "cpu", seed: int = 0) -> Agent:
        from zmqrl.agents.iqn.agent import IQNAgent

        assert isinstance(action_space, gym.spaces.Discrete)
        check_config(_cfg(cfg))
        return IQNAgent(_cfg(cfg), obs_space, action_space, device, seed)

    def initial_params(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                       seed: int) -> Params | None:
        """The MLP network drawn like torch's default init; None for the CNN (built first)."""
        ac = _cfg(cfg)
        if ac.network != "mlp" or not isinstance(action_space, gym.spaces.Discrete):
            return None
        from zmqrl.agents.iqn.numpy_policy import initial_mlp_params

        return initial_mlp_params(ac, int(np.prod(obs_space.shape or ())), int(action_space.n), seed)


ALGORITHM = IQN()
