"""Uniform experience replay over a preallocated ring buffer, with image frames stored once."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from zmqrl.replay.frames import FramePool

RESERVED_KEYS = ("indices", "weights")
FRAME_KEYS = ("obs", "next_obs")  # image keys whose frames go to the shared frame pool
_STATE_KEY = "state"
_STORAGE_PREFIX = "storage:"
_REFS_PREFIX = "frame_refs:"
_FRAMES_KEY = "frames"


class UniformReplay:
    """Fixed-capacity FIFO replay; samples stored items uniformly with replacement.

    Storage is allocated on the first ``add`` from the keys, per-item shapes and
    dtypes of that batch; every later batch must match that schema exactly.

    With ``frame_stack`` >= 1, uint8 image observations (``obs`` and ``next_obs`` with at
    least two dimensions per item) are split into frames, ``frame_stack`` of them stacked
    along the first axis (a single frame per item if the shape does not match), and each
    distinct frame is stored once in a :class:`~zmqrl.replay.frames.FramePool`; the ring
    holds int32 frame slots for them. ``get`` and ``sample`` return the same arrays either way.
    """

    def __init__(self, capacity: int, seed: int | None = None, frame_stack: int = 0) -> None:
        if int(capacity) < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if int(frame_stack) < 0:
            raise ValueError(f"frame_stack must be >= 0, got {frame_stack}")
        self._capacity = int(capacity)
        self._frame_stack = int(frame_stack)
        self._schema: dict[str, tuple[tuple[int, ...], np.dtype]] = {}  # key -> per-item shape, dtype
        self._storage: dict[str, np.ndarray] = {}  # ring arrays of the keys stored as given
        self._frame_refs: dict[str, np.ndarray] = {}  # ring arrays of frame slots, (capacity, frames)
        self._pool: FramePool | None = None
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
        """Bytes of item storage (0 before the first ``add``): ring arrays plus frames in use."""
        ring = sum(a.nbytes for a in self._storage.values()) + sum(a.nbytes for a in self._frame_refs.values())
        return ring + (self._pool.nbytes if self._pool is not None else 0)

    @property
    def frame_keys(self) -> tuple[str, ...]:
        """Keys whose frames are stored once in the frame pool (empty when none are)."""
        return tuple(self._frame_refs)

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
        if not self._schema:
            self._allocate(arrays)
        if n > self._capacity:
            arrays = {k: v[n - self._capacity :] for k, v in arrays.items()}
            prio = None if prio is None else prio[n - self._capacity :]
        self._added += n
        n_keep = min(n, self._capacity)
        indices = (self._ptr + np.arange(n_keep, dtype=np.int64)) % self._capacity
        rows = dict(arrays)
        if self._frame_refs:
            rows.update(self._intern_frames(arrays, indices))
        first = min(n_keep, self._capacity - self._ptr)
        for key, arr in rows.items():
            store = self._frame_refs[key] if key in self._frame_refs else self._storage[key]
            store[self._ptr : self._ptr + first] = arr[:first]
            store[: n_keep - first] = arr[first:]
        self._ptr = (self._ptr + n_keep) % self._capacity
        self._size = min(self._size + n_keep, self._capacity)
        self._on_write(indices, prio)
        return indices

    def _on_write(self, indices: np.ndarray, priorities: np.ndarray | None) -> None:
        """Hook for subclasses: called after items are written at ``indices``."""

    def _intern_frames(self, arrays: Mapping[str, np.ndarray], indices: np.ndarray) -> dict[str, np.ndarray]:
        """Frame slots for the frame keys of a batch about to be written at ``indices``.

        New frames are interned before the overwritten items release theirs, so a frame the
        batch shares with an evicted item is kept, not freed and stored again.
        """
        assert self._pool is not None
        keys = list(self._frame_refs)
        per_item = self._frame_refs[keys[0]].shape[1]
        n = indices.size
        frames = np.concatenate([arrays[k].reshape(n * per_item, *self._pool.frame_shape) for k in keys])
        slots = self._pool.intern(frames).reshape(len(keys), n, per_item)
        evicted = indices[indices < self._size]
        if evicted.size:
            self._pool.release(np.concatenate([self._frame_refs[k][evicted].reshape(-1) for k in keys]))
        return {k: slots[i] for i, k in enumerate(keys)}

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
        if self._schema:
            missing = sorted(set(self._schema) - set(arrays))
            extra = sorted(set(arrays) - set(self._schema))
            if missing:
                raise ValueError(f"batch is missing key {missing[0]!r} (expected keys {sorted(self._schema)})")
            if extra:
                raise ValueError(f"batch has unexpected key {extra[0]!r} (expected keys {sorted(self._schema)})")
            for key, arr in arrays.items():
                shape, dtype = self._schema[key]
                if arr.shape[1:] != shape:
                    raise ValueError(f"key {key!r}: expected per-item shape {shape}, got {arr.shape[1:]}")
                if arr.dtype != dtype:
                    raise ValueError(f"key {key!r}: expected dtype {dtype}, got {arr.dtype}")
        return arrays, n

    def _allocate(self, arrays: Mapping[str, np.ndarray]) -> None:
        self._schema = {k: (tuple(a.shape[1:]), a.dtype) for k, a in arrays.items()}
        frame_keys = self._frame_layout()
        self._storage = {k: np.zeros((self._capacity, *shape), dtype=dtype)
                         for k, (shape, dtype) in self._schema.items() if k not in frame_keys}
        if frame_keys:
            shape = self._schema[frame_keys[0]][0]
            per_item = self._frame_stack if len(shape) >= 3 and shape[0] == self._frame_stack else 1
            # Frames alive ~ one per item plus each episode's first frames; more grows the pool.
            self._use_frames(frame_keys, per_item,
                             reserve=min(2 * per_item * self._capacity, self._capacity + self._capacity // 4 + 1024))

    def _frame_layout(self) -> list[str]:
        """The frame keys of the schema, if frames are to be stored once (else empty)."""
        if self._frame_stack < 1:
            return []
        keys = [k for k in FRAME_KEYS if k in self._schema]
        if not keys or len({self._schema[k] for k in keys}) != 1:
            return []
        shape, dtype = self._schema[keys[0]]
        return keys if dtype == np.uint8 and len(shape) >= 2 else []

    def _use_frames(self, keys: list[str], per_item: int, reserve: int) -> None:
        """An empty frame pool and zeroed slot rings for ``keys``, ``per_item`` frames per item."""
        shape, dtype = self._schema[keys[0]]
        self._pool = FramePool(shape[1:] if per_item > 1 else shape, dtype, reserve)
        self._frame_refs = {k: np.zeros((self._capacity, per_item), dtype=np.int32) for k in keys}

    # ------------------------------------------------------------------ reading
    def get(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Return copies of the stored items at the given storage indices."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self._size):
            raise IndexError(f"indices must lie in [0, {self._size})")
        out = {k: v[idx] for k, v in self._storage.items()}
        if self._pool is not None:
            for key, refs in self._frame_refs.items():
                out[key] = self._pool.gather(refs[idx]).reshape(idx.shape + self._schema[key][0])
        return out

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
        frames = {k: [list(shape), dtype.str] for k, (shape, dtype) in self._schema.items() if k in self._frame_refs}
        state = json.dumps({**self.state_dict(), "frame_schema": frames}).encode("utf-8")
        arrays = {_STORAGE_PREFIX + k: v for k, v in self._storage.items()}
        arrays.update({_REFS_PREFIX + k: v for k, v in self._frame_refs.items()})
        if self._pool is not None:
            arrays[_FRAMES_KEY] = self._pool.frames[: self._pool.high]
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
        frame_schema = {k: (tuple(shape), np.dtype(dtype))
                        for k, (shape, dtype) in state.pop("frame_schema", {}).items()}
        storage = {
            name[len(_STORAGE_PREFIX) :]: arrays.pop(name) for name in list(arrays) if name.startswith(_STORAGE_PREFIX)
        }
        refs = {name[len(_REFS_PREFIX) :]: arrays.pop(name) for name in list(arrays) if name.startswith(_REFS_PREFIX)}
        for key, arr in {**storage, **refs}.items():
            if arr.shape[:1] != (self._capacity,):
                raise ValueError(f"key {key!r}: stored length {arr.shape[:1]} != capacity {self._capacity}")
        if sorted(refs) != sorted(frame_schema):
            raise ValueError(f"frame keys {sorted(refs)} do not match the file's frame schema {sorted(frame_schema)}")
        frames = arrays.pop(_FRAMES_KEY, None)
        self.load_state_dict(state)
        self._schema = {**{k: (tuple(a.shape[1:]), a.dtype) for k, a in storage.items()}, **frame_schema}
        self._storage = storage
        self._frame_refs, self._pool = {}, None
        if refs:
            self._load_frames(refs, frames)
        self._load_extra_arrays(arrays)

    def _load_frames(self, refs: Mapping[str, np.ndarray], frames: np.ndarray | None) -> None:
        if frames is None:
            raise ValueError("the file has frame slots but no frames")
        self._use_frames(list(refs), next(iter(refs.values())).shape[1], reserve=max(frames.shape[0], 1))
        assert self._pool is not None
        live = np.concatenate([r[: self._size].reshape(-1) for r in refs.values()]).astype(np.int64)
        if live.size and (live.min() < 0 or live.max() >= frames.shape[0]):
            raise ValueError(f"frame slots point outside the {frames.shape[0]} stored frames")
        refcount = np.bincount(live, minlength=frames.shape[0]).astype(np.int32)
        self._pool.load(frames, refcount)
        self._frame_refs = {k: np.ascontiguousarray(r, dtype=np.int32) for k, r in refs.items()}
