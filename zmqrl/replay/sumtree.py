"""Array-backed sum tree with vectorised updates and prefix-sum search."""

from __future__ import annotations

import numpy as np


class SumTree:
    """Binary sum tree over ``capacity`` non-negative leaf values.

    The internal leaf count is ``capacity`` rounded up to a power of two. Nodes
    live in the flat float64 array ``tree`` (root at 1, children of ``i`` at
    ``2i`` and ``2i + 1``, leaf ``j`` at ``num_leaves + j``); index 0 is unused.
    """

    def __init__(self, capacity: int) -> None:
        if int(capacity) < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.num_leaves = 1 << (self.capacity - 1).bit_length()  # leaves, power of two
        self.depth = self.num_leaves.bit_length() - 1  # levels below the root
        self.tree = np.zeros(2 * self.num_leaves, dtype=np.float64)
        # Min over positive leaves (zero leaves count as +inf), kept beside the sums so that the
        # smallest priority (for importance-weight normalisation) is O(1) to read, not an O(N) scan.
        self.min_tree = np.full(2 * self.num_leaves, np.inf)
        self.max_value = 0.0  # running max of every value written

    @property
    def leaves(self) -> np.ndarray:
        """Read-only view of the ``capacity`` leaf values."""
        view = self.tree[self.num_leaves : self.num_leaves + self.capacity]
        view.flags.writeable = False
        return view

    def total(self) -> float:
        """Sum of all leaves."""
        return float(self.tree[1])

    def min_positive(self) -> float:
        """Smallest positive leaf (inf when every leaf is zero)."""
        return float(self.min_tree[1])

    def rebuild_min(self) -> None:
        """Recompute the min tree from the leaves (after the sum tree was loaded wholesale)."""
        leaves = self.tree[self.num_leaves:]
        self.min_tree[self.num_leaves:] = np.where(leaves > 0, leaves, np.inf)
        level = self.num_leaves
        while level > 1:
            half = level // 2
            children = self.min_tree[level:2 * level]
            self.min_tree[half:level] = np.minimum(children[0::2], children[1::2])
            level = half

    def get(self, indices: np.ndarray) -> np.ndarray:
        """Leaf values at ``indices``."""
        return self.tree[self.num_leaves + self._check_indices(indices)]

    def update(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Set leaves; with repeated indices the last write wins."""
        idx = self._check_indices(indices)
        vals = np.asarray(values, dtype=np.float64).reshape(-1)
        if vals.shape != idx.shape:
            raise ValueError(f"got {idx.size} indices but {vals.size} values")
        if idx.size == 0:
            return
        if not np.all(np.isfinite(vals)) or np.any(vals < 0):
            raise ValueError("values must be finite and non-negative")
        # np.unique keeps the first occurrence, so search the reversed arrays.
        nodes, last = np.unique(idx[::-1], return_index=True)
        leaf_values = vals[::-1][last]
        self.tree[self.num_leaves + nodes] = leaf_values
        self.min_tree[self.num_leaves + nodes] = np.where(leaf_values > 0, leaf_values, np.inf)
        self.max_value = max(self.max_value, float(vals.max()))
        # Recomputing a parent from its children is idempotent, so repeated parents need no unique().
        nodes = (nodes + self.num_leaves) >> 1
        for _ in range(self.depth):
            self.tree[nodes] = self.tree[2 * nodes] + self.tree[2 * nodes + 1]
            self.min_tree[nodes] = np.minimum(self.min_tree[2 * nodes], self.min_tree[2 * nodes + 1])
            nodes >>= 1

    def find(self, values: np.ndarray) -> np.ndarray:
        """Leaf index holding each prefix-sum value (first leaf whose cumsum exceeds it).

        Values are clipped into ``[0, total)``; a zero-valued leaf reached through
        float round-off is replaced by the nearest non-zero leaf before it (or
        after it if there is none before).
        """
        total = self.total()
        if total <= 0.0:
            raise ValueError("cannot search an empty sum tree")
        v = np.clip(np.asarray(values, dtype=np.float64).reshape(-1), 0.0, np.nextafter(total, 0.0))
        node = np.ones(v.shape, dtype=np.int64)
        for _ in range(self.depth):
            left = 2 * node
            left_sum = self.tree[left]
            right = v >= left_sum
            v = np.where(right, v - left_sum, v)
            node = np.where(right, left + 1, left)
        leaf = node - self.num_leaves
        bad = self.tree[node] <= 0.0
        if np.any(bad):
            leaf[bad] = self._nearest_nonzero(leaf[bad])
        return leaf

    def _nearest_nonzero(self, leaf: np.ndarray) -> np.ndarray:
        nonzero = np.flatnonzero(self.tree[self.num_leaves :] > 0.0)
        pos = np.searchsorted(nonzero, leaf, side="right") - 1
        return nonzero[np.maximum(pos, 0)]

    def _check_indices(self, indices: np.ndarray) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.capacity):
            raise IndexError(f"indices must lie in [0, {self.capacity})")
        return idx
