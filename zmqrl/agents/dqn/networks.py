"""Q-networks: an MLP for vector observations and the Nature CNN for stacked frames."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class QHead(nn.Module):
    """Maps features to Q-values; optionally dueling (value + centred advantages)."""

    def __init__(self, in_features: int, num_actions: int, dueling: bool, hidden: int = 0) -> None:
        super().__init__()
        self.dueling = dueling

        def branch(out: int) -> nn.Module:
            if hidden:
                return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, out))
            return nn.Linear(in_features, out)

        self.advantage = branch(num_actions)
        self.value = branch(1) if dueling else None

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        adv = self.advantage(features)
        if self.value is None:
            return adv
        return self.value(features) + adv - adv.mean(dim=1, keepdim=True)


class MLPQNetwork(nn.Module):
    """Fully connected torso with ReLU, then a Q head."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: Sequence[int], dueling: bool) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        last = obs_dim
        for size in hidden:
            layers += [nn.Linear(last, size), nn.ReLU()]
            last = size
        self.torso = nn.Sequential(*layers)
        self.head = QHead(last, num_actions, dueling)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.torso(obs.float().flatten(1)))


class NatureCNNQNetwork(nn.Module):
    """The DQN Nature CNN over (C, 84, 84) uint8 frames scaled to [0, 1]."""

    def __init__(self, in_channels: int, num_actions: int, dueling: bool) -> None:
        super().__init__()
        self.torso = nn.Sequential(
            nn.Conv2d(in_channels, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )
        self.head = QHead(64 * 7 * 7, num_actions, dueling, hidden=512)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.torso(obs.float() / 255.0))
