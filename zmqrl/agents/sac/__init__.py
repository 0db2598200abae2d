"""SAC through the algorithm seam: continuous (Box) actions, twin critics, automatic entropy.

Torch-free at import: the torch agent and policy load only when asked for.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from zmqrl.agents.base import Algorithm, Exploration, constant, resolve_backend
from zmqrl.agents.numpy_mlp import torch_default_init
from zmqrl.agents.sac.config import SACConfig
from zmqrl.config import Config, ConfigError

if TYPE_CHECKING:
    from zmqrl.core import Agent, Params, Policy

EXPLORATION = "random_action"  # the exploration value: probability of a uniform random action per step


def _cfg(cfg: Config) -> SACConfig:
    assert isinstance(cfg.agent, SACConfig), "the agent section is not SAC's"
    return cfg.agent


def check_config(ac: SACConfig) -> None:
    """What the range checks of the config cannot say about SAC's keys."""
    if ac.log_std_min >= ac.log_std_max:
        raise ConfigError(f"agent.log_std_min ({ac.log_std_min}) must be below agent.log_std_max ({ac.log_std_max})")
    if any(size <= 0 for size in ac.hidden):
        raise ConfigError(f"agent.hidden: layer sizes must be > 0, got {ac.hidden}")
    if ac.target_entropy is not None and not math.isfinite(ac.target_entropy):
        raise ConfigError(f"agent.target_entropy: must be a finite number or null, got {ac.target_entropy}")


class SAC(Algorithm):
    name = "sac"
    config_class = SACConfig
    takes_torso = True  # agent.network_fn: the actor's torso, and a copy under each critic

    def check_spaces(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space) -> None:
        check_config(_cfg(cfg))
        env = f"env.id: {cfg.env.id!r}"
        if not isinstance(action_space, gym.spaces.Box):
            raise ConfigError(f"{env} has action space {action_space}; agent.algo=sac needs a Box (for Discrete "
                              "actions use agent.algo=dqn, e.g. configs/cartpole_dqn.yaml)")
        if len(action_space.shape) != 1:
            raise ConfigError(f"{env} has action space {action_space}; agent.algo=sac needs 1-D Box actions")
        low, high = np.asarray(action_space.low, np.float64), np.asarray(action_space.high, np.float64)
        if not (np.isfinite(low).all() and np.isfinite(high).all() and (high > low).all()):
            raise ConfigError(f"{env} has action space {action_space}; agent.algo=sac needs finite bounds with "
                              "low < high in every dimension (for Discrete actions use agent.algo=dqn)")
        if not isinstance(obs_space, gym.spaces.Box) or (len(obs_space.shape) != 1 and not cfg.agent.network_fn):
            raise ConfigError(f"{env} has observation space {obs_space}; agent.algo=sac needs a 1-D Box "
                              "(vector observations), or any Box under a torso of your own (agent.network_fn)")

    def make_policy(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                    seed: int = 0, backend: str = "auto", device: str = "cpu") -> Policy:
        ac = _cfg(cfg)
        assert isinstance(action_space, gym.spaces.Box)
        if resolve_backend(backend, not ac.network_fn, device) == "numpy":
            from zmqrl.agents.sac.numpy_policy import NumpySACPolicy

            return NumpySACPolicy(ac, obs_space, action_space, seed=seed)
        import torch

        from zmqrl.agents.sac.agent import SACPolicy

        torch.set_num_threads(1)
        return SACPolicy(ac, obs_space, action_space, device, seed)

    def exploration(self, cfg: Config, actor_index: int | None) -> Exploration:
        """``zmqrl train``: uniform random actions for the first ``agent.random_steps`` env steps,
        then policy samples; distributed actors always sample the policy."""
        if actor_index is None:
            random_steps = _cfg(cfg).random_steps
            return Exploration(EXPLORATION, lambda steps: 1.0 if steps < random_steps else 0.0)
        return constant(EXPLORATION, 0.0)

    def make_agent(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                   device: Any = "cpu", seed: int = 0) -> Agent:
        from zmqrl.agents.sac.agent import SACAgent

        assert isinstance(action_space, gym.spaces.Box)
        check_config(_cfg(cfg))
        return SACAgent(_cfg(cfg), obs_space, action_space, device, seed)

    def initial_params(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                       seed: int) -> Params | None:
        """The actor drawn like torch's default init, with the torch actor's names and shapes; None for a torso
        of the user's own (the learner builds it first)."""
        from zmqrl.agents.sac.numpy_policy import actor_param_shapes

        if _cfg(cfg).network_fn:
            return None

        obs_dim, act_dim = int(np.prod(obs_space.shape or ())), int(np.prod(action_space.shape or ()))
        return torch_default_init(actor_param_shapes(_cfg(cfg), obs_dim, act_dim), seed)


ALGORITHM = SAC()
