"""SAC's networks: a Gaussian actor (mean and clamped log-std heads) and an ensemble of Q critics."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def relu_mlp(in_features: int, hidden: Sequence[int]) -> tuple[nn.Sequential, int]:
    """Linear+ReLU pairs (Linear layers at even indices, as the numpy policy reads them) and
    the width of their output."""
    layers: list[nn.Module] = []
    last = in_features
    for size in hidden:
        layers += [nn.Linear(last, size), nn.ReLU()]
        last = size
    return nn.Sequential(*layers), last


class Actor(nn.Module):
    """Observation -> mean and log standard deviation (clamped) of a Gaussian over pre-tanh actions."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int], log_std_min: float,
                 log_std_max: float) -> None:
        super().__init__()
        self.torso, last = relu_mlp(obs_dim, hidden)
        self.mean = nn.Linear(last, act_dim)
        self.log_std = nn.Linear(last, act_dim)
        self.log_std_min = log_std_min
        self.log_std_max = log_std_max

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.torso(obs.float().flatten(1))
        return self.mean(x), self.log_std(x).clamp(self.log_std_min, self.log_std_max)


class Critics(nn.Module):
    """``n`` independent Q-networks over the concatenated observation and action in [-1, 1]."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int], n: int) -> None:
        super().__init__()

        def q_network() -> nn.Sequential:
            torso, last = relu_mlp(obs_dim + act_dim, hidden)
            return nn.Sequential(*torso, nn.Linear(last, 1))

        self.q = nn.ModuleList(q_network() for _ in range(n))

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Q-values of every critic, shape ``(n, batch)``."""
        x = torch.cat([obs.float().flatten(1), action], dim=1)
        return torch.stack([q(x).squeeze(1) for q in self.q])
