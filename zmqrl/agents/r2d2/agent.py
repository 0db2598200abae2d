"""R2D2: recurrent Q-learning from stored sequences (Kapturowski et al. 2019), as SEED RL and Acme do it.

:class:`R2D2Policy` is what an actor runs (one LSTM step per env and observation, a state per env,
epsilon-greedy, and initial priorities of sequence items); :class:`R2D2Agent` adds what only the
learner needs. One update, on a batch of sequence items (:mod:`zmqrl.agents.r2d2`):

1. burn-in: the online and the target network each run the item's first ``B`` steps from the
   stored state, without gradient (padding before an episode's start leaves the state as it was);
2. both run the remaining ``L + 1`` steps from there, the online network with gradient;
3. each trained step ``j`` gets the double-Q, n-step target
   ``h(returns_j + boot_discount_j * h^-1(Q_target(s_b, argmax_a Q_online(s_b, a))))``, truncated at
   the item's end and at the episode's (:func:`~zmqrl.agents.r2d2.sequences.sequence_targets`);
4. the loss is ``0.5 * sum_j td_j^2`` over the steps with a target, times each item's importance
   weight, averaged over items (SEED RL, Acme); each item's new priority is
   ``eta * max_j |td_j| + (1 - eta) * mean_j |td_j|``.

A step whose loss or gradient is not finite is not applied (:func:`~zmqrl.agents.torch_util.nonfinite`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch

from zmqrl.agents.qtarget import TargetQAgent
from zmqrl.agents.r2d2.config import R2D2Config
from zmqrl.agents.r2d2.networks import R2D2Network, State, build_r2d2_network
from zmqrl.agents.r2d2.numpy_policy import RecurrentActing, local_priorities
from zmqrl.agents.r2d2.sequences import Layout, sequence_targets
from zmqrl.agents.torch_util import PendingStep, clip_gradients, load_module_params, module_params, nonfinite

log = logging.getLogger("zmqrl")


def rescale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x (:func:`zmqrl.agents.r2d2.sequences.rescale` in torch)."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def inverse_rescale(y: torch.Tensor, eps: float) -> torch.Tensor:
    """The exact inverse of :func:`rescale` (:func:`zmqrl.agents.r2d2.sequences.inverse_rescale` in torch)."""
    a = y.abs() + 1.0 + eps
    root = 2.0 * a / (torch.sqrt(1.0 + 4.0 * eps * a) + 1.0)
    return torch.sign(y) * (root * root - 1.0)


class R2D2Policy(RecurrentActing):
    """Epsilon-greedy acting over the recurrent Q-network, a state per env (:class:`~zmqrl.core.RecurrentPolicy`)."""

    def __init__(self, cfg: R2D2Config, layout: Layout, obs_space: gym.spaces.Space,
                 action_space: gym.spaces.Discrete, device: torch.device | str = "cpu", seed: int = 0) -> None:
        self.cfg = cfg
        self.layout = layout
        self.device = torch.device(device)
        self.num_actions = int(action_space.n)
        self.lstm_size = cfg.lstm_size
        torch.manual_seed(seed)
        self.q: R2D2Network = build_r2d2_network(cfg, obs_space, self.num_actions).to(self.device)
        self.rng = np.random.default_rng(seed)

    def _tensor(self, array: Any) -> torch.Tensor:
        return torch.as_tensor(np.asarray(array), device=self.device)

    def _state(self, state: np.ndarray) -> State:
        s = self._tensor(np.asarray(state, dtype=np.float32))
        return s[:, 0].contiguous(), s[:, 1].contiguous()

    @torch.no_grad()
    def step(self, obs: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Q-values ``(n, A)`` of one step per env from ``state`` ``(n, 2, H)``, and the state after it."""
        q, (h, c) = self.q(self._tensor(obs).unsqueeze(1), self._state(state))
        return q[:, 0].cpu().numpy(), torch.stack((h, c), dim=1).cpu().numpy()

    @torch.no_grad()
    def sequence_q(self, obs: np.ndarray, state_h: np.ndarray, state_c: np.ndarray,
                   mask: np.ndarray | None = None) -> np.ndarray:
        """Q-values ``(N, T, A)`` of items ``(N, T, ...)`` from their stored states; padding (``mask`` 0)
        leaves the state as it was."""
        hold = None if mask is None or np.all(np.asarray(mask) == 1) else self._tensor(np.asarray(mask) == 0)
        state = tuple(self._tensor(np.asarray(s, dtype=np.float32)) for s in (state_h, state_c))
        q, _ = self.q(self._tensor(obs), state, hold)  # type: ignore[arg-type]
        return q.cpu().numpy()  # type: ignore[no-any-return]

    def params(self) -> dict[str, np.ndarray]:
        """The network's parameters as named, contiguous CPU arrays."""
        return module_params(self.q)

    def load_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Load named arrays from :meth:`params`; names and shapes must match exactly."""
        load_module_params(self.q, params)

    def priorities(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """Initial priorities of sequence items, this network standing in for the target
        (:func:`~zmqrl.agents.r2d2.numpy_policy.local_priorities`)."""
        q = self.sequence_q(np.asarray(batch["obs"]), batch["state_h"], batch["state_c"], batch["mask"])
        return local_priorities(q, batch, self.layout, self.cfg)


class SequenceLoss(NamedTuple):
    """One batch's loss and what its metrics and priorities come from."""

    loss: torch.Tensor  # scalar, with gradient
    td_abs: torch.Tensor  # (N, L) |TD| of the trained steps, 0 where a step has no target
    q_taken: torch.Tensor  # (N, L) Q of the actions taken (the network's, rescaled, units)
    trainable: torch.Tensor  # (N, L) 1 where a step has a target


