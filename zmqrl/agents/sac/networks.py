"""SAC's networks: a Gaussian actor (mean and clamped log-std heads) and a stack of Q critics."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn


def relu_mlp(in_features: int, hidden: Sequence[int]) -> tuple[nn.Sequential, int]:
    """Linear+ReLU pairs (Linear layers at even indices, as the numpy policy reads them) and
    the width of their output."""
    layers: list[nn.Module] = []
    last = in_features
    for size in hidden:
        layers += [nn.Linear(last, size), nn.ReLU(inplace=True)]  # nn.Linear's backward needs no output
        last = size
    return nn.Sequential(*layers), last


class Actor(nn.Module):
    """Observation -> mean and log standard deviation (clamped) of a Gaussian over pre-tanh actions.

    ``torso``: a torso of the user's own and its feature count (``agent.network_fn``) in place of the
    ``hidden`` MLP."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int], log_std_min: float,
                 log_std_max: float, torso: tuple[nn.Module, int] | None = None) -> None:
        super().__init__()
        self.torso: nn.Module
        if torso is None:
            self.torso, last = relu_mlp(obs_dim, hidden)
        else:
            self.torso, last = torso
        self.mean = nn.Linear(last, act_dim)
        self.log_std = nn.Linear(last, act_dim)
        self.log_std_min = log_std_min
        self.log_std_max = log_std_max

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.torso(obs.float().flatten(1))
        return self.mean(x), self.log_std(x).clamp(self.log_std_min, self.log_std_max)


class Critics(nn.Module):
    """``n`` independent Q-networks over the concatenated observation and action in [-1, 1].

    Layer ``i`` of all ``n`` critics is one ``(n, in, out)`` weight and one ``(n, 1, out)`` bias,
    so a forward pass is one batched matmul (``baddbmm``) per layer instead of ``n``: a Pendulum
    update (batch 256, [256, 256]) 5.3 -> 4.9 ms on two threads. Each critic starts as
    ``nn.Linear`` layers would: weights and biases uniform in +-1/sqrt(in).

    ``torsos``: one torso of the user's own per critic and their feature count (``agent.network_fn``);
    each critic's layers then take its torso's features of the observation and the action.
    """

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int], n: int,
                 torsos: tuple[list[nn.Module], int] | None = None) -> None:
        super().__init__()
        self.n = n
        self.torsos = nn.ModuleList(torsos[0]) if torsos is not None else None
        sizes = [(obs_dim if torsos is None else torsos[1]) + act_dim, *hidden, 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in itertools.pairwise(sizes):
            bound = 1.0 / math.sqrt(fan_in)
            self.weights.append(nn.Parameter(torch.empty(n, fan_in, fan_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(n, 1, fan_out).uniform_(-bound, bound)))

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Q-values of every critic, shape ``(n, batch)``."""
        if self.torsos is None:
            x = torch.cat([obs.float().flatten(1), action], dim=1).expand(self.n, -1, -1)
        else:  # each critic's own torso: (n, batch, features), the action beside
            features = torch.stack([torso(obs) for torso in self.torsos])
            x = torch.cat([features, action.expand(self.n, -1, -1)], dim=2)
        last = len(self.weights) - 1
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
            x = torch.baddbmm(bias, x, weight)
            if i < last:
                x = torch.relu_(x)  # baddbmm's backward needs its inputs, not its output
        return x.squeeze(2)


def separate_layout(state: Mapping[str, Any]) -> bool:
    """Whether a critics state dict has the layout before the stack (``q.C.L.weight``: an
    ``nn.Linear`` per critic and layer, at even indices of an ``nn.Sequential``)."""
    return any(key.startswith("q.") for key in state)


def stack_separate_critics(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict of :class:`Critics` from one in the layout before the stack
    (:func:`separate_layout`); a stacked one is returned as it is."""
    if not separate_layout(state):
        return dict(state)
    critics = sorted({int(key.split(".")[1]) for key in state})
    layers = sorted({int(key.split(".")[2]) for key in state})
    out = {}
    for i, layer in enumerate(layers):
        out[f"weights.{i}"] = torch.stack([state[f"q.{c}.{layer}.weight"].t() for c in critics])
        out[f"biases.{i}"] = torch.stack([state[f"q.{c}.{layer}.bias"].unsqueeze(0) for c in critics])
    return out


def stack_separate_critic_adam(state: Mapping[str, Any], n_critics: int, n_layers: int) -> dict[str, Any]:
    """The critics' Adam state dict from one kept for the layout before the stack (parameters in
    the order critic, layer, weight then bias) to the stacked order (every layer's weight, then
    every layer's bias); moments are stacked as the parameters are, ``step`` is shared."""
    per_critic = 2 * n_layers
    old = state["state"]
    new: dict[int, dict[str, Any]] = {}
    for layer in range(n_layers):
        for slot, (offset, to_stack) in enumerate(((0, lambda t: t.t()), (1, lambda t: t.unsqueeze(0)))):
            parts = [old.get(c * per_critic + 2 * layer + offset) for c in range(n_critics)]
            if any(part is None for part in parts):
                continue  # never stepped: no state, as for a fresh optimizer
            first: dict[str, Any] = parts[0]  # type: ignore[assignment]
            new[slot * n_layers + layer] = {
                key: torch.stack([to_stack(part[key]) for part in parts])  # type: ignore[index]
                if isinstance(value, torch.Tensor) and value.dim() > 0 else value
                for key, value in first.items()}
    groups = [{**group, "params": list(range(2 * n_layers))} for group in state["param_groups"]]
    return {"state": new, "param_groups": groups}
