"""A torso of the user's own (``agent.network_fn``): a torch module from Python under an algorithm's heads.

The callables file holds a factory: ``make_torso(obs_space)`` or ``make_torso()`` (a class, a function
or a lambda) returning an ``nn.Module`` that maps a float32 batch of observations, shape
``(B, *obs_shape)``, as the env gives them (not flattened, not scaled), to features ``(B, F)``.
:func:`user_torso` builds it and measures ``F`` with one forward pass over zeros, so a torso that does
not fit the observations is refused at start, naming the key. The algorithms' networks take it as they
take their own torsos (DQN's and R2D2's before their heads, IQN's before its quantile embedding, SAC's
actor before its mean and log-std, each SAC critic a copy of its own before the action joins); they
flatten observations for an MLP torso, so :class:`UserTorso` gives the user's module the observation's
own shape back.
"""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from zmqrl import callables
from zmqrl.config import AgentConfig, ConfigError

KEY = "agent.network_fn"


class UserTorso(nn.Module):
    """The user's module over observations of ``obs_shape``: rows flattened or not, they reach it as
    ``(B, *obs_shape)`` float32. Its parameters are named ``module.*``."""

    def __init__(self, module: nn.Module, obs_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.module = module
        self.obs_shape = obs_shape

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.module(obs.float().reshape(-1, *self.obs_shape))  # type: ignore[no-any-return]


def user_torso(ac: AgentConfig, obs_space: gym.spaces.Space) -> tuple[UserTorso, int]:
    """The torso ``agent.network_fn``'s file makes for ``obs_space``, and its feature count ``F``.

    ConfigError naming the key and the file when the factory fails, returns something other than a
    module, or maps a batch of observations to anything but ``(B, F)`` float features."""
    loaded = callables.load(ac.network_fn, "network", KEY)
    where = f"{KEY}: {loaded.name} from {loaded.path}"
    try:
        module = callables.call_with_space(loaded.obj, obs_space)
    except Exception as exc:
        raise ConfigError(f"{where} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(module, nn.Module):
        raise ConfigError(f"{where} returned {type(module).__name__}, not a torch module (nn.Module)")
    shape = tuple(int(d) for d in (obs_space.shape or ()))
    torso = UserTorso(module, shape)
    probe = torch.zeros((2, *shape), dtype=torch.float32)
    training = torso.training
    try:
        with torch.no_grad():
            out = torso.eval()(probe)  # eval: a probe of zeros moves no running statistics
    except Exception as exc:
        raise ConfigError(f"{where} fails on a batch of observations of shape {tuple(probe.shape)} (float32): "
                          f"{type(exc).__name__}: {exc}") from exc
    finally:
        torso.train(training)
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != 2 or not out.is_floating_point():
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(f"{where} maps observations {tuple(probe.shape)} to {got}; it must give float features "
                          "(B, F), one row per observation (end it with nn.Flatten() for images)")
    return torso, int(out.shape[1])
