"""Proportional prioritized experience replay (Schaul et al., 2016)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from zmqrl.replay.files import ReplayContents
from zmqrl.replay.schema import Schema
from zmqrl.replay.sumtree import MAX_LEAF, SumTree
from zmqrl.replay.uniform import UniformReplay

PRIORITY_CAP = 1e6  # raw priorities (|TD error|) above this are stored as this; far above any real TD error


class PrioritizedReplay(UniformReplay):
    """Ring-buffer replay sampling item ``i`` with probability ``p_i / sum(p)``.

    Stored priorities are ``p_i = (min(|priority|, priority_cap) + eps) ** alpha``. New items
    get the running max of stored priorities (initially 1.0, never above the cap's stored
    value ``leaf_cap``) unless ``add`` is given priorities. Importance weights
    ``(N * P(i)) ** -beta`` are divided by the largest possible weight (that of the smallest
    stored priority), so they lie in ``(0, 1]``; ``beta`` anneals linearly from ``beta0`` to 1
    over ``beta_steps`` calls to ``sample``.

    Priority policy, so that no batch and no TD error can break sampling: a negative priority
    is taken by its magnitude (counted in ``priorities_negative``); magnitudes above
    ``priority_cap`` are clamped to it (counted in ``priorities_clamped``), so the sum tree's
    leaves and total stay finite and exact; NaN and
    inf are refused (counted in ``priorities_rejected``): ``add`` raises ``ValueError`` and
    stores none of the batch, while ``update_priorities`` skips those entries, whose items
    keep the priority they had. If every stored priority is zero (possible with ``eps=0``),
    ``sample`` draws uniformly with unit weights.
    """

    _file_priorities = True

    def __init__(
        self,
        capacity: int,
        alpha: float = 0.6,
        beta0: float = 0.4,
        beta_steps: int = 100_000,
        eps: float = 1e-6,
        seed: int | None = None,
        frame_stack: int = 0,
        *,
        schema: Schema | None = None,
        priority_cap: float = PRIORITY_CAP,
        compress: str = "none",
    ) -> None:
        super().__init__(capacity, seed, frame_stack, schema=schema, compress=compress)
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if not 0 <= beta0 <= 1:
            raise ValueError(f"beta0 must lie in [0, 1], got {beta0}")
        if beta_steps < 0:
            raise ValueError(f"beta_steps must be >= 0, got {beta_steps}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        if not 0 < priority_cap < math.inf:
            raise ValueError(f"priority_cap must be positive and finite, got {priority_cap}")
        self.alpha = float(alpha)
        self.beta0 = float(beta0)
        self.beta_steps = int(beta_steps)
        self.eps = float(eps)
        self.priority_cap = float(priority_cap)
        try:
            self.leaf_cap = (self.priority_cap + self.eps) ** self.alpha  # largest stored priority
        except OverflowError:
            self.leaf_cap = math.inf
        if not self.leaf_cap <= MAX_LEAF:
            raise ValueError(f"(priority_cap + eps) ** alpha = {self.leaf_cap:.3g} does not fit the sum tree's "
                             f"float32 leaves; lower priority_cap ({priority_cap}) or alpha ({alpha})")
        self._tree = SumTree(capacity)
        self._max_priority = min(1.0, self.leaf_cap)  # running max of stored (post-alpha) priorities
        self._sample_calls = 0
        self.priorities_rejected = 0  # NaN/inf priorities refused by add (with their batch) or update_priorities
        self.priorities_clamped = 0  # priorities whose magnitude was clamped to priority_cap
        self.priorities_negative = 0  # negative priorities, stored by their magnitude

    @property
    def tree(self) -> SumTree:
        """The sum tree holding the stored (post-alpha) priorities."""
        return self._tree

    @property
    def max_priority(self) -> float:
        """Priority given to new items added without explicit priorities."""
        return self._max_priority

    @property
    def beta(self) -> float:
        """Importance-sampling exponent used by the next ``sample`` call."""
        if self._sample_calls >= self.beta_steps:
            return 1.0
        return self.beta0 + (1.0 - self.beta0) * self._sample_calls / self.beta_steps

    @property
    def nbytes(self) -> int:
        """Bytes of item storage plus the priorities' sum tree."""
        return super().nbytes + self._tree.nbytes

    def add(self, batch: Mapping[str, np.ndarray], priorities: np.ndarray | None = None,
            max_new_frames: int | None = None) -> np.ndarray:
        """Store a batch with max priority, or with the given raw ``priorities``.

        NaN or inf among ``priorities`` raises ``ValueError`` and stores nothing.
        """
        if priorities is not None:
            prio = np.asarray(priorities, dtype=np.float64).reshape(-1)
            bad = int(prio.size - np.count_nonzero(np.isfinite(prio)))
            if bad:
                self.priorities_rejected += bad
                raise ValueError(f"priorities must be finite: got {bad} NaN or inf of {prio.size}; batch not stored")
            priorities = prio
        return super().add(batch, priorities, max_new_frames)

    def _on_write(self, indices: np.ndarray, priorities: np.ndarray | None) -> None:
        if priorities is None:
            values = np.full(indices.shape, self._max_priority)
        else:
            values = self._to_leaf(priorities)
        self._tree.update(indices, values)

    def _to_leaf(self, priorities: np.ndarray) -> np.ndarray:
        """Map finite raw priorities to stored ones (clamped) and update the running max."""
        negative = int(np.count_nonzero(priorities < 0))
        if negative:
            self.priorities_negative += negative
        magnitude = np.abs(priorities)
        over = magnitude > self.priority_cap
        if over.any():
            self.priorities_clamped += int(np.count_nonzero(over))
            magnitude = np.minimum(magnitude, self.priority_cap)
        values = (magnitude + self.eps) ** self.alpha
        if values.size:
            self._max_priority = min(max(self._max_priority, float(values.max())), self.leaf_cap)
        return values

    def _draw(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """Stratified proportional indices and their normalised importance weights; uniform with unit weights
        when every stored priority is zero (nothing to be proportional to)."""
        targets = self._targets(batch_size)
        if targets is None:
            indices, weights = super()._draw(batch_size)
        else:
            indices = self._tree.find(targets)
            weights = ((self._tree.get(indices) / self._tree.min_positive()) ** -self.beta).astype(np.float32)
        self._sample_calls += 1
        return indices, weights

    def _targets(self, batch_size: int) -> np.ndarray | None:
        """The prefix sums the next sample searches the sum tree for, one in each of ``batch_size`` equal strata
        of the total (None when the total is zero)."""
        self._check_sample(batch_size)
        total = self._tree.total()
        if not total > 0.0:
            return None
        return (np.arange(batch_size) + self._rng.random(batch_size)) * (total / batch_size)

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray, sampled_at: int | None = None) -> None:
        """Set raw priorities (e.g. |TD error|) for previously sampled indices.

        ``sampled_at``: :attr:`num_added` when the batch was sampled; items written since then
        (:meth:`written_since`) keep the priority they came with, since these priorities are
        of the items the batch drew, not of those that took their place. NaN and inf entries are
        skipped (their items keep their priority) and counted in ``priorities_rejected``;
        mismatched lengths and indices out of range raise.
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        prio = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if idx.shape != prio.shape:
            raise ValueError(f"got {idx.size} indices but {prio.size} priorities")
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"indices must lie in [0, {len(self)})")
        if sampled_at is not None and sampled_at != self.num_added:
            kept = ~self.written_since(idx, sampled_at)
            idx, prio = idx[kept], prio[kept]
        finite = np.isfinite(prio)
        if not finite.all():
            self.priorities_rejected += int(prio.size - np.count_nonzero(finite))
            idx, prio = idx[finite], prio[finite]
        self._tree.update(idx, self._to_leaf(prio))

    def state_dict(self) -> dict[str, Any]:
        """Counters, RNG state, sample-call counter and max priority."""
        d = super().state_dict()
        d.update(
            sample_calls=self._sample_calls,
            max_priority=self._max_priority,
            tree_max=self._tree.max_value,
        )
        return d

    def _check_state(self, d: Mapping[str, Any]) -> dict[str, Any]:
        """Also the sample calls and max priority; a max above ``leaf_cap`` is lowered to it."""
        s = super()._check_state(d)
        sample_calls, max_priority, tree_max = int(d["sample_calls"]), float(d["max_priority"]), float(d["tree_max"])
        if sample_calls < 0:
            raise ValueError(f"sample_calls must be >= 0, got {sample_calls}")
        if not 0 < max_priority < math.inf or not 0 <= tree_max < math.inf:
            raise ValueError(f"max_priority ({max_priority}) must be positive and tree_max ({tree_max}) "
                             "non-negative, both finite")
        s.update(sample_calls=sample_calls, max_priority=min(max_priority, self.leaf_cap),
                 tree_max=min(tree_max, self.leaf_cap))
        return s

    def _apply_state(self, s: Mapping[str, Any]) -> None:
        """Restore state checked by ``_check_state`` (the tree comes with ``load``)."""
        super()._apply_state(s)
        self._sample_calls = s["sample_calls"]
        self._max_priority = s["max_priority"]
        self._tree.max_value = s["tree_max"]

    def _contents(self) -> ReplayContents:
        """Also the sum tree's leaves."""
        contents = super()._contents()
        contents.priorities = self._tree.leaves
        return contents

    def _adopt(self, contents: ReplayContents) -> None:
        """Also the file's priorities; those above ``leaf_cap`` (files written before priorities were capped)
        lowered to it."""
        assert contents.priorities is not None
        super()._adopt(contents)
        self._tree.load_leaves(np.minimum(contents.priorities, self.leaf_cap))


def priority_counts(replay: object) -> dict[str, int]:
    """Priorities prioritized replay clamped or stored by their magnitude (absurdly large, negative)."""
    if not isinstance(replay, PrioritizedReplay):
        return {}
    return {"clamped": replay.priorities_clamped, "negative": replay.priorities_negative}
