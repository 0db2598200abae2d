"""DQN through the algorithm seam: double, dueling, n-step, prioritized (Ape-X's learner).

Torch-free at import: the torch agent and policy load only when asked for.
"""

from __future__ import annotations

from zmqrl.agents.dqn.config import DQNConfig
from zmqrl.agents.qlearning import DiscreteQAlgorithm


class DQN(DiscreteQAlgorithm):
    name = "dqn"
    config_class = DQNConfig
    numpy_policy = "zmqrl.agents.dqn.numpy_policy:NumpyMLPPolicy"
    torch_policy = "zmqrl.agents.dqn.agent:DQNPolicy"
    agent_class = "zmqrl.agents.dqn.agent:DQNAgent"
    initial_mlp_params = "zmqrl.agents.dqn.numpy_policy:initial_mlp_params"


ALGORITHM = DQN()
