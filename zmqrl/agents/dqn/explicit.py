"""DQN's loss and gradients for the MLP Q-network, written out instead of taken through autograd.

For CartPole's [256, 256] network at batch 64 one autograd update spends more time on the graph
(recording it, the engine's walk back, per-tensor clipping) than on its five large matrix products.
:class:`ExplicitMLPLoss` computes the same loss and gradients with the products alone:

- the online network sees ``obs`` and ``next_obs`` in one forward of ``2 * batch`` rows (double
  DQN needs both); only the ``obs`` rows go back through the network;
- the backward pass is the chain rule of ReLU layers, the dueling head, the gather and the
  Huber (or squared) loss, one matrix product per weight gradient;
- the gradients live in one flat buffer that every parameter's ``.grad`` views, so clipping by
  the global norm is one norm and one multiply, and the optimiser steps as before.

``tests/agents/test_dqn_explicit.py`` checks loss, priorities, gradients and the parameters after many
updates against the autograd update (:meth:`DQNAgent.update_autograd`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zmqrl.agents.dqn.networks import MLPQNetwork

_threshold_backward = torch.ops.aten.threshold_backward  # ReLU's gradient: zero where the output is not > 0


def _layers(net: MLPQNetwork) -> tuple[list[nn.Linear], nn.Linear, nn.Linear | None]:
    """The torso's Linear layers and the head's advantage and value layers of ``net``."""
    modules = list(net.torso.children())
    torso = [m for m in modules if isinstance(m, nn.Linear)]
    if modules[0::2] != torso or not all(isinstance(m, nn.ReLU) for m in modules[1::2]):
        raise TypeError("an explicit MLP update needs a torso of Linear, ReLU pairs")
    head = net.head
    if not isinstance(head.advantage, nn.Linear) or not isinstance(head.value, nn.Linear | None):
        raise TypeError("an explicit MLP update needs a head of single Linear layers")
    return torso, head.advantage, head.value


def _forward(x: torch.Tensor, torso: list[nn.Linear], adv: nn.Linear,
             value: nn.Linear | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Q-values of ``x`` and the inputs of every layer (``x`` first, the last hidden output last)."""
    inputs = [x]
    h = x
    for layer in torso:
        h = torch.addmm(layer.bias, h, layer.weight.t()).relu_()
        inputs.append(h)
    q = torch.addmm(adv.bias, h, adv.weight.t())
    if value is not None:
        q = q.sub_(q.mean(dim=1, keepdim=True)).add_(torch.addmm(value.bias, h, value.weight.t()))
    return q, inputs


class ExplicitMLPLoss:
    """DQN's weighted loss over a batch, with the online network's gradients written into ``.grad``."""

    def __init__(self, online: MLPQNetwork, target: MLPQNetwork, double: bool, huber: bool) -> None:
        self.online, self.target = _layers(online), _layers(target)
        self.double, self.huber = double, huber
        self.params = list(online.parameters())
        self._flat = torch.zeros(0)
        self._grads: list[torch.Tensor] = []

    def _bind_grads(self) -> list[torch.Tensor]:
        """Every parameter's ``.grad`` as a view of one flat buffer (made again if something replaced them)."""
        if (not self._grads or self._grads[0].data_ptr() != self._flat.data_ptr()  # moved by module.to()
                or any(p.grad is not g for p, g in zip(self.params, self._grads, strict=True))):
            first = self.params[0]
            self._flat = torch.zeros(sum(p.numel() for p in self.params), dtype=first.dtype, device=first.device)
            views, offset = [], 0
            for p in self.params:
                views.append(self._flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            for p, g in zip(self.params, views, strict=True):
                p.grad = g
            self._grads = views
        return self._grads

    @torch.no_grad()
    def __call__(self, obs: torch.Tensor, action: torch.Tensor, reward: torch.Tensor, next_obs: torch.Tensor,
                 discount: torch.Tensor, weights: torch.Tensor,
                 max_grad_norm: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Loss, Q of the taken actions, TD errors and the gradients' global norm before clipping them to
        ``max_grad_norm`` (0: not clipped). ``action`` is ``(B, 1)`` int64; the rest as sampled."""
        torso, adv, value = self.online
        b = obs.shape[0]
        obs, next_obs = obs.float().flatten(1), next_obs.float().flatten(1)
        target_q = _forward(next_obs, *self.target)[0]
        if self.double:
            q_all, inputs = _forward(torch.cat([obs, next_obs]), torso, adv, value)
            next_q = target_q.gather(1, q_all[b:].argmax(dim=1, keepdim=True)).squeeze(1)
            q_all = q_all[:b]
        else:
            q_all, inputs = _forward(obs, torso, adv, value)
            next_q = target_q.max(dim=1).values
        target = torch.addcmul(reward, discount, next_q)
        q = q_all.gather(1, action).squeeze(1)
        td = target - q
        if self.huber:
            loss = torch.dot(weights, F.smooth_l1_loss(q, target, reduction="none")) / b
            d_q = td.neg().clamp_(-1.0, 1.0)
        else:
            loss = torch.dot(weights, td.square()) / (2 * b)
            d_q = td.neg()
        d_q.mul_(weights).div_(b)  # d loss / d q of each taken action

        grads = self._bind_grads()
        d_adv = torch.zeros_like(q_all).scatter_(1, action, d_q.unsqueeze(1))
        h = inputs[-1][:b]
        g = iter(reversed(grads))  # parameters in reverse: value, advantage, then the torso's layers
        if value is not None:
            d_value = d_adv.sum(dim=1, keepdim=True)
            d_adv.sub_(d_value / d_adv.shape[1])  # through q = v + a - mean(a)
            torch.sum(d_value, 0, out=next(g))
            torch.mm(d_value.t(), h, out=next(g))
        torch.sum(d_adv, 0, out=next(g))
        torch.mm(d_adv.t(), h, out=next(g))
        d_h = torch.mm(d_adv, adv.weight)
        if value is not None:
            d_h.addmm_(d_value, value.weight)
        for i in range(len(torso) - 1, -1, -1):
            d_z = _threshold_backward(d_h, inputs[i + 1][:b], 0)
            torch.sum(d_z, 0, out=next(g))
            torch.mm(d_z.t(), inputs[i][:b], out=next(g))
            if i:
                d_h = torch.mm(d_z, torso[i].weight)

        norm = torch.linalg.vector_norm(self._flat)
        if max_grad_norm > 0:
            self._flat.mul_(torch.clamp(max_grad_norm / (norm + 1e-6), max=1.0))
        return loss, q, td, norm
