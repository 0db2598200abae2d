"""R2D2's sequence items and the arithmetic on them that does not need a network (numpy, torch-free).

The item format is described in :mod:`zmqrl.agents.r2d2`. What a network does not change is
computed here once, on the host, and shared by the learner's agent, both policies (their initial
priorities) and the learner's meaning check: which trained steps have a target, the discounted
rewards up to each one's bootstrap step, and the discount in front of the bootstrap value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from zmqrl.config import Config, ConfigError

# The bound on |c|, the LSTM's cell state, that an item's ``state_c`` must keep. ``c_t = f * c_(t-1) + i * g``
# with ``f``, ``i`` in (0, 1) and ``g`` in (-1, 1), so |c| grows by less than 1 a step from a zero start:
# no episode shorter than 100k steps can reach it (Atari's cap is 27k agent steps), while a value
# past it can only come from a broken or hostile sender. ``h = o * tanh(c)`` lies in [-1, 1].
STATE_C_LIMIT = 1e5


@dataclass(frozen=True)
class Layout:
    """Where an item's steps lie: ``burn_in`` steps, then ``length`` trained ones, then one to bootstrap."""

    burn_in: int  # B: steps that only warm up the recurrent state
    length: int  # L: trained steps
    overlap: int  # trained steps each item shares with the next

    @property
    def steps(self) -> int:
        """T = B + L + 1: the steps of one item."""
        return self.burn_in + self.length + 1

    @property
    def period(self) -> int:
        """Steps between the starts of two items of an episode: L - overlap."""
        return self.length - self.overlap


def layout(cfg: Config) -> Layout:
    """The item layout of a run (``replay.burn_in``, ``replay.sequence_length``, ``replay.overlap``)."""
    rc = cfg.replay
    if rc.sequence_length <= 0:
        raise ConfigError(f"replay.sequence_length: agent.algo={cfg.agent.algo} trains on sequences; set it > 0 "
                          f"(R2D2: 80), got {rc.sequence_length}")
    if not 0 <= rc.overlap < rc.sequence_length or rc.burn_in < 0:
        raise ConfigError(f"replay.overlap: must lie in [0, replay.sequence_length), and replay.burn_in be >= 0; "
                          f"got overlap {rc.overlap}, sequence_length {rc.sequence_length}, burn_in {rc.burn_in}")
    return Layout(rc.burn_in, rc.sequence_length, rc.overlap)


