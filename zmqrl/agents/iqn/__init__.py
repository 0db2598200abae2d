"""IQN through the algorithm seam: implicit quantile networks (Dabney et al. 2018), n-step,
prioritized, Ape-X exploration per actor.

Torch-free at import: the torch agent and policy load only when asked for.
"""

from __future__ import annotations

from zmqrl.agents.iqn.config import IQNConfig
from zmqrl.agents.qlearning import DiscreteQAlgorithm
from zmqrl.config import ConfigError


def check_config(ac: IQNConfig) -> None:
    """What the range checks of the config cannot say about IQN's keys."""
    for key in ("hidden", "head_hidden"):
        sizes = getattr(ac, key)
        if any(size <= 0 for size in sizes):
            raise ConfigError(f"agent.{key}: layer sizes must be > 0, got {sizes}")


class IQN(DiscreteQAlgorithm):
    name = "iqn"
    config_class = IQNConfig
    numpy_policy = "zmqrl.agents.iqn.numpy_policy:NumpyIQNPolicy"
    torch_policy = "zmqrl.agents.iqn.agent:IQNPolicy"
    agent_class = "zmqrl.agents.iqn.agent:IQNAgent"
    initial_mlp_params = "zmqrl.agents.iqn.numpy_policy:initial_mlp_params"

    def check(self, ac: IQNConfig) -> None:
        check_config(ac)


ALGORITHM = IQN()
