"""SAC's ``agent:`` section (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from zmqrl.config import AgentConfig


@dataclass
class SACConfig(AgentConfig):
    """Soft actor-critic: twin critics, tanh-squashed Gaussian actor, automatic entropy tuning."""

    algo: str = "sac"  # the algorithm: a name from `zmqrl config` (zmqrl.config.algorithms.ALGORITHMS)
    n_step: int = 1  # n-step returns (1 is SAC as published)
    batch_size: int = 256  # transitions per optimisation step
    hidden: list[int] = field(default_factory=lambda: [256, 256])  # MLP layer sizes of the actor and each critic
    n_critics: int = 2  # critics; targets bootstrap from the minimum over their target copies
    actor_lr: float = 3e-4  # Adam learning rate of the actor
    critic_lr: float = 3e-4  # Adam learning rate of the critics
    alpha_lr: float = 3e-4  # Adam learning rate of log(alpha) when auto_alpha is on
    adam_eps: float = 1e-8  # Adam epsilon (all three optimisers)
    tau: float = 0.005  # Polyak factor: target <- (1 - tau) * target + tau * critic
    target_update_interval: int = 1  # optimisation steps between Polyak updates of the target critics
    loss: str = "mse"  # critic loss: mse (0.5 * td^2) or huber (smooth L1)
    max_grad_norm: float = 0.0  # gradient clipping by global norm, per network; 0 disables
    auto_alpha: bool = True  # tune the entropy coefficient alpha toward target_entropy
    init_alpha: float = 1.0  # alpha at the start (auto_alpha) or throughout (fixed)
    target_entropy: float | None = None  # entropy alpha aims for; None means -dim(A)
    log_std_min: float = -20.0  # lower clamp of the actor's log standard deviation
    log_std_max: float = 2.0  # upper clamp of the actor's log standard deviation
    random_steps: int = 10_000  # `zmqrl train`: uniformly random actions for this many env steps first

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"loss": ("mse", "huber")}
    POSITIVE: ClassVar[tuple[str, ...]] = ("n_critics", "actor_lr", "critic_lr", "alpha_lr", "adam_eps", "tau",
                                           "target_update_interval", "init_alpha")
    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = ("tau",)
    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("max_grad_norm", "random_steps")
