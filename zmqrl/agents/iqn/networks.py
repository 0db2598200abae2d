"""Implicit quantile networks: DQN's torso, a cosine embedding of tau, a multiplicative merge, a head.

``Z_tau(x, a) = head(torso(x) * relu(embed(cos(pi * i * tau))))[a]``, ``i = 0 .. embed_dim - 1``
(Dabney et al. 2018, eq. 4). The torsos are DQN's own (:mod:`zmqrl.agents.dqn.networks`), taken
from its networks rather than copied, so an IQN and a DQN over the same observations see them
through the same layers and parameter names; observations are prepared as DQN does (flattened
float rows for the MLP, uint8 frames scaled by 1/255 for the Nature CNN).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from zmqrl.agents.dqn.networks import MLPQNetwork, NatureCNNQNetwork

NATURE_CNN_FEATURES = 64 * 7 * 7
NATURE_CNN_HEAD = 512  # the hidden layer after the merge in Dabney et al. (2018), as in DQN's Nature head


def cosine_features(taus: torch.Tensor, embed_dim: int) -> torch.Tensor:
    """``cos(pi * i * tau)`` for ``i = 0 .. embed_dim - 1``: shape ``taus.shape + (embed_dim,)``."""
    i = math.pi * torch.arange(embed_dim, device=taus.device, dtype=torch.float32)
    return torch.cos(taus.float().unsqueeze(-1) * i)


class IQNNetwork(nn.Module):
    """``forward(obs, taus)``: observations ``(B, ...)`` and fractions ``(B, T)`` -> quantiles ``(B, T, A)``."""

    def __init__(self, torso: nn.Module, features: int, num_actions: int, embed_dim: int,
                 head_hidden: Sequence[int], pixels: bool) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        self.pixels = pixels
        self.torso = torso
        self.embed = nn.Linear(embed_dim, features)
        layers: list[nn.Module] = []
        last = features
        for size in head_hidden:
            layers += [nn.Linear(last, size), nn.ReLU()]
            last = size
        layers.append(nn.Linear(last, num_actions))
        self.head = nn.Sequential(*layers)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """State features ``(B, d)``, with the observation prepared exactly as DQN's networks do."""
        if self.pixels:
            return self.torso(obs.float() / 255.0)  # type: ignore[no-any-return]
        return self.torso(obs.float().flatten(1))  # type: ignore[no-any-return]

    def quantiles(self, features: torch.Tensor, taus: torch.Tensor) -> torch.Tensor:
        """Quantile values ``(B, T, A)`` from features ``(B, d)`` and fractions ``(B, T)``."""
        embedding = F.relu(self.embed(cosine_features(taus, self.embed_dim)))
        return self.head(features.unsqueeze(1) * embedding)  # type: ignore[no-any-return]

    def forward(self, obs: torch.Tensor, taus: torch.Tensor) -> torch.Tensor:
        return self.quantiles(self.features(obs), taus)


def mlp_iqn(obs_dim: int, num_actions: int, hidden: Sequence[int], head_hidden: Sequence[int],
            embed_dim: int) -> IQNNetwork:
    """An IQN over DQN's MLP torso (Linear+ReLU per ``hidden`` size)."""
    torso = MLPQNetwork(obs_dim, 1, hidden, dueling=False).torso
    return IQNNetwork(torso, hidden[-1] if hidden else obs_dim, num_actions, embed_dim, head_hidden, pixels=False)


def nature_cnn_iqn(in_channels: int, num_actions: int, embed_dim: int) -> IQNNetwork:
    """An IQN over DQN's Nature CNN torso (3136 features), with the published 512-unit head."""
    torso = NatureCNNQNetwork(in_channels, 1, dueling=False).torso
    return IQNNetwork(torso, NATURE_CNN_FEATURES, num_actions, embed_dim, [NATURE_CNN_HEAD], pixels=True)
