"""DQN's ``agent:`` section (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from zmqrl.config import AgentConfig


@dataclass
class DQNConfig(AgentConfig):
    """Double, dueling, n-step DQN with Huber loss and clipped gradients (Ape-X's learner)."""

    algo: str = "dqn"  # the algorithm: a name from `zmqrl config` (zmqrl.config.algorithms.ALGORITHMS)
    network: str = "mlp"  # mlp (vector observations) or nature_cnn (image observations)
    hidden: list[int] = field(default_factory=lambda: [64, 64])  # MLP layer sizes
    dueling: bool = True  # dueling value/advantage heads
    double: bool = True  # double DQN targets
    lr: float = 1e-3  # Adam learning rate
    adam_eps: float = 1e-8  # Adam epsilon
    loss: str = "huber"  # huber or mse
    max_grad_norm: float = 10.0  # gradient clipping by global norm; 0 disables
    target_update_interval: int = 500  # optimisation steps between target updates
    tau: float = 1.0  # 1.0 = hard copy, < 1.0 = soft (Polyak) update every interval
    eps_start: float = 1.0  # epsilon at the start of the schedule (single-process trainer)
    eps_end: float = 0.05  # epsilon at the end of the schedule
    eps_decay_steps: int = 10_000  # env steps over which epsilon decays linearly

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"network": ("mlp", "nature_cnn"), "loss": ("huber", "mse")}
    POSITIVE: ClassVar[tuple[str, ...]] = ("lr", "target_update_interval", "tau")
    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = ("tau", "eps_start", "eps_end")
    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("max_grad_norm", "eps_decay_steps")
