"""IQN's ``agent:`` section (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from zmqrl.agents.qlearning import QLearningConfig


@dataclass
class IQNConfig(QLearningConfig):
    """Implicit quantile networks (Dabney et al. 2018): quantile Huber loss over sampled fractions tau."""

    algo: str = "iqn"  # the algorithm: a name from `zmqrl config` (zmqrl.config.algorithms.ALGORITHMS)
    hidden: list[int] = field(default_factory=lambda: [64, 64])  # MLP torso layer sizes: the state features
    head_hidden: list[int] = field(default_factory=lambda: [64])  # MLP layers between the merge and the outputs
    embed_dim: int = 64  # cosine embedding size: cos(pi * i * tau) for i = 0 .. embed_dim - 1
    n_quantiles: int = 64  # N: fractions tau sampled for the predicted quantiles in the loss
    n_target_quantiles: int = 64  # N': fractions tau' sampled for the target quantiles in the loss
    n_act_quantiles: int = 32  # K: fractions whose quantiles are averaged into Q for acting and actor priorities
    kappa: float = 1.0  # threshold of the quantile Huber loss
    double: bool = False  # pick the target action with the online network (double-DQN style)

    POSITIVE: ClassVar[tuple[str, ...]] = (*QLearningConfig.POSITIVE, "embed_dim", "n_quantiles", "n_target_quantiles",
                                           "n_act_quantiles", "kappa")
