"""R2D2's ``agent:`` section (torch-free).

Defaults are R2D2's Atari settings: the paper's table 2 (Kapturowski et al. 2019), SEED RL's
``agents/r2d2`` and Acme's ``r2d2`` config, which agree on everything below but the learning rate
(paper 1e-4; SEED's Atari binary 4.8e-4; Acme 1e-3). The sequence layout itself (burn-in,
trained length, overlap) is replay's: ``replay.burn_in``, ``replay.sequence_length``,
``replay.overlap``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from zmqrl.agents.qlearning import QLearningConfig


@dataclass
class R2D2Config(QLearningConfig):
    """Recurrent replay DQN (Kapturowski et al. 2019): an LSTM Q-network trained on stored sequences."""

    algo: str = "r2d2"  # the algorithm: a name from `zmqrl config` (zmqrl.config.algorithms.ALGORITHMS)
    gamma: float = 0.997  # discount factor (R2D2, SEED RL, Acme)
    n_step: int = 5  # n-step returns inside a sequence, fewer at its end (R2D2, SEED RL, Acme)
    batch_size: int = 64  # sequence items per optimisation step (R2D2, Acme)
    lr: float = 1e-4  # Adam learning rate (R2D2 table 2; SEED's Atari binary 4.8e-4)
    adam_eps: float = 1e-3  # Adam epsilon (R2D2 table 2, SEED RL)
    max_grad_norm: float = 40.0  # gradient clipping by global norm; 0 disables (R2D2, SEED RL)
    target_update_interval: int = 2500  # optimisation steps between target copies (R2D2, Acme)
    hidden: list[int] = field(default_factory=lambda: [512])  # layers before the LSTM (after the convs: nature_cnn)
    lstm_size: int = 512  # LSTM units (R2D2, SEED RL, Acme)
    head_hidden: int = 512  # hidden units of each dueling stream after the LSTM (SEED RL: 512); 0: linear heads
    dueling: bool = True  # dueling value/advantage heads
    double: bool = True  # double Q targets: the online network picks the bootstrap action
    value_rescaling: bool = True  # targets through h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x and its inverse
    rescale_eps: float = 1e-3  # eps of the value rescaling h (R2D2, SEED RL)
    priority_eta: float = 0.9  # a sequence's priority: eta * max + (1 - eta) * mean of its |TD| (R2D2)

    POSITIVE: ClassVar[tuple[str, ...]] = (*QLearningConfig.POSITIVE, "lstm_size", "rescale_eps")
    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = (*QLearningConfig.UNIT_INTERVAL, "priority_eta")
    NON_NEGATIVE: ClassVar[tuple[str, ...]] = (*QLearningConfig.NON_NEGATIVE, "head_hidden")
    SEQUENCES: ClassVar[bool] = True
