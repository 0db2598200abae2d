"""Proportional prioritized experience replay (Schaul et al., 2016)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from zmqrl.replay.sumtree import SumTree
from zmqrl.replay.uniform import UniformReplay


class PrioritizedReplay(UniformReplay):
    """Ring-buffer replay sampling item ``i`` with probability ``p_i / sum(p)``.

    Stored priorities are ``p_i = (|priority| + eps) ** alpha``. New items get the
    running max of stored priorities (initially 1.0) unless ``add`` is given
    priorities. Importance weights ``(N * P(i)) ** -beta`` are divided by the
    largest possible weight (that of the smallest stored priority), so they lie
    in ``(0, 1]``; ``beta`` anneals linearly from ``beta0`` to 1 over
    ``beta_steps`` calls to ``sample``.
    """

    def __init__(
        self,
        capacity: int,
        alpha: float = 0.6,
        beta0: float = 0.4,
        beta_steps: int = 100_000,
        eps: float = 1e-6,
        seed: int | None = None,
        frame_stack: int = 0,
    ) -> None:
        super().__init__(capacity, seed, frame_stack)
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if not 0 <= beta0 <= 1:
            raise ValueError(f"beta0 must lie in [0, 1], got {beta0}")
        if beta_steps < 0:
            raise ValueError(f"beta_steps must be >= 0, got {beta_steps}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        self.alpha = float(alpha)
        self.beta0 = float(beta0)
        self.beta_steps = int(beta_steps)
        self.eps = float(eps)
        self._tree = SumTree(capacity)
        self._max_priority = 1.0  # running max of stored (post-alpha) priorities
        self._sample_calls = 0

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

    def add(self, batch: Mapping[str, np.ndarray], priorities: np.ndarray | None = None) -> np.ndarray:
        """Store a batch with max priority, or with the given raw ``priorities``."""
        if priorities is not None:
            _check_finite(priorities)
        return super().add(batch, priorities)

    def _on_write(self, indices: np.ndarray, priorities: np.ndarray | None) -> None:
        if priorities is None:
            values = np.full(indices.shape, self._max_priority)
        else:
            values = self._to_leaf(priorities)
        self._tree.update(indices, values)

    def _to_leaf(self, priorities: np.ndarray) -> np.ndarray:
        """Map raw priorities to stored ones and update the running max."""
        values = (np.abs(_check_finite(priorities)) + self.eps) ** self.alpha
        if values.size:
            self._max_priority = max(self._max_priority, float(values.max()))
        return values

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        """Stratified proportional sample with normalised importance weights."""
        self._check_sample(batch_size)
        beta = self.beta
        total = self._tree.total()
        targets = (np.arange(batch_size) + self._rng.random(batch_size)) * (total / batch_size)
        indices = self._tree.find(targets)
        p_min = self._tree.min_positive()
        weights = (self._tree.get(indices) / p_min) ** -beta
        self._sample_calls += 1
        out = self.get(indices)
        out["indices"] = indices
        out["weights"] = weights.astype(np.float32)
        return out

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set raw priorities (e.g. |TD error|) for previously sampled indices."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        prio = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if idx.shape != prio.shape:
            raise ValueError(f"got {idx.size} indices but {prio.size} priorities")
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"indices must lie in [0, {len(self)})")
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

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        """Restore state written by ``state_dict`` (the tree comes with ``load``)."""
        super().load_state_dict(d)
        self._sample_calls = int(d["sample_calls"])
        self._max_priority = float(d["max_priority"])
        self._tree.max_value = float(d["tree_max"])

    def _extra_arrays(self) -> dict[str, np.ndarray]:
        return {"priorities": self._tree.leaves}

    def _load_extra_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        if "priorities" in arrays:
            leaves = arrays["priorities"]
        elif "tree" in arrays:  # files written before the two-level tree: a binary tree, leaves at the end
            tree = arrays["tree"]
            num_leaves = 1 << (self.capacity - 1).bit_length()
            if tree.shape != (2 * num_leaves,):
                raise ValueError(f"tree: expected shape {(2 * num_leaves,)}, got {tree.shape}")
            leaves = tree[num_leaves : num_leaves + self.capacity]
        else:
            raise ValueError("no 'priorities' array in the replay file")
        if leaves.shape != (self.capacity,):
            raise ValueError(f"priorities: expected shape {(self.capacity,)}, got {leaves.shape}")
        self._tree.load_leaves(leaves)


def _check_finite(priorities: np.ndarray) -> np.ndarray:
    p = np.asarray(priorities, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(p)):
        raise ValueError("priorities must be finite: got NaN or inf")
    return p
