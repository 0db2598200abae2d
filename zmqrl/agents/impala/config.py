"""IMPALA's and APPO's ``agent:`` sections (torch-free).

IMPALA's defaults are the paper's (Espeholt et al. 2018: V-trace with rho-bar = c-bar = 1, baseline
cost 0.5, entropy cost 0.01, RMSProp, gradient clipping at 40, batches of 32 unrolls of 20 steps; the
learning rate and RMSProp's settings are TorchBeast's, not re-checked at the source); APPO's are
Sample Factory's (Petrenko et al. 2020, its documented defaults: rollout 32, PPO clip ratio 0.1, one
epoch, advantages normalised, Adam; not re-checked at the source). Per-env configs in ``configs/`` say
where their own values come from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from zmqrl.config import AgentConfig


@dataclass
class ImpalaConfig(AgentConfig):
    """IMPALA (Espeholt et al. 2018): an actor-critic trained on actors' segments with V-trace."""

    algo: str = "impala"  # the algorithm: a name from `zmqrl config` (zmqrl.config.algorithms.ALGORITHMS)
    network: str = "mlp"  # mlp (vector observations: separate policy and value nets) or nature_cnn (frames: shared)
    hidden: list[int] = field(default_factory=lambda: [64, 64])  # MLP layer sizes (nature_cnn: after the convs)
    activation: str = "tanh"  # tanh or relu, between the MLP's layers
    lstm_size: int = 0  # an LSTM of this many units after the MLP (policy and value read it; mlp only); 0: none
    unroll_length: int = 20  # env steps per segment an actor sends (IMPALA, Atari: 20)
    batch_size: int = 32  # segments per optimisation step (IMPALA: 32)
    epochs: int = 1  # optimisation steps (passes) on each batch of segments (PPO's epochs over a rollout)
    minibatches: int = 1  # gradient steps per pass: the batch's segments shuffled and split into this many (PPO's)
    gamma: float = 0.99  # discount factor
    n_step: int = 1  # not used: V-trace's targets run to each segment's end (agent.unroll_length)
    trace_lambda: float = 1.0  # V-trace's lambda: c_s = lambda * min(c_bar, rho_s) (IMPALA remark 2); 1 = none
    rho_bar: float = 1.0  # truncation of the importance weights in the V-trace targets and the policy gradient
    c_bar: float = 1.0  # truncation of the trace-cutting coefficients c_s
    clip_ratio: float = 0.0  # PPO's clipped surrogate with this epsilon (APPO); 0: IMPALA's policy gradient
    normalize_advantages: bool = False  # advantages to mean 0, std 1 over each batch's trained steps
    vf_coef: float = 0.5  # weight of the value loss 0.5 * (v_s - V(x_s))^2 (IMPALA's baseline cost 0.5)
    ent_coef: float = 0.01  # weight of the entropy bonus at the start (IMPALA ~0.01)
    ent_coef_end: float | None = None  # the entropy weight at trainer.max_opts (linear); None: ent_coef throughout
    lr: float = 4.8e-4  # learning rate at the start (TorchBeast's IMPALA default, with RMSProp; not re-checked)
    lr_schedule: str = "constant"  # constant, or linear: to 0 at trainer.max_opts
    optimizer: str = "rmsprop"  # rmsprop (IMPALA) or adam
    adam_eps: float = 1e-5  # Adam epsilon
    rmsprop_alpha: float = 0.99  # RMSProp decay (IMPALA)
    rmsprop_eps: float = 0.01  # RMSProp epsilon (IMPALA, TorchBeast: 0.01)
    max_grad_norm: float = 40.0  # gradient clipping by global norm; 0 disables (IMPALA: 40)
    log_std_init: float = 0.0  # Box actions: the Gaussian's state-independent log-std at the start
    log_std_min: float = -5.0  # Box actions: lower clamp of the log-std (bounds a log-density from above)
    normalize_observations: bool = False  # observations to running mean 0, std 1 before the torsos (mlp only)
    obs_clip: float = 10.0  # normalised observations clipped to +-this (SB3's VecNormalize: 10)

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"network": ("mlp", "nature_cnn"), "activation": ("tanh", "relu"),
                                                     "lr_schedule": ("constant", "linear"),
                                                     "optimizer": ("rmsprop", "adam")}
    POSITIVE: ClassVar[tuple[str, ...]] = ("unroll_length", "epochs", "minibatches", "rho_bar", "c_bar", "lr",
                                           "adam_eps", "rmsprop_eps", "obs_clip")
    UNIT_INTERVAL: ClassVar[tuple[str, ...]] = ("trace_lambda", "rmsprop_alpha")
    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("clip_ratio", "vf_coef", "ent_coef", "max_grad_norm", "lstm_size")


@dataclass
class APPOConfig(ImpalaConfig):
    """APPO (Sample Factory, RLlib): V-trace targets with PPO's clipped surrogate, optionally several epochs."""

    algo: str = "appo"  # the algorithm: a name from `zmqrl config` (zmqrl.config.algorithms.ALGORITHMS)
    unroll_length: int = 32  # env steps per segment an actor sends (Sample Factory's rollout: 32)
    clip_ratio: float = 0.1  # PPO's clip epsilon (Sample Factory: 0.1)
    normalize_advantages: bool = True  # advantages to mean 0, std 1 over each batch's trained steps (Sample Factory)
    lr: float = 1e-4  # learning rate (Sample Factory: 1e-4)
    optimizer: str = "adam"  # rmsprop or adam (Sample Factory: Adam)
    adam_eps: float = 1e-6  # Adam epsilon (Sample Factory)
    ent_coef: float = 0.003  # entropy weight (Sample Factory's exploration_loss_coeff: 0.003)
    max_grad_norm: float = 4.0  # gradient clipping by global norm (Sample Factory: 4.0)
