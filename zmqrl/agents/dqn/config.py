"""DQN's ``agent:`` section (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from zmqrl.agents.qlearning import QLearningConfig


@dataclass
class DQNConfig(QLearningConfig):
    """Double, dueling, n-step DQN with Huber loss and clipped gradients (Ape-X's learner)."""

    algo: str = "dqn"  # the algorithm: a name from `zmqrl config` (zmqrl.config.algorithms.ALGORITHMS)
    hidden: list[int] = field(default_factory=lambda: [64, 64])  # MLP layer sizes
    dueling: bool = True  # dueling value/advantage heads
    double: bool = True  # double DQN targets
    loss: str = "huber"  # huber or mse

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {**QLearningConfig.CHOICES, "loss": ("huber", "mse")}
