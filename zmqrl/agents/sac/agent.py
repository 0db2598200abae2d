"""Soft actor-critic (Haarnoja et al., 2018) for Box actions: twin critics with Polyak-averaged
targets, a tanh-squashed Gaussian actor, automatic entropy tuning, n-step and prioritized replay.

:class:`SACPolicy` is what an actor runs (observation -> action in the Box's bounds);
:class:`SACAgent` adds what only the learner needs. Transition batches follow
:mod:`zmqrl.core`, so every critic's target is
``reward + discount * (min_i Q'_i(next_obs, a') - alpha * log pi(a' | next_obs))`` with ``a'``
drawn from the current actor: n-step returns, terminations and truncations are all folded into
``reward`` and ``discount``. Critics see actions in [-1, 1]; log-probabilities are those of the
squashed action in [-1, 1] (the scale to the bounds is a constant and left out), so the target
entropy -dim(A) means the same whatever the bounds.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from zmqrl.agents.graphs import Bindings, CompiledUpdates
from zmqrl.agents.sac.config import SACConfig
from zmqrl.agents.sac.networks import (
    Actor,
    Critics,
    separate_layout,
    stack_separate_critic_adam,
    stack_separate_critics,
)
from zmqrl.agents.sac.numpy_policy import ActionBounds, explore_actions
from zmqrl.agents.staging import BatchStager
from zmqrl.agents.torch_util import (
    Adam,
    clip_gradients,
    load_module_params,
    module_params,
    nonfinite,
    step_unless,
)
from zmqrl.agents.torso import user_torso

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)


def squash_log_prob(noise: torch.Tensor, log_std: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """log pi of ``tanh(u)`` where ``u = mean + exp(log_std) * noise``, summed over action dims.

    The Gaussian log-density of ``u`` minus the change of variables ``log(1 - tanh(u)^2)``,
    written ``2 * (log 2 - u - softplus(-2u))`` so it stays finite where tanh saturates.
    """
    gaussian = -0.5 * noise.pow(2) - log_std - _HALF_LOG_2PI
    correction = 2.0 * (_LOG_2 - u - F.softplus(-2.0 * u))
    return (gaussian - correction).sum(dim=1)


class SACPolicy:
    """The tanh-Gaussian actor on a torch device; runs in actors and for evaluation."""

    def __init__(self, cfg: SACConfig, obs_space: gym.spaces.Space, action_space: gym.spaces.Box,
                 device: torch.device | str = "cpu", seed: int = 0) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.bounds = ActionBounds(action_space)
        self.obs_dim = int(np.prod(obs_space.shape or ()))
        self.act_dim = len(self.bounds.low)
        torch.manual_seed(seed)
        torso = user_torso(cfg, obs_space) if cfg.network_fn else None  # agent.network_fn: the user's torso
        self.actor = Actor(self.obs_dim, self.act_dim, cfg.hidden, cfg.log_std_min, cfg.log_std_max,
                           torso).to(self.device)
        self.rng = np.random.default_rng(seed)

    @torch.no_grad()
    def mean_log_std(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The actor's mean and clamped log-std, brought to the host in one copy."""
        mean, log_std = self.actor(torch.as_tensor(np.asarray(obs), device=self.device))
        host = torch.cat([mean, log_std], dim=1).float().cpu().numpy()
        return host[:, :self.act_dim], host[:, self.act_dim:]

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """``tanh(mean)`` scaled to the bounds."""
        return self.bounds.to_env(np.tanh(self.mean_log_std(obs)[0]))

    def act(self, obs: np.ndarray, explore: float | np.ndarray) -> np.ndarray:
        """Policy samples; ``explore`` is the probability per row of a uniform random action instead."""
        return self.bounds.to_env(explore_actions(len(obs), self.act_dim, explore, self.rng,
                                                  lambda: self.mean_log_std(obs)))

    def params(self) -> dict[str, np.ndarray]:
        """The actor's parameters (all an actor needs) as named, contiguous CPU arrays."""
        return module_params(self.actor)

    def load_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Load named arrays from :meth:`params`; names and shapes must match exactly."""
        load_module_params(self.actor, params)

    def priorities(self, batch: Mapping[str, np.ndarray]) -> None:
        """None: the actor has no critic, so the learner gives new transitions the maximum priority."""
        return None


class SACAgent(CompiledUpdates, SACPolicy):
    """The learner's side of SAC: critics, their targets, the entropy coefficient and the update.

    One update (:meth:`update_step`) steps the critics, the actor and alpha, and runs eagerly or as one
    CUDA graph (``agent.compile``, :mod:`zmqrl.agents.graphs`); its draws come from the agent's own
    generator (registered with the graph), its Polyak update every ``target_update_interval`` steps.
    """

    METRICS = ("critic_loss", "actor_loss", "alpha", "alpha_loss", "entropy", "q_mean", "td_abs_mean", "skipped")
    BATCH_KEYS = ("obs", "action", "reward", "next_obs", "discount", "weights")

    def __init__(self, cfg: SACConfig, obs_space: gym.spaces.Space, action_space: gym.spaces.Box,
                 device: torch.device | str = "cpu", seed: int = 0) -> None:
        super().__init__(cfg, obs_space, action_space, device, seed)
        torsos: tuple[list[nn.Module], int] | None = None
        if cfg.network_fn:  # a copy of the user's torso per critic, as the actor has its own
            made = [user_torso(cfg, obs_space) for _ in range(cfg.n_critics)]
            torsos = ([torso for torso, _ in made], made[0][1])
        self.critics = Critics(self.obs_dim, self.act_dim, cfg.hidden, cfg.n_critics, torsos).to(self.device)
        self.targets = copy.deepcopy(self.critics).requires_grad_(False)
        self.actor_optimizer = Adam(self.actor.parameters(), lr=cfg.actor_lr, eps=cfg.adam_eps)
        self.critic_optimizer = Adam(self.critics.parameters(), lr=cfg.critic_lr, eps=cfg.adam_eps)
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), device=self.device, requires_grad=cfg.auto_alpha)
        self.alpha_optimizer = Adam([self.log_alpha], lr=cfg.alpha_lr, eps=cfg.adam_eps) \
            if cfg.auto_alpha else None
        self.target_entropy = float(-self.act_dim if cfg.target_entropy is None else cfg.target_entropy)
        self.noise = torch.Generator(device=self.device)  # the update's own draws, saved for exact resumes
        self.noise.manual_seed(seed)
        self.low = torch.as_tensor(self.bounds.low, device=self.device)
        self.half_range = torch.as_tensor(self.bounds.half_range, device=self.device)
        self.opt_steps = 0
        self.stager = BatchStager(self.device)  # how batches reach the device (replaceable: pinned or not)
        self.init_updates()

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised squashed actions in [-1, 1] and their log-probabilities."""
        mean, log_std = self.actor(obs)
        noise = torch.randn(mean.shape, generator=self.noise, device=self.device, dtype=mean.dtype)
        u = mean + log_std.exp() * noise
        return torch.tanh(u), squash_log_prob(noise, log_std, u)

    def squashed(self, action: torch.Tensor) -> torch.Tensor:
        """Env actions from replay back to [-1, 1]."""
        return ((action.float() - self.low) / self.half_range - 1.0).clamp(-1.0, 1.0)

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.detach().exp())

    def optimizers(self) -> list[Adam]:
        alpha = [] if self.alpha_optimizer is None else [self.alpha_optimizer]
        return [self.actor_optimizer, self.critic_optimizer, *alpha]

    def graph_bindings(self) -> Bindings:
        """Networks, targets, alpha, their gradients and the optimisers' state: what a captured update must
        find in place."""
        return Bindings((self.actor, self.critics, self.targets), self.optimizers(),
                        (self.log_alpha, self.low, self.half_range))

    def graph_generators(self) -> list[torch.Generator]:
        return [self.noise]

    def update_step(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        """One step of the critics, the actor and alpha on staged tensors: metrics, then priorities.

        ``critic_loss`` is the sum over critics of each one's (importance-weighted) mean loss;
        ``alpha`` is the coefficient this step used, ``entropy`` the mean of -log pi over the
        batch. Priorities are |TD error| averaged over the critics.
        """
        obs, next_obs = t["obs"].float(), t["next_obs"].float()
        action = self.squashed(t["action"])
        reward, discount = t["reward"].float(), t["discount"].float()
        weights = t["weights"].float() if "weights" in t else None
        alpha = self.log_alpha.detach().exp()

        with torch.no_grad():
            next_action, next_log_prob = self.sample(next_obs)
            next_q = self.targets(next_obs, next_action).min(dim=0).values
            target = reward + discount * (next_q - alpha * next_log_prob)

        q = self.critics(obs, action)  # (n_critics, batch)
        td = target - q
        if self.cfg.loss == "huber":
            elementwise = F.smooth_l1_loss(q, target.expand_as(q), reduction="none")
        else:
            elementwise = 0.5 * td.pow(2)
        if weights is not None:
            elementwise = elementwise * weights
        critic_loss = elementwise.mean(dim=1).sum()
        skipped = self._step(self.critic_optimizer, critic_loss, self.critics)

        self.critics.requires_grad_(False)  # the actor's loss moves the actor only
        new_action, log_prob = self.sample(obs)
        q_new = self.critics(obs, new_action).min(dim=0).values
        actor_loss = (alpha * log_prob - q_new).mean()
        skipped = self._step(self.actor_optimizer, actor_loss, self.actor, skipped)
        self.critics.requires_grad_(True)

        log_prob = log_prob.detach()
        if self.alpha_optimizer is not None:
            alpha_loss = -(self.log_alpha * (log_prob + self.target_entropy)).mean()
            self.zero_grads(self.alpha_optimizer)
            alpha_loss.backward()
            skipped = torch.maximum(skipped, nonfinite(alpha_loss))
            self.alpha_optimizer.step_unless(skipped)
            alpha_loss = alpha_loss.detach()
        else:
            alpha_loss = torch.zeros((), device=self.device)

        td_abs = td.detach().abs().mean(dim=0)
        stats = torch.stack([critic_loss.detach(), actor_loss.detach(), alpha, alpha_loss, -log_prob.mean(),
                             q.detach().mean(), td_abs.mean(), skipped]).float()
        return torch.cat([stats, td_abs.float()])

    def _step(self, optimizer: torch.optim.Optimizer, loss: torch.Tensor, module: nn.Module,
              skip: torch.Tensor | None = None) -> torch.Tensor:
        """Backward and one step of ``optimizer``, not applied where the loss or the gradients are not
        finite, or ``skip`` (an earlier part of this update was not applied: none of it is); returns
        whether it was skipped (a 0-d tensor, see :func:`nonfinite`)."""
        self.zero_grads(optimizer)
        loss.backward()
        grad_norm = clip_gradients(module, self.cfg.max_grad_norm)
        skipped = nonfinite(loss, grad_norm)
        if skip is not None:
            skipped = torch.maximum(skipped, skip)
        step_unless(optimizer, skipped)
        return skipped

    @torch.no_grad()
    def update_target(self) -> None:
        """Polyak averaging: ``target <- (1 - tau) * target + tau * critic``."""
        torch._foreach_lerp_(list(self.targets.parameters()), list(self.critics.parameters()), self.cfg.tau)

    def adopt_initial(self, params: Mapping[str, np.ndarray]) -> None:
        """Start from version-0 actor parameters (the critics have no published counterpart)."""
        self.load_params(params)

    def state_dict(self) -> dict[str, Any]:
        """Networks, targets, optimisers, alpha, counters and both RNGs, for an exact resume."""
        return {"actor": self.actor.state_dict(), "critics": self.critics.state_dict(),
                "targets": self.targets.state_dict(), "actor_optimizer": self.actor_optimizer.state_dict(),
                "critic_optimizer": self.critic_optimizer.state_dict(),
                "log_alpha": self.log_alpha.detach().clone(),
                "alpha_optimizer": None if self.alpha_optimizer is None else self.alpha_optimizer.state_dict(),
                "opt_steps": self.opt_steps, "rng": self.rng.bit_generator.state,
                "noise_rng": self.noise.get_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load :meth:`state_dict`'s output; critics saved before they were stacked
        (:func:`stack_separate_critics`) load too, Adam moments included."""
        self.actor.load_state_dict(state["actor"])
        critic_optimizer = state["critic_optimizer"]
        if separate_layout(state["critics"]):
            critic_optimizer = stack_separate_critic_adam(critic_optimizer, self.critics.n, len(self.critics.weights))
        self.critics.load_state_dict(stack_separate_critics(state["critics"]))
        self.targets.load_state_dict(stack_separate_critics(state["targets"]))
        # never share Adam moments with the state passed in
        self.actor_optimizer.load_state_dict(copy.deepcopy(state["actor_optimizer"]))
        self.critic_optimizer.load_state_dict(copy.deepcopy(critic_optimizer))
        with torch.no_grad():
            self.log_alpha.copy_(torch.as_tensor(state["log_alpha"]))
        if self.alpha_optimizer is not None and state["alpha_optimizer"] is not None:
            self.alpha_optimizer.load_state_dict(copy.deepcopy(state["alpha_optimizer"]))
        self.opt_steps = int(state["opt_steps"])
        self.rng.bit_generator.state = state["rng"]
        self.noise.set_state(state["noise_rng"].cpu())
