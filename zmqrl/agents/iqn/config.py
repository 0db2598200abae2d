"""IQN's ``agent:`` section (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from zmqrl.config import AgentConfig


@dataclass
class IQNConfig(AgentConfig):
    """Implicit quantile networks (Dabney et al. 2018): quantile Huber loss over sampled fractions tau."""

    algo: str = "iqn"  # the algorithm: a name from `zmqrl config` (zmqrl.config.algorithms.ALGORITHMS)
    network: str = "mlp"  # mlp (vector observations) or nature_cnn (image observations; head of 512 as published)
    hidden: list[int] = field(default_factory=lambda: [64, 64])  # MLP torso layer sizes: the state features
    head_hidden: list[int] = field(default_factory=lambda: [64])  # MLP layers between the merge and the outputs
    embed_dim: int = 64  # cosine embedding size: cos(pi * i * tau) for i = 0 .. embed_dim - 1
    n_quantiles: int = 64  # N: fractions tau sampled for the predicted quantiles in the loss
    n_target_quantiles: int = 64  # N': fractions tau' sampled for the target quantiles in the loss
    n_act_quantiles: int = 32  # K: fractions whose quantiles are averaged into Q for acting and actor priorities
    kappa: float = 1.0  # threshold of the quantile Huber loss
    double: bool = False  # pick the target action with the online network (double-DQN style)
    lr: float = 1e-3  # Adam learning rate
    adam_eps: float = 1e-8  # Adam epsilon
    max_grad_norm: float = 10.0  # gradient clipping by global norm; 0 disables
    target_update_interval: int = 500  # optimisation steps between target updates
    tau: float = 1.0  # 1.0 = hard copy, < 1.0 = soft (Polyak) update every interval
    eps_start: float = 1.0  # epsilon at the start of the schedule (single-process trainer)
    eps_end: float = 0.05  # epsilon at the end of the schedule
    eps_decay_steps: int = 10_000  # env steps over which epsilon decays linearly

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"network": ("mlp", "nature_cnn")}
    POSITIVE: ClassVar[tuple[str, ...]] = ("embed_dim", "n_quantiles", "n_target_quantiles", "n_act_quantiles",
                                           "kappa", "lr", "adam_eps", "target_update_interval", "tau")
    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = ("tau", "eps_start", "eps_end")
    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("max_grad_norm", "eps_decay_steps")
