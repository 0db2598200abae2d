"""DQN: double, dueling, n-step, prioritized, Huber loss, clipped gradients, hard or soft targets.

:class:`DQNPolicy` is what an actor runs (observation -> epsilon-greedy action, and initial
priorities); :class:`DQNAgent` adds what only the learner needs (target network, optimiser,
update). Transition batches follow :mod:`zmqrl.core`: the target of every transition is
``reward + discount * Q_target(next_obs, a*)``, so n-step returns, terminations and
truncations are all already folded into ``reward`` and ``discount``.
"""

from __future__ import annotations

from collections.abc import Mapping

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from zmqrl.agents.base import epsilon_greedy
from zmqrl.agents.dqn.config import DQNConfig
from zmqrl.agents.dqn.explicit import ExplicitMLPLoss
from zmqrl.agents.dqn.networks import MLPQNetwork, NatureCNNQNetwork, TorsoQNetwork
from zmqrl.agents.dqn.numpy_policy import td_priorities
from zmqrl.agents.qtarget import TargetQAgent
from zmqrl.agents.torch_util import (
    clip_gradients,
    load_module_params,
    module_params,
    nonfinite,
)
from zmqrl.agents.torso import user_torso
from zmqrl.config import ConfigError


def build_q_network(cfg: DQNConfig, obs_space: gym.spaces.Space, num_actions: int) -> nn.Module:
    """The Q-network the config asks for, sized for the observation space."""
    shape = obs_space.shape or ()
    if cfg.network_fn:  # the user's torso, then DQN's head
        torso, features = user_torso(cfg, obs_space)
        return TorsoQNetwork(torso, features, num_actions, cfg.dueling)
    if cfg.network == "nature_cnn":
        if len(shape) != 3:
            raise ConfigError(f"agent.network: nature_cnn needs (C, H, W) observations, got shape {shape}")
        return NatureCNNQNetwork(shape[0], num_actions, cfg.dueling)
    return MLPQNetwork(int(np.prod(shape)), num_actions, cfg.hidden, cfg.dueling)