class R2D2Agent(TargetQAgent, R2D2Policy):
    """The learner's side of R2D2: target network, optimiser and the sequence update."""

    METRICS = ("loss", "q_mean", "td_abs_mean", "grad_norm", "skipped")
    target: R2D2Network

    def __init__(self, cfg: R2D2Config, layout: Layout, obs_space: gym.spaces.Space,
                 action_space: gym.spaces.Discrete, device: torch.device | str = "cpu", seed: int = 0) -> None:
        super().__init__(cfg, layout, obs_space, action_space, device, seed)
        self.init_learner(build_r2d2_network(cfg, obs_space, self.num_actions))
        log.info("r2d2 updates run eager on %s (agent.compile=%s: R2D2 has no captured update)", self.device,
                 cfg.compile)

    def update(self, batch: Mapping[str, np.ndarray]) -> tuple[dict[str, float], np.ndarray]:
        """One gradient step on a batch of sequence items; returns metrics and per-item priorities
        (:meth:`update_deferred`, its results read at once)."""
        return self.update_deferred(batch).read()

    def update_deferred(self, batch: Mapping[str, np.ndarray]) -> PendingStep:
        """One gradient step on a batch of sequence items, queued; metrics and per-item priorities are
        read from the :class:`PendingStep` (on CUDA without waiting for the device until then).

        Metrics: ``loss``; ``q_mean``, the mean Q of the actions taken in return units (through h^-1);
        ``td_abs_mean``, the mean |TD| in the network's units; ``grad_norm``; ``skipped``.
        """
        cfg = self.cfg
        out = self.sequence_loss(self.staged(batch))
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        grad_norm = clip_gradients(self.q, cfg.max_grad_norm)
        skipped = nonfinite(out.loss, grad_norm)
        self.optimizer.step_unless(skipped)
        self.opt_steps += 1
        if self.opt_steps % cfg.target_update_interval == 0:
            self.update_target()
        with torch.no_grad():
            count = out.trainable.sum(dim=1).clamp(min=1.0)
            priorities = cfg.priority_eta * out.td_abs.max(dim=1).values + \
                (1.0 - cfg.priority_eta) * out.td_abs.sum(dim=1) / count
            q = inverse_rescale(out.q_taken, cfg.rescale_eps) if cfg.value_rescaling else out.q_taken
            steps = out.trainable.sum().clamp(min=1.0)
            stats = torch.stack([out.loss.detach(), (q * out.trainable).sum() / steps, out.td_abs.sum() / steps,
                                 grad_norm.detach(), skipped]).float()
            return PendingStep.on_host(self.METRICS, torch.cat([stats, priorities.float()]))

    def staged(self, batch: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """The arrays an update reads, on the device: the items' ``obs``, ``action``, states and ``weights``
        (ones where absent), their n-step targets' data parts (:func:`~zmqrl.agents.r2d2.sequences.sequence_targets`),
        and ``hold``, the burn-in's padding before an episode's start, where any item has some: all
        computed on the host, so the update never waits for the device to decide."""
        b = self.layout.burn_in
        mask = np.asarray(batch["mask"])
        targets = sequence_targets(batch["reward"], batch["discount"], mask, b, self.cfg.n_step)
        weights = batch.get("weights")
        arrays = {"obs": batch["obs"], "action": batch["action"], "state_h": batch["state_h"],
                  "state_c": batch["state_c"], "returns": targets.returns, "boot_discount": targets.boot_discount,
                  "boot_index": targets.boot_index, "trainable": targets.trainable,
                  "weights": np.ones(len(mask), np.float32) if weights is None else weights}
        hold = mask[:, :b] == 0
        if hold.any():
            arrays["hold"] = hold
        return self.stager(arrays)

    def sequence_loss(self, t: Mapping[str, torch.Tensor]) -> SequenceLoss:
        """The loss of staged items (:meth:`staged`): burn-in without gradient, then the double-Q,
        n-step, rescaled targets of the trained steps (see the module's docstring)."""
        cfg, b, length = self.cfg, self.layout.burn_in, self.layout.length
        obs = t["obs"]
        stored = (t["state_h"].float(), t["state_c"].float())
        with torch.no_grad():
            online_state, target_state = stored, stored
            if b:
                hold = t.get("hold")  # padding before the episode's start
                online_state = self.q.core(self.q.features(obs[:, :b]), stored, hold)[1]
                target_state = self.target.core(self.target.features(obs[:, :b]), stored, hold)[1]
            target_q, _ = self.target(obs[:, b:], target_state)  # (N, L + 1, A)
        q, _ = self.q(obs[:, b:], online_state)  # (N, L + 1, A), with gradient
        with torch.no_grad():
            chooser = q.detach() if cfg.double else target_q
            boot_q = target_q.gather(2, chooser.argmax(dim=2, keepdim=True)).squeeze(2)  # (N, L + 1)
            value = inverse_rescale(boot_q, cfg.rescale_eps) if cfg.value_rescaling else boot_q
            target = t["returns"] + t["boot_discount"] * value.gather(1, t["boot_index"])
            if cfg.value_rescaling:
                target = rescale(target, cfg.rescale_eps)
        action = t["action"][:, b:b + length].long().unsqueeze(2)
        q_taken = q[:, :length].gather(2, action).squeeze(2)
        trainable = t["trainable"]
        td = (target - q_taken) * trainable
        loss = (t["weights"].float() * 0.5 * td.pow(2).sum(dim=1)).mean()
        return SequenceLoss(loss, td.detach().abs(), q_taken.detach(), trainable)
