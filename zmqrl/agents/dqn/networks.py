"""Q-networks: an MLP for vector observations, the Nature CNN for stacked frames, or a torso of the user's.

Their torsos are built by :func:`mlp_torso` and :func:`nature_cnn_torso`, which other algorithms'
networks (R2D2's) use too, so the same observations go through the same layers and parameter names.
"""

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


NATURE_CNN_FEATURES = 64 * 7 * 7  # what the Nature CNN's conv stack gives for 84x84 frames


def mlp_torso(in_features: int, hidden: Sequence[int]) -> nn.Sequential:
    """Linear+ReLU per ``hidden`` size (an empty stack for ``[]``: the input itself)."""
    layers: list[nn.Module] = []
    last = in_features
    for size in hidden:
        layers += [nn.Linear(last, size), nn.ReLU()]
        last = size
    return nn.Sequential(*layers)


def nature_cnn_torso(in_channels: int) -> nn.Sequential:
    """The Nature DQN conv stack over (C, 84, 84) frames, flattened: :data:`NATURE_CNN_FEATURES` features."""
    return nn.Sequential(
        nn.Conv2d(in_channels, 32, 8, stride=4), nn.ReLU(),
        nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
        nn.Flatten(),
    )


class MLPQNetwork(nn.Module):
    """Fully connected torso with ReLU, then a Q head."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: Sequence[int], dueling: bool) -> None:
        super().__init__()
        self.torso = mlp_torso(obs_dim, hidden)
        self.head = QHead(hidden[-1] if hidden else obs_dim, num_actions, dueling)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.torso(obs.float().flatten(1)))


class NatureCNNQNetwork(nn.Module):
    """The DQN Nature CNN over (C, 84, 84) uint8 frames scaled to [0, 1]."""

    def __init__(self, in_channels: int, num_actions: int, dueling: bool) -> None:
        super().__init__()
        self.torso = nature_cnn_torso(in_channels)
        self.head = QHead(NATURE_CNN_FEATURES, num_actions, dueling, hidden=512)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.torso(obs.float() / 255.0))


class TorsoQNetwork(nn.Module):
    """A torso of the user's own (``agent.network_fn``, :mod:`zmqrl.agents.torso`) with ``features`` outputs,
    then DQN's Q head."""

    def __init__(self, torso: nn.Module, features: int, num_actions: int, dueling: bool) -> None:
        super().__init__()
        self.torso = torso
        self.head = QHead(features, num_actions, dueling)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.torso(obs))