class DQNPolicy:
    """Epsilon-greedy policy over a Q-network; runs in actors and for evaluation.

    It keeps the Q-values of its last :meth:`act` call, so an acting loop can build initial
    priorities from them (:class:`~zmqrl.core.ReusesActingValues`) instead of a second forward
    pass over every transition's ``obs`` and ``next_obs``.
    """

    def __init__(self, cfg: DQNConfig, obs_space: gym.spaces.Space, action_space: gym.spaces.Discrete,
                 device: torch.device | str = "cpu", seed: int = 0) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.num_actions = int(action_space.n)
        torch.manual_seed(seed)
        self.q = build_q_network(cfg, obs_space, self.num_actions).to(self.device)
        self.rng = np.random.default_rng(seed)
        self._acted = torch.zeros(0, self.num_actions)  # Q-values of the last act call

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.asarray(array), device=self.device)

    @torch.no_grad()
    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions for a batch of observations."""
        return self.q(self._tensor(obs)).argmax(dim=1).cpu().numpy()

    @torch.no_grad()
    def act(self, obs: np.ndarray, explore: float | np.ndarray) -> np.ndarray:
        """Epsilon-greedy actions; ``explore`` is epsilon, a scalar or one value per row. The Q-values
        stay (on the device) for :meth:`acted_values`."""
        self._acted = q = self.q(self._tensor(obs))
        return epsilon_greedy(q.argmax(dim=1).cpu().numpy(), explore, self.rng, self.num_actions)

    def acted_values(self) -> np.ndarray:
        """Q-values of the observations of the last :meth:`act` call (:class:`~zmqrl.core.ReusesActingValues`)."""
        return self._acted.cpu().numpy()  # type: ignore[no-any-return]

    @torch.no_grad()
    def values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values of a batch of observations, shape ``(len(obs), num_actions)``."""
        return self.q(self._tensor(obs)).cpu().numpy()  # type: ignore[no-any-return]

    def priorities_from_values(self, batch: Mapping[str, np.ndarray], first: np.ndarray,
                               boot: np.ndarray) -> np.ndarray:
        return td_priorities(batch, first, boot)

    def params(self) -> dict[str, np.ndarray]:
        """The Q-network parameters as named, contiguous CPU arrays."""
        return module_params(self.q)

    def load_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Load named arrays from :meth:`params`; names and shapes must match exactly."""
        load_module_params(self.q, params)

    def priorities(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """|TD error| with the local network standing in for the target (:func:`td_priorities`)."""
        return td_priorities(batch, self.values(batch["obs"]), self.values(batch["next_obs"]))


class DQNAgent(TargetQAgent, DQNPolicy):
    """The learner's side of DQN: target network, optimiser and the update rule.

    One update (:meth:`update_step`): the loss of a batch, its gradients clipped, Adam's step (skipped on
    the device where the loss or the gradients are not finite), |TD error| priorities. The MLP network's
    loss and gradients are written out (:class:`ExplicitMLPLoss`); the CNN's go through autograd. It runs
    eagerly or as one CUDA graph (``agent.compile``, :mod:`zmqrl.agents.graphs`).
    """

    def __init__(self, cfg: DQNConfig, obs_space: gym.spaces.Space, action_space: gym.spaces.Discrete,
                 device: torch.device | str = "cpu", seed: int = 0) -> None:
        super().__init__(cfg, obs_space, action_space, device, seed)
        self.init_learner(build_q_network(cfg, obs_space, self.num_actions))
        self._explicit = (ExplicitMLPLoss(self.q, self.target, cfg.double, cfg.loss == "huber")
                          if isinstance(self.q, MLPQNetwork) and isinstance(self.target, MLPQNetwork) else None)
        self.init_updates()

    METRICS = ("loss", "q_mean", "td_abs_mean", "grad_norm", "skipped")
    BATCH_KEYS = ("obs", "action", "reward", "next_obs", "discount", "weights")

    def update_step(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        """One gradient step on staged tensors: metrics, then |TD error| priorities, in one tensor."""
        if self._explicit is None:
            return self._autograd_step(t)
        obs, action, reward, next_obs, discount, weights = self._inputs(t)
        loss, q, td, grad_norm = self._explicit(obs, action, reward, next_obs, discount, weights,
                                                self.cfg.max_grad_norm)
        return self._apply(loss, q, td, grad_norm)

    def update_autograd(self, batch: Mapping[str, np.ndarray]) -> tuple[dict[str, float], np.ndarray]:
        """:meth:`update` through autograd, for any network, run eagerly (the written-out update's reference)."""
        return self.eager_update(batch, self._autograd_step).read()

    def _autograd_step(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        obs, action, reward, next_obs, discount, weights = self._inputs(t)
        with torch.no_grad():
            target_q = self.target(next_obs)
            if self.cfg.double:
                next_action = self.q(next_obs).argmax(dim=1, keepdim=True)
                next_q = target_q.gather(1, next_action).squeeze(1)
            else:
                next_q = target_q.max(dim=1).values
            target = reward + discount * next_q

        q = self.q(obs).gather(1, action).squeeze(1)
        td = target - q
        if self.cfg.loss == "huber":
            elementwise = F.smooth_l1_loss(q, target, reduction="none")
        else:
            elementwise = 0.5 * td.pow(2)
        loss = (weights * elementwise).mean()

        self.zero_grads(self.optimizer)
        loss.backward()
        grad_norm = clip_gradients(self.q, self.cfg.max_grad_norm)
        return self._apply(loss.detach(), q.detach(), td.detach(), grad_norm.detach())

    @staticmethod
    def _inputs(t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """``obs, action (B, 1) int64, reward, next_obs, discount, weights`` (ones if absent) from staged tensors."""
        reward = t["reward"].float()
        weights = t["weights"].float() if "weights" in t else torch.ones_like(reward)
        return t["obs"], t["action"].long().unsqueeze(1), reward, t["next_obs"], t["discount"].float(), weights

    def _apply(self, loss: torch.Tensor, q: torch.Tensor, td: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
        """Adam's step unless the loss or the gradients are not finite (the metric ``skipped``, 1.0 then);
        metrics and priorities in one tensor."""
        skipped = nonfinite(loss, grad_norm)
        self.optimizer.step_unless(skipped)
        td_abs = td.abs().float()
        stats = torch.stack([loss, q.mean(), td_abs.mean(), grad_norm, skipped]).float()
        return torch.cat([stats, td_abs])
