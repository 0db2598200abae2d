"""V-trace (Espeholt et al. 2018, section 4.1), in torch, over segments with per-step discounts and a mask.

For a segment of ``L`` steps with values ``V(x_0) .. V(x_L)``, importance weights
``rho_s = pi(a_s | x_s) / mu(a_s | x_s)`` and per-step discounts ``d_s`` (``gamma``, 0 at a termination),
the V-trace target of step ``s`` is

    v_s = V(x_s) + sum_{t >= s} (prod_{i=s}^{t-1} d_i c_i) delta_t,
    delta_t = min(rho_bar, rho_t) (r_t + d_t V(x_{t+1}) - V(x_t)),   c_i = lambda min(c_bar, rho_i),

computed backwards by the paper's recursion ``v_s - V(x_s) = delta_s + d_s c_s (v_{s+1} - V(x_{s+1}))``.
A step that is not trained (padding, a truncated episode's last step, the bootstrap step ``L``) ends the
sum: its ``v - V`` is 0, so the step before it bootstraps from its value. The policy gradient's
advantage of step ``s`` is ``r_s + d_s v_{s+1} - V(x_s)``, times ``min(rho_bar, rho_s)`` for IMPALA's
gradient. With ``pi = mu`` and ``lambda = 1`` the targets are the n-step returns to the segment's end
(to a termination, or to the last trained step's bootstrap).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class VTrace:
    """V-trace's outputs for a batch of segments ``(N, L)`` (no gradient flows through them)."""

    vs: torch.Tensor  # v_s: the value targets
    advantages: torch.Tensor  # r_s + d_s v_{s+1} - V(x_s), without the importance weight
    clipped_rho: torch.Tensor  # min(rho_bar, rho_s)


@torch.no_grad()
def vtrace(log_rho: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor, values: torch.Tensor,
           trained: torch.Tensor, rho_bar: float = 1.0, c_bar: float = 1.0, lam: float = 1.0) -> VTrace:
    """V-trace targets and advantages (module docstring).

    ``log_rho``, ``reward``, ``discount``, ``trained``: (N, L); ``values``: (N, L + 1), the last column the
    bootstrap step's value. Log importance weights are clamped to [-20, 20] first, so a log-probability far
    from the learner's (the intake bounds it) cannot make an infinity here.
    """
    rho = torch.exp(log_rho.clamp(-20.0, 20.0))
    clipped_rho = rho.clamp(max=rho_bar)
    cs = lam * rho.clamp(max=c_bar)
    deltas = clipped_rho * (reward + discount * values[:, 1:] - values[:, :-1]) * trained
    length = reward.shape[1]
    corrections = torch.zeros_like(values)  # v_s - V(x_s); 0 at the bootstrap step and where not trained
    acc = torch.zeros_like(values[:, 0])
    for s in range(length - 1, -1, -1):
        acc = trained[:, s] * (deltas[:, s] + discount[:, s] * cs[:, s] * acc)
        corrections[:, s] = acc
    vs_all = values + corrections
    advantages = reward + discount * vs_all[:, 1:] - values[:, :-1]
    return VTrace(vs=vs_all[:, :-1], advantages=advantages * trained, clipped_rho=clipped_rho)
