"""R2D2's recurrent Q-network: DQN's torso, an LSTM, dueling heads (SEED RL's ``DuelingLSTMDQNNet``
without the previous action and reward as inputs).

The torsos are DQN's own (:func:`~zmqrl.agents.dqn.networks.mlp_torso`,
:func:`~zmqrl.agents.dqn.networks.nature_cnn_torso`), observations prepared as DQN prepares them
(flattened float rows for the MLP, uint8 frames scaled by 1/255 for the Nature CNN). Parameter
names: ``torso.*``, ``lstm.weight_ih_l0``, ``lstm.weight_hh_l0``, ``lstm.bias_ih_l0``,
``lstm.bias_hh_l0`` (torch's gate order i, f, g, o; the forget gate's bias starts 1 higher than torch's,
:data:`~zmqrl.agents.r2d2.numpy_policy.FORGET_BIAS`), ``head.*`` (:class:`~zmqrl.agents.dqn.networks.QHead`).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from zmqrl.agents.dqn.networks import NATURE_CNN_FEATURES, QHead, mlp_torso, nature_cnn_torso
from zmqrl.agents.r2d2.config import R2D2Config
from zmqrl.agents.r2d2.numpy_policy import FORGET_BIAS
from zmqrl.agents.torso import user_torso
from zmqrl.config import ConfigError

State = tuple[torch.Tensor, torch.Tensor]  # (h, c), each (B, lstm_size)


class R2D2Network(nn.Module):
    """``forward(obs, state, hold)``: observations ``(B, T, ...)`` from the state ``(h, c)`` -> Q ``(B, T, A)``
    and the state after the last step."""

    def __init__(self, torso: nn.Module, features: int, lstm_size: int, num_actions: int, dueling: bool,
                 head_hidden: int, pixels: bool) -> None:
        super().__init__()
        self.pixels = pixels
        self.torso = torso
        self.lstm = nn.LSTM(features, lstm_size, batch_first=True)
        with torch.no_grad():
            forget = self.lstm.bias_ih_l0[lstm_size:2 * lstm_size]  # type: ignore[index]
            forget += FORGET_BIAS
        self.head = QHead(lstm_size, num_actions, dueling, hidden=head_hidden)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """Torso features ``(B, T, F)`` of observations ``(B, T, ...)``."""
        b, t = obs.shape[:2]
        rows = obs.reshape(b * t, *obs.shape[2:])
        x = rows.float() / 255.0 if self.pixels else rows.float().flatten(1)
        return self.torso(x).reshape(b, t, -1)  # type: ignore[no-any-return]

    def core(self, features: torch.Tensor, state: State, hold: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, State]:
        """The LSTM over ``features`` ``(B, T, F)`` from ``state``: outputs ``(B, T, H)`` and the last state.

        Where ``hold`` ``(B, T)`` is True the step leaves the state as it was (padding before an
        episode's start, so its first real step sees the state stored for it). Without ``hold``,
        torch's whole-sequence kernel runs; with it, one step at a time (callers pass it only where
        something is held, decided on the host: no wait for the device here).
        """
        h, c = state
        if hold is None:
            out, (h_n, c_n) = self.lstm(features, (h.unsqueeze(0).contiguous(), c.unsqueeze(0).contiguous()))
            return out, (h_n[0], c_n[0])
        outputs = []
        for t in range(features.shape[1]):
            _, (h_t, c_t) = self.lstm(features[:, t:t + 1], (h.unsqueeze(0).contiguous(), c.unsqueeze(0).contiguous()))
            keep = hold[:, t:t + 1]
            h, c = torch.where(keep, h, h_t[0]), torch.where(keep, c, c_t[0])
            outputs.append(h)
        return torch.stack(outputs, dim=1), (h, c)

    def q_values(self, core_out: torch.Tensor) -> torch.Tensor:
        """Q ``(B, T, A)`` of LSTM outputs ``(B, T, H)``."""
        b, t = core_out.shape[:2]
        return self.head(core_out.reshape(b * t, -1)).reshape(b, t, -1)  # type: ignore[no-any-return]

    def forward(self, obs: torch.Tensor, state: State, hold: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, State]:
        out, last = self.core(self.features(obs), state, hold)
        return self.q_values(out), last


def build_r2d2_network(cfg: R2D2Config, obs_space: gym.spaces.Space, num_actions: int) -> R2D2Network:
    """The network the config asks for, sized for the observation space."""
    shape = obs_space.shape or ()
    if cfg.network_fn:  # the user's torso, then R2D2's LSTM and heads
        user, features = user_torso(cfg, obs_space)
        return R2D2Network(user, features, cfg.lstm_size, num_actions, cfg.dueling, cfg.head_hidden, pixels=False)
    if cfg.network == "nature_cnn":
        if len(shape) != 3:
            raise ConfigError(f"agent.network: nature_cnn needs (C, H, W) observations, got shape {shape}")
        torso = nn.Sequential(*nature_cnn_torso(shape[0]), *mlp_torso(NATURE_CNN_FEATURES, cfg.hidden))
        features = cfg.hidden[-1] if cfg.hidden else NATURE_CNN_FEATURES
        pixels = True
    else:
        obs_dim = int(np.prod(shape))
        torso = mlp_torso(obs_dim, cfg.hidden)
        features = cfg.hidden[-1] if cfg.hidden else obs_dim
        pixels = False
    return R2D2Network(torso, features, cfg.lstm_size, num_actions, cfg.dueling, cfg.head_hidden, pixels)