def rescale(x: np.ndarray, eps: float) -> np.ndarray:
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x (Pohlen et al. 2018; R2D2)."""
    return np.sign(x) * (np.sqrt(np.abs(x) + 1.0) - 1.0) + eps * x  # type: ignore[no-any-return]


def inverse_rescale(y: np.ndarray, eps: float) -> np.ndarray:
    """The exact inverse of :func:`rescale` (Pohlen et al. 2018, proposition A.2):
    ``sign(y) (((sqrt(1 + 4 eps (|y| + 1 + eps)) - 1) / (2 eps))^2 - 1)``, its inner fraction written as
    ``2 (|y| + 1 + eps) / (sqrt(1 + 4 eps (|y| + 1 + eps)) + 1)``, the same number without the
    cancellation that costs float32 about 1e-4 of the value."""
    a = np.abs(y) + 1.0 + eps
    root = 2.0 * a / (np.sqrt(1.0 + 4.0 * eps * a) + 1.0)
    return np.sign(y) * (root * root - 1.0)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Targets:
    """What each trained step's n-step target needs from the data, one row per item, one column per
    trained step ``j`` (the item's step ``B + j``): the target is
    ``returns + boot_discount * V(boot_index)``, V the bootstrap value of the trained-and-after steps
    ``B .. T - 1`` (``boot_index`` counts from ``B``)."""

    returns: np.ndarray  # (N, L) float32: discounted rewards from the step up to its bootstrap step
    boot_discount: np.ndarray  # (N, L) float32: the product of discounts up to the bootstrap step (0: terminated)
    boot_index: np.ndarray  # (N, L) int64 in [0, L]: the bootstrap step, counted from the first trained step
    trainable: np.ndarray  # (N, L) float32: 1 where the step is real and has a target, else 0


def sequence_targets(reward: np.ndarray, discount: np.ndarray, mask: np.ndarray, burn_in: int, n: int) -> Targets:
    """The n-step targets' data parts of items ``(N, T)``.

    Trained step ``j`` bootstraps from ``b = min(j + n, R')``: ``R'`` is the item's last real step
    ``R``, or ``R + 1`` where the episode terminated at ``R`` (its reward counts, and the discount 0
    it carries zeroes the bootstrap). So targets are truncated at the item's end (bootstrapping from
    the last step available, as SEED RL does) and at the episode's end. A step with ``b == j`` (the
    last step of a truncated episode, which has no next observation) has no target; nor does padding.
    """
    reward = np.asarray(reward, dtype=np.float64)[:, burn_in:]
    discount = np.asarray(discount, dtype=np.float64)[:, burn_in:]
    real = np.asarray(mask)[:, burn_in:] > 0
    items, after = real.shape  # after = L + 1
    length = after - 1
    count = real.sum(axis=1)  # real steps from the first trained one on (a prefix: items never restart)
    last = np.maximum(count - 1, 0)
    terminated = (count > 0) & (discount[np.arange(items), last] == 0.0)
    end = np.where(count > 0, last + terminated, 0)  # R'
    j = np.arange(length)
    boot = np.minimum(j[None, :] + n, end[:, None])  # (N, L)
    trainable = (j[None, :] < count[:, None]) & (boot > j[None, :])
    returns = np.zeros((items, length))
    scale = np.ones((items, length))
    for s in range(n):
        k = np.minimum(j + s, length)  # steps past the end are never counted (s < boot - j <= end - j)
        counted = (j[None, :] + s) < boot
        returns += np.where(counted, scale * reward[:, k], 0.0)
        scale = np.where(counted, scale * discount[:, k], scale)
    return Targets(returns=np.where(trainable, returns, 0.0).astype(np.float32),
                   boot_discount=np.where(trainable, scale, 0.0).astype(np.float32),
                   boot_index=np.minimum(boot, length).astype(np.int64),
                   trainable=trainable.astype(np.float32))


def td_errors(q: np.ndarray, boot_q: np.ndarray, action: np.ndarray, targets: Targets, rescaling: bool,
              eps: float) -> np.ndarray:
    """|TD| of every trained step (0 where it has no target), in the network's (rescaled) units.

    ``q`` (N, L, A): Q of the trained steps; ``boot_q`` (N, L + 1): the bootstrap Q of the steps from
    the first trained one on (the target network's at the online argmax; the max where one network
    stands for both); ``action`` (N, L): the actions taken at the trained steps.
    """
    boot_q, q = np.asarray(boot_q, dtype=np.float64), np.asarray(q, dtype=np.float64)
    boot = inverse_rescale(boot_q, eps) if rescaling else boot_q
    value = np.take_along_axis(boot, targets.boot_index, axis=1)
    target = targets.returns + targets.boot_discount * value
    if rescaling:
        target = rescale(target, eps)
    taken = np.take_along_axis(q, np.asarray(action, dtype=np.int64)[..., None], axis=2)[..., 0]
    return np.abs(target - taken) * targets.trainable  # type: ignore[no-any-return]


def sequence_priorities(td_abs: np.ndarray, trainable: np.ndarray, eta: float) -> np.ndarray:
    """Per item, eta * max + (1 - eta) * mean of |TD| over its steps with a target (R2D2)."""
    count = np.maximum(trainable.sum(axis=1), 1.0)
    mean = td_abs.sum(axis=1) / count
    return (eta * td_abs.max(axis=1) + (1.0 - eta) * mean).astype(np.float32)  # type: ignore[no-any-return]


def item_problem(arrays: Mapping[str, np.ndarray], burn_in: int) -> str | None:
    """What is wrong with a batch of items beyond their value limits, naming the first bad item; or None.

    Masks are 0 or 1, their ones one run (padding before it only within the burn-in, for an item
    that starts before its episode, and then with the zero state; padding after it once the
    episode has ended), the first trained step real, at least one trained step with a target, a
    discount of 0 (termination) on no real step but the last; recurrent states finite, ``h`` in
    [-1, 1] and ``|c|`` within :data:`STATE_C_LIMIT`.
    """
    mask = np.asarray(arrays["mask"])
    if mask.size == 0:
        return None
    discount = np.asarray(arrays["discount"])
    h, c = np.asarray(arrays["state_h"]), np.asarray(arrays["state_c"])
    steps = mask.shape[1]
    if burn_in + 2 > steps:
        return f"items of {steps} steps cannot hold a burn-in of {burn_in}, a trained step and a bootstrap step"

    def first(bad: np.ndarray, what: str) -> str | None:
        rows = np.flatnonzero(bad)
        return f"item {rows[0]}: {what}" if rows.size else None

    real = mask == 1
    count = real.sum(axis=1)
    start = real.argmax(axis=1)
    idx = np.arange(steps)
    run = (idx[None, :] >= start[:, None]) & (idx[None, :] < (start + count)[:, None])
    leading = start > 0
    zero_state = ~(h != 0).any(axis=1) & ~(c != 0).any(axis=1)
    last = start + np.maximum(count, 1) - 1
    early_end = real & (discount == 0) & (idx[None, :] != last[:, None])
    has_target = real[:, burn_in] & (real[:, burn_in + 1] | (discount[:, burn_in] == 0))
    for bad, what in (
            (((mask != 0) & (mask != 1)).any(axis=1), "mask holds values other than 0 and 1"),
            ((real != run).any(axis=1), "mask's ones are not one run (an item holds one stretch of one episode)"),
            (~real[:, burn_in], f"its first trained step (step {burn_in}) is padding"),
            (leading & ~zero_state, "it starts before its episode (leading padding) but not from the zero state"),
            (early_end.any(axis=1), "a discount of 0 (termination) before its last real step"),
            (~has_target, "no trained step has a target (a truncated episode's last step alone)"),
            (~np.isfinite(h).all(axis=1) | (np.abs(h) > 1).any(axis=1), "state_h not finite or outside [-1, 1]"),
            (~np.isfinite(c).all(axis=1) | (np.abs(c) > STATE_C_LIMIT).any(axis=1),
             f"state_c not finite or outside [-{STATE_C_LIMIT:g}, {STATE_C_LIMIT:g}]")):
        problem = first(bad, what)
        if problem:
            return problem
    return None
