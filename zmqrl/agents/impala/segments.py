"""IMPALA's and APPO's segments and the arithmetic on them that needs no network (numpy, torch-free).

A segment is what one actor env did over ``L = agent.unroll_length`` steps of one episode, and the step
after them, built by :class:`zmqrl.run.adders.SequenceAdder` (no burn-in, no overlap): ``T = L + 1`` steps
of ``obs``, ``action``, ``reward``, ``discount`` (``gamma``, 0 where the episode terminated with the
step), ``mask`` (1 for the episode's real steps, 0 for padding after its end) and ``logp``, the
behaviour policy's log-probability of the action taken. An episode's segments start at its steps
0, L, 2L, ...; step ``L`` of a segment is the first of the next and only bootstraps the last trained
one. Step ``j < L`` is *trained* where it is real and has a value to bootstrap from: the next step is
real (its observation is in the segment), or the episode terminated with step ``j`` (nothing to
bootstrap). The last real step of a truncated episode has neither: the steps before it bootstrap
from its value, as SEED RL and R2D2's items do.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def trained_steps(mask: np.ndarray, discount: np.ndarray) -> np.ndarray:
    """(N, L) float32: 1 where step ``j < L`` of a segment ``(N, L + 1)`` is trained (module docstring)."""
    mask, discount = np.asarray(mask), np.asarray(discount)
    real = mask[:, :-1] > 0
    bootstrap = (mask[:, 1:] > 0) | (discount[:, :-1] == 0)
    return (real & bootstrap).astype(np.float32)  # type: ignore[no-any-return]


def segment_problem(arrays: Mapping[str, np.ndarray]) -> str | None:
    """What is wrong with a batch of segments beyond their fields' value limits, naming the first bad one; or
    None. Masks are 0 or 1, their ones a run from the segment's first step, a discount of 0 (termination)
    on no real step but the last, and at least one step trained."""
    mask = np.asarray(arrays["mask"])
    if mask.size == 0:
        return None
    discount = np.asarray(arrays["discount"])
    if mask.ndim != 2 or mask.shape[1] < 2:
        return f"segments of shape {mask.shape} hold no step to train and none to bootstrap from"
    real = mask == 1
    count = real.sum(axis=1)
    idx = np.arange(mask.shape[1])
    last = np.maximum(count, 1) - 1
    early_end = real & (discount == 0) & (idx[None, :] != last[:, None])
    for bad, what in ((((mask != 0) & (mask != 1)).any(axis=1), "mask holds values other than 0 and 1"),
                      ((real != (idx[None, :] < count[:, None])).any(axis=1),
                       "mask's ones are not one run from its first step (a segment holds one stretch of one episode)"),
                      (early_end.any(axis=1), "a discount of 0 (termination) before its last real step"),
                      (trained_steps(mask, discount).sum(axis=1) == 0,
                       "no step is trained (a truncated episode's last step alone)")):
        rows = np.flatnonzero(bad)
        if rows.size:
            return f"segment {rows[0]}: {what}"
    return None
