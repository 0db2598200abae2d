"""IQN: implicit quantile networks (Dabney et al. 2018) with n-step targets and prioritized replay.

:class:`IQNPolicy` is what an actor runs (observation -> epsilon-greedy action over Q averaged on
``K`` fractions, and initial priorities); :class:`IQNAgent` adds what only the learner needs
(target network, optimiser, update). As for DQN, every transition's target is
``reward + discount * Z_target(next_obs, a*)``: n-step returns, terminations and truncations are
already folded into ``reward`` and ``discount``.

The loss of one transition (eq. 3 of the paper) sums over ``N`` predicted fractions ``tau_i`` and
averages over ``N'`` target fractions ``tau'_j`` the quantile Huber loss
``rho_tau_i(delta_ij) = |tau_i - 1{delta_ij < 0}| * huber_kappa(delta_ij) / kappa`` of the pairwise
errors ``delta_ij = r + discount * Z_tau'_j(x', a*) - Z_tau_i(x, a)``; the batch loss is its
importance-weighted mean. The priority a transition gets back is that loss averaged over its
``N * N'`` pairs (:func:`~zmqrl.agents.iqn.numpy_policy.pairwise_priority`), the scale actors
compute theirs on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from zmqrl.agents.base import epsilon_greedy
from zmqrl.agents.iqn.config import IQNConfig
from zmqrl.agents.iqn.networks import IQNNetwork, mlp_iqn, nature_cnn_iqn
from zmqrl.agents.iqn.numpy_policy import draw_taus, midpoint_taus
from zmqrl.agents.qtarget import TargetQAgent
from zmqrl.agents.torch_util import (
    clip_gradients,
    load_module_params,
    module_params,
    nonfinite,
)
from zmqrl.agents.torso import user_torso
from zmqrl.config import ConfigError


def build_iqn_network(cfg: IQNConfig, obs_space: gym.spaces.Space, num_actions: int) -> IQNNetwork:
    """The network the config asks for, sized for the observation space."""
    shape = obs_space.shape or ()
    if cfg.network_fn:  # the user's torso, then IQN's embedding, merge and head
        torso, features = user_torso(cfg, obs_space)
        return IQNNetwork(torso, features, num_actions, cfg.embed_dim, cfg.head_hidden, pixels=False)
    if cfg.network == "nature_cnn":
        if len(shape) != 3:
            raise ConfigError(f"agent.network: nature_cnn needs (C, H, W) observations, got shape {shape}")
        return nature_cnn_iqn(shape[0], num_actions, cfg.embed_dim)
    return mlp_iqn(int(np.prod(shape)), num_actions, cfg.hidden, cfg.head_hidden, cfg.embed_dim)


def quantile_huber_loss(target: torch.Tensor, pred: torch.Tensor, taus: torch.Tensor,
                        kappa: float) -> torch.Tensor:
    """The pairwise quantile Huber terms ``rho`` of eq. (10): target ``(B, N')``, predictions ``(B, N)``
    at fractions ``taus`` ``(B, N)`` -> ``(B, N', N)``. Gradients flow through ``pred`` only."""
    u = target.unsqueeze(2) - pred.unsqueeze(1)
    huber = F.huber_loss(pred.unsqueeze(1).expand_as(u), target.unsqueeze(2).expand_as(u), reduction="none",
                         delta=kappa)
    return (taus.unsqueeze(1) - (u.detach() < 0).float()).abs() * huber / kappa


class IQNPolicy:
    """Epsilon-greedy policy over an implicit quantile network; runs in actors and for evaluation."""

    def __init__(self, cfg: IQNConfig, obs_space: gym.spaces.Space, action_space: gym.spaces.Discrete,
                 device: torch.device | str = "cpu", seed: int = 0) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.num_actions = int(action_space.n)
        torch.manual_seed(seed)
        self.q = build_iqn_network(cfg, obs_space, self.num_actions).to(self.device)
        self.rng = np.random.default_rng(seed)
        self.act_taus = midpoint_taus(cfg.n_act_quantiles)

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.asarray(array), device=self.device)

    def _taus(self, taus: np.ndarray | None, rows: int) -> torch.Tensor:
        t = self._tensor(self.act_taus if taus is None else np.asarray(taus, dtype=np.float32))
        return t.expand(rows, -1) if t.dim() == 1 else t

    @torch.no_grad()
    def quantile_values(self, obs: np.ndarray, taus: np.ndarray) -> np.ndarray:
        """The ``taus`` quantiles of every action's return: ``taus`` (n, T) or (T,) -> (n, T, A)."""
        return self.q(self._tensor(obs), self._taus(taus, len(obs))).cpu().numpy()  # type: ignore[no-any-return]

    @torch.no_grad()
    def q_values(self, obs: np.ndarray, taus: np.ndarray | None = None) -> np.ndarray:
        """Q: the mean of the quantiles at ``taus`` (default: the greedy midpoints), shape (n, A)."""
        return self.q(self._tensor(obs), self._taus(taus, len(obs))).mean(dim=1).cpu().numpy()  # type: ignore[no-any-return]

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Deterministic actions: argmax of Q over the ``K`` midpoint fractions."""
        return self.q_values(obs).argmax(axis=1)  # type: ignore[no-any-return]

    def act(self, obs: np.ndarray, explore: float | np.ndarray) -> np.ndarray:
        """Epsilon-greedy over Q averaged on ``K`` fresh uniform fractions per row; ``explore`` is epsilon."""
        taus = draw_taus(self.rng, len(obs), self.cfg.n_act_quantiles)
        return epsilon_greedy(self.q_values(obs, taus).argmax(axis=1), explore, self.rng, self.num_actions)

    def params(self) -> dict[str, np.ndarray]:
        """The network's parameters as named, contiguous CPU arrays."""
        return module_params(self.q)

    def load_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Load named arrays from :meth:`params`; names and shapes must match exactly."""
        load_module_params(self.q, params)

    @torch.no_grad()
    def priorities(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """Initial priorities on the learner's scale: the pairwise quantile Huber loss with the local
        network standing in for the target and the ``K`` midpoints as both sets of fractions.

        A forward pass of their own (no :class:`~zmqrl.core.ReusesActingValues`): acting averages
        quantiles at fresh random fractions, not at the midpoints, so reusing it would take a second
        pass of the quantile head (the larger part of IQN's forward) on every act call; not done yet."""
        n = len(batch["obs"])
        obs = torch.cat([self._tensor(batch["obs"]), self._tensor(batch["next_obs"])])
        z = self.q(obs, self._taus(None, 2 * n))  # (2n, K, A)
        action = self._tensor(batch["action"]).long()
        pred = z[:n].gather(2, action.view(n, 1, 1).expand(n, z.shape[1], 1)).squeeze(2)
        best = z[n:].mean(dim=1).argmax(dim=1)
        nxt = z[n:].gather(2, best.view(n, 1, 1).expand(n, z.shape[1], 1)).squeeze(2)
        target = self._tensor(batch["reward"]).float().unsqueeze(1) + \
            self._tensor(batch["discount"]).float().unsqueeze(1) * nxt
        rho = quantile_huber_loss(target, pred, self._taus(None, n), self.cfg.kappa)
        return rho.mean(dim=(1, 2)).cpu().numpy().astype(np.float32)  # type: ignore[no-any-return]


class IQNAgent(TargetQAgent, IQNPolicy):
    """The learner's side of IQN: target network, optimiser and the update rule.

    The fractions of the loss are drawn from the agent's own torch generator on the device, whose
    state is part of :meth:`state_dict`, so a resumed run draws what the uninterrupted one would; a
    captured update draws from it too (registered with the graph: torch's graph-safe philox state).
    """

    def __init__(self, cfg: IQNConfig, obs_space: gym.spaces.Space, action_space: gym.spaces.Discrete,
                 device: torch.device | str = "cpu", seed: int = 0) -> None:
        super().__init__(cfg, obs_space, action_space, device, seed)
        self.init_learner(build_iqn_network(cfg, obs_space, self.num_actions))
        self.tau_rng = torch.Generator(device=self.device)
        self.tau_rng.manual_seed(seed)
        self.init_updates()

    METRICS = ("loss", "q_mean", "td_abs_mean", "grad_norm", "skipped")
    BATCH_KEYS = ("obs", "action", "reward", "next_obs", "discount", "weights")

    def _draw(self, rows: int, k: int) -> torch.Tensor:
        return torch.rand(rows, k, device=self.device, generator=self.tau_rng)

    def graph_generators(self) -> list[torch.Generator]:
        return [self.tau_rng]

    def update_step(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        """One gradient step on staged tensors: metrics, then the new priorities, in one tensor."""
        cfg = self.cfg
        obs = t["obs"]
        action = t["action"].long()
        reward = t["reward"].float()
        discount = t["discount"].float()
        weights = t["weights"].float() if "weights" in t else torch.ones_like(reward)
        b = len(reward)

        with torch.no_grad():
            next_obs = t["next_obs"]
            target_taus = self._draw(b, cfg.n_target_quantiles)
            z_next = self.target(next_obs, target_taus)  # (B, N', A)
            chooser = self.q(next_obs, target_taus) if cfg.double else z_next
            next_action = chooser.mean(dim=1).argmax(dim=1)
            z_best = z_next.gather(2, next_action.view(b, 1, 1).expand(b, cfg.n_target_quantiles, 1)).squeeze(2)
            target = reward.unsqueeze(1) + discount.unsqueeze(1) * z_best  # (B, N')

        taus = self._draw(b, cfg.n_quantiles)
        z = self.q(obs, taus)  # (B, N, A)
        pred = z.gather(2, action.view(b, 1, 1).expand(b, cfg.n_quantiles, 1)).squeeze(2)  # (B, N)
        rho = quantile_huber_loss(target, pred, taus, cfg.kappa)  # (B, N', N)
        per_sample = rho.sum(dim=2).mean(dim=1)
        loss = (weights * per_sample).mean()

        self.zero_grads(self.optimizer)
        loss.backward()
        grad_norm = clip_gradients(self.q, cfg.max_grad_norm)
        skipped = nonfinite(loss, grad_norm)
        self.optimizer.step_unless(skipped)

        with torch.no_grad():
            priorities = rho.detach().mean(dim=(1, 2)).float()
            q = pred.detach().mean(dim=1)
            td_abs = (target.mean(dim=1) - q).abs()
            stats = torch.stack([loss.detach(), q.mean(), td_abs.mean(), grad_norm.detach(), skipped]).float()
            return torch.cat([stats, priorities])

    def state_dict(self) -> dict[str, Any]:
        """As :class:`TargetQAgent`'s, and the fraction generator, for resuming exactly."""
        return {**super().state_dict(), "tau_rng": self.tau_rng.get_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.tau_rng.set_state(state["tau_rng"].cpu())
