"""Torch pieces shared by the algorithms' agents."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from zmqrl.agents.numpy_mlp import check_params
from zmqrl.config import ConfigError


def resolve_device(name: str) -> torch.device:
    """``auto`` picks cuda when present; an unavailable cuda is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"run.device: unknown device {name!r}; use cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"run.device: {name!r} requested but no CUDA device is available")
    return device


def module_params(module: nn.Module, prefix: str = "") -> dict[str, np.ndarray]:
    """A module's ``state_dict`` as named, contiguous CPU numpy arrays (names prefixed)."""
    return {prefix + k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}


def load_module_params(module: nn.Module, params: Mapping[str, np.ndarray], prefix: str = "") -> None:
    """Load named arrays (as :func:`module_params` gives them) into ``module``; names and shapes
    must match exactly (a ValueError says which does not)."""
    own = {prefix + k: tuple(v.shape) for k, v in module.state_dict().items()}
    mine = {k: v for k, v in params.items() if k.startswith(prefix)} if prefix else dict(params)
    check_params(mine, own)
    module.load_state_dict({k[len(prefix):]: torch.from_numpy(np.array(v, copy=True)) for k, v in mine.items()})


def clip_gradients(module: nn.Module, max_norm: float) -> torch.Tensor:
    """The global norm of ``module``'s gradients, clipped to ``max_norm`` first (0 disables clipping)."""
    if max_norm > 0:
        return nn.utils.clip_grad_norm_(module.parameters(), max_norm)
    return torch.norm(torch.stack([p.grad.norm() for p in module.parameters() if p.grad is not None]))


@torch.no_grad()
def update_target(target: nn.Module, source: nn.Module, tau: float) -> None:
    """Hard copy (``tau`` >= 1) or Polyak average of ``source`` into ``target``."""
    for t, s in zip(target.parameters(), source.parameters(), strict=True):
        if tau >= 1.0:
            t.copy_(s)
        else:
            t.lerp_(s, tau)
