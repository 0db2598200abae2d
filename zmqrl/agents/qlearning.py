"""What the two Q-learning algorithms, DQN and IQN, share (torch-free): their common ``agent:`` keys
(:class:`QLearningConfig`) and their seam entries (:class:`DiscreteQAlgorithm`): Discrete actions over
an MLP or a Nature CNN, a numpy policy for the MLP, ε-greedy exploration (Ape-X's per actor),
version-0 parameters drawn with numpy for the MLP. An algorithm names its own classes by import
path, so nothing here (or in its ``__init__``) imports torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import gymnasium as gym
import numpy as np

from zmqrl.agents.base import Algorithm, Exploration, check_discrete_spaces, epsilon_exploration, resolve_backend
from zmqrl.config import AgentConfig, Config

if TYPE_CHECKING:
    from zmqrl.core import Agent, Params, Policy


@dataclass
class QLearningConfig(AgentConfig):
    """The keys DQN and IQN share: optimiser, target network and the single-process ε schedule."""

    network: str = "mlp"  # mlp (vector observations) or nature_cnn (image observations)
    lr: float = 1e-3  # Adam learning rate
    adam_eps: float = 1e-8  # Adam epsilon
    max_grad_norm: float = 10.0  # gradient clipping by global norm; 0 disables
    target_update_interval: int = 500  # optimisation steps between target updates
    tau: float = 1.0  # 1.0 = hard copy, < 1.0 = soft (Polyak) update every interval
    eps_start: float = 1.0  # epsilon at the start of the schedule (single-process trainer)
    eps_end: float = 0.05  # epsilon at the end of the schedule
    eps_decay_steps: int = 10_000  # env steps over which epsilon decays linearly

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"network": ("mlp", "nature_cnn")}
    POSITIVE: ClassVar[tuple[str, ...]] = ("lr", "adam_eps", "target_update_interval", "tau")
    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = ("tau", "eps_start", "eps_end")
    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("max_grad_norm", "eps_decay_steps")


def _load(path: str) -> Any:
    """``module:name`` imported (on use: an algorithm's torch classes load only when asked for)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


class DiscreteQAlgorithm(Algorithm):
    """Seam entries of a Q-learning algorithm over Discrete actions; a subclass names its classes."""

    config_class: type[QLearningConfig] = QLearningConfig
    takes_torso = True  # agent.network_fn: the user's torso under the Q head (DQN) or the quantile embedding (IQN)
    numpy_policy = ""  # module:class of the numpy policy for the MLP
    torch_policy = ""  # module:class of the torch policy
    agent_class = ""  # module:class of the learner's agent
    initial_mlp_params = ""  # module:function(config, obs_dim, num_actions, seed) -> Params

    def agent_config(self, cfg: Config) -> QLearningConfig:
        assert isinstance(cfg.agent, self.config_class), f"the agent section is not {self.name}'s"
        return cfg.agent

    def check(self, ac: Any) -> None:
        """What the range checks of the config cannot say about this algorithm's keys (ConfigError)."""

    def class_args(self, cfg: Config) -> tuple[Any, ...]:
        """What this algorithm's policy and agent classes take after its agent section (DQN, IQN: nothing)."""
        return ()

    def check_spaces(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space) -> None:
        self.check(self.agent_config(cfg))
        ac = self.agent_config(cfg)
        check_discrete_spaces(cfg, obs_space, action_space, "" if ac.network_fn else ac.network)

    def make_policy(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                    seed: int = 0, backend: str = "auto", device: str = "cpu") -> Policy:
        ac = self.agent_config(cfg)
        assert isinstance(action_space, gym.spaces.Discrete)
        if resolve_backend(backend, ac.network == "mlp" and not ac.network_fn, device) == "numpy":
            numpy_policy = _load(self.numpy_policy)
            policy: Policy = numpy_policy(ac, *self.class_args(cfg), obs_space, action_space, seed=seed)
            return policy
        import torch

        torch.set_num_threads(1)
        torch_policy = _load(self.torch_policy)
        policy = torch_policy(ac, *self.class_args(cfg), obs_space, action_space, device, seed)
        return policy

    def exploration(self, cfg: Config, actor_index: int | None) -> Exploration:
        """ε-greedy: a linear decay in ``zmqrl train``; Ape-X's fixed ε per actor index otherwise."""
        return epsilon_exploration(cfg, actor_index)

    def make_agent(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                   device: Any = "cpu", seed: int = 0) -> Agent:
        assert isinstance(action_space, gym.spaces.Discrete)
        ac = self.agent_config(cfg)
        self.check(ac)
        agent: Agent = _load(self.agent_class)(ac, *self.class_args(cfg), obs_space, action_space, device, seed)
        return agent

    def initial_params(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                       seed: int) -> Params | None:
        """The MLP network drawn like torch's default init; None for the CNN (built first)."""
        ac = self.agent_config(cfg)
        if ac.network != "mlp" or ac.network_fn or not isinstance(action_space, gym.spaces.Discrete):
            return None
        draw: Callable[..., Params] = _load(self.initial_mlp_params)
        return draw(ac, int(np.prod(obs_space.shape or ())), int(action_space.n), seed)
