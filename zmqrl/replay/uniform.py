"""Uniform experience replay over a preallocated ring buffer."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

RESERVED_KEYS = ("indices", "weights")
_STATE_KEY = "state"
_STORAGE_PREFIX = "storage:"


class UniformReplay:
    """Fixed-capacity FIFO replay; samples stored items uniformly with replacement.

    Storage is allocated on the first ``add`` from the keys, per-item shapes and
    dtypes of that batch; every later batch must match that schema exactly.
    """

    def __init__(self, capacity: int, seed: int | None = None) -> None:
        if int(capacity) < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = int(capacity)
        self._storage: dict[str, np.ndarray] = {}
        self._ptr = 0  # next storage slot to write
        self._size = 0  # number of filled slots
        self._added = 0  # items ever added (including dropped oversize items)
        self._rng = np.random.default_rng(seed)

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        return self._size

    @property
    def capacity(self) -> int:
        """Maximum number of stored items."""
        return self._capacity

    @property
    def num_added(self) -> int:
        """Total number of items ever passed to ``add``."""
        return self._added

    @property
    def nbytes(self) -> int:
        """Bytes of preallocated item storage (0 before the first ``add``)."""
        return sum(a.nbytes for a in self._storage.values())

    # ------------------------------------------------------------------ writing
    def add(self, batch: Mapping[str, np.ndarray], priorities: np.ndarray | None = None) -> np.ndarray:
        """Store a batch; return the int64 storage indices written.

        Only the newest ``capacity`` items of an oversize batch are kept.
        ``priorities`` is validated for length but otherwise unused here.
        """
        arrays, n = self._check_batch(batch)
        prio = None
        if priorities is not None:
            prio = np.asarray(priorities, dtype=np.float64).reshape(-1)
            if prio.shape[0] != n:
                raise ValueError(f"priorities has length {prio.shape[0]}, batch has {n}")
        if not self._storage:
            self._allocate(arrays)
        if n > self._capacity:
            arrays = {k: v[n - self._capacity :] for k, v in arrays.items()}
            prio = None if prio is None else prio[n - self._capacity :]
        self._added += n
        n_keep = min(n, self._capacity)
        first = min(n_keep, self._capacity - self._ptr)
        for key, arr in arrays.items():
            store = self._storage[key]
            store[self._ptr : self._ptr + first] = arr[:first]
            store[: n_keep - first] = arr[first:]
        indices = (self._ptr + np.arange(n_keep, dtype=np.int64)) % self._capacity
        self._ptr = (self._ptr + n_keep) % self._capacity
        self._size = min(self._size + n_keep, self._capacity)
        self._on_write(indices, prio)
        return indices

    def _on_write(self, indices: np.ndarray, priorities: np.ndarray | None) -> None:
        """Hook for subclasses: called after items are written at ``indices``."""

    def _check_batch(self, batch: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
        """Validate a batch against the stored schema; return arrays and length."""
        if not batch:
            raise ValueError("batch must contain at least one key")
        arrays = {str(k): np.asarray(v) for k, v in batch.items()}
        for key, arr in arrays.items():
            if key in RESERVED_KEYS:
                raise ValueError(f"key {key!r} is reserved for sample() output")
            if arr.ndim == 0:
                raise ValueError(f"key {key!r}: expected a leading batch dimension, got a scalar")
        lengths = {k: a.shape[0] for k, a in arrays.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"all keys need the same leading length, got {lengths}")
        n = next(iter(lengths.values()))
        if self._storage:
            missing = sorted(set(self._storage) - set(arrays))
            extra = sorted(set(arrays) - set(self._storage))
            if missing:
                raise ValueError(f"batch is missing key {missing[0]!r} (expected keys {sorted(self._storage)})")
            if extra:
                raise ValueError(f"batch has unexpected key {extra[0]!r} (expected keys {sorted(self._storage)})")
            for key, arr in arrays.items():
                store = self._storage[key]
                if arr.shape[1:] != store.shape[1:]:
                    raise ValueError(f"key {key!r}: expected per-item shape {store.shape[1:]}, got {arr.shape[1:]}")
                if arr.dtype != store.dtype:
                    raise ValueError(f"key {key!r}: expected dtype {store.dtype}, got {arr.dtype}")
        return arrays, n

    def _allocate(self, arrays: Mapping[str, np.ndarray]) -> None:
        self._storage = {k: np.zeros((self._capacity, *a.shape[1:]), dtype=a.dtype) for k, a in arrays.items()}

    # ------------------------------------------------------------------ reading
    def get(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Return copies of the stored items at the given storage indices."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self._size):
            raise IndexError(f"indices must lie in [0, {self._size})")
        return {k: v[idx] for k, v in self._storage.items()}

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        """Sample ``batch_size`` items uniformly with replacement."""
        self._check_sample(batch_size)
        indices = self._rng.integers(0, self._size, size=batch_size, dtype=np.int64)
        out = self.get(indices)
        out["indices"] = indices
        out["weights"] = np.ones(batch_size, dtype=np.float32)
        return out

    def _check_sample(self, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay")

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """No-op: uniform replay has no priorities."""

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Counters and RNG state as JSON-serialisable values (no storage)."""
        return {
            "capacity": self._capacity,
            "ptr": self._ptr,
            "size": self._size,
            "added": self._added,
            "rng": self._rng.bit_generator.state,
        }

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        """Restore counters and RNG state written by ``state_dict``."""
        if int(d["capacity"]) != self._capacity:
            raise ValueError(f"capacity mismatch: replay has {self._capacity}, state has {d['capacity']}")
        self._ptr = int(d["ptr"])
        self._size = int(d["size"])
        self._added = int(d["added"])
        self._rng.bit_generator.state = dict(d["rng"])

    def _extra_arrays(self) -> dict[str, np.ndarray]:
        """Hook for subclasses: extra arrays to include in ``save``."""
        return {}

    def _load_extra_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Hook for subclasses: restore arrays written by ``_extra_arrays``."""

    def save(self, path: str) -> None:
        """Write all storage and state to a single ``.npz`` file at exactly ``path``."""
        state = json.dumps(self.state_dict()).encode("utf-8")
        arrays = {_STORAGE_PREFIX + k: v for k, v in self._storage.items()}
        arrays.update(self._extra_arrays())
        arrays[_STATE_KEY] = np.frombuffer(state, dtype=np.uint8)
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as f:
            np.savez(f, allow_pickle=False, **arrays)
        os.replace(tmp, path)

    def load(self, path: str) -> None:
        """Replace storage and state with the contents of a file written by ``save``."""
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        state = json.loads(arrays.pop(_STATE_KEY).tobytes().decode("utf-8"))
        storage = {
            name[len(_STORAGE_PREFIX) :]: arrays.pop(name) for name in list(arrays) if name.startswith(_STORAGE_PREFIX)
        }
        for key, arr in storage.items():
            if arr.shape[:1] != (self._capacity,):
                raise ValueError(f"key {key!r}: stored length {arr.shape[:1]} != capacity {self._capacity}")
        self.load_state_dict(state)
        self._storage = storage
        self._load_extra_arrays(arrays)
