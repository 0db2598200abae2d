"""Uniform experience replay over a preallocated ring buffer, with image frames stored once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from zmqrl.replay.files import ReplayContents, read_replay, save_replay
from zmqrl.replay.frames import FramePool, check_codec
from zmqrl.replay.schema import RESERVED_KEYS, Layout, Schema, frame_shape, match_schema, parse_schema

FRAME_KEYS = ("obs", "next_obs")  # image keys whose frames go to the shared frame pool


class UniformReplay:
    """Fixed-capacity FIFO replay; samples stored items uniformly with replacement.

    With a ``schema`` (key -> (dtype, per-item shape)) storage is allocated at construction and
    the schema never changes: a batch, or a file given to ``load``, with other keys, dtypes or
    per-item shapes raises ``ValueError`` and leaves the replay as it was. Without one, the
    first ``add`` fixes the schema from that batch; every later batch must match it exactly.

    With ``frame_stack`` >= 1, uint8 image observations (``obs`` and ``next_obs`` with at
    least two dimensions per item) are split into frames, ``frame_stack`` of them stacked
    along the first axis (a single frame per item if the shape does not match), and each
    distinct frame is stored once in a :class:`~zmqrl.replay.frames.FramePool`; the ring
    holds int32 frame slots for them. ``get`` and ``sample`` return the same arrays either way.
    ``compress`` ("lz4" or "zstd") keeps the pool's frames compressed, decompressed when sampled;
    it needs ``frame_stack`` >= 1 (``ConfigError`` naming ``replay.compress`` otherwise, or when
    the codec is not installed) and does nothing for items without image frames.
    """

    _file_priorities = False  # whether its files hold priorities (a prioritized replay's do)

    def __init__(self, capacity: int, seed: int | None = None, frame_stack: int = 0, *,
                 schema: Schema | None = None, compress: str = "none") -> None:
        if int(capacity) < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if int(frame_stack) < 0:
            raise ValueError(f"frame_stack must be >= 0, got {frame_stack}")
        check_codec(compress)
        if compress != "none" and int(frame_stack) < 1:
            from zmqrl.config import ConfigError  # (the config package is a leaf; imported only to report)

            raise ConfigError(f"replay.compress={compress!r} needs replay.dedup_frames: true (only the frame "
                              "pool's frames are compressed; frames stored as given are not)")
        self._compress = compress
        self._capacity = int(capacity)
        self._frame_stack = int(frame_stack)
        self._schema: Layout = {}
        self._fixed = schema is not None  # schema given at construction: files must match it too
        self._storage: dict[str, np.ndarray] = {}  # ring arrays of the keys stored as given
        self._frame_refs: dict[str, np.ndarray] = {}  # ring arrays of frame slots, (capacity, frames)
        self._pool: FramePool | None = None
        self._ptr = 0  # next storage slot to write
        self._size = 0  # number of filled slots
        self._added = 0  # items ever added (including dropped oversize items)
        self.new_frames = 0  # distinct frames the last add stored anew (0 without a frame pool)
        self._released = 0
        self._rng = np.random.default_rng(seed)
        if schema is not None:
            self._schema = parse_schema(schema)
            self._allocate()

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
    def schema(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        """Key -> (dtype, per-item shape) of stored items; empty until known (first ``add`` without a schema)."""
        return {k: (dtype, shape) for k, (shape, dtype) in self._schema.items()}

    @property
    def nbytes(self) -> int:
        """Bytes of item storage (0 before storage is allocated): ring arrays plus frames in use."""
        ring = sum(a.nbytes for a in self._storage.values()) + sum(a.nbytes for a in self._frame_refs.values())
        return ring + (self._pool.nbytes if self._pool is not None else 0)

    @property
    def frames_nbytes(self) -> int:
        """Bytes of the frame pool alone (0 without one): what grows with the distinct frames held."""
        return self._pool.nbytes if self._pool is not None else 0

    @property
    def frame_keys(self) -> tuple[str, ...]:
        """Keys whose frames are stored once in the frame pool (empty when none are)."""
        return tuple(self._frame_refs)

    # ------------------------------------------------------------------ writing
    def add(self, batch: Mapping[str, np.ndarray], priorities: np.ndarray | None = None,
            max_new_frames: int | None = None) -> np.ndarray:
        """Store a batch; return the int64 storage indices written.

        Only the newest ``capacity`` items of an oversize batch are kept.
        ``priorities`` is validated for length but otherwise unused here. ``max_new_frames``:
        with a frame pool, a ValueError (nothing stored) when the batch's image frames would take
        more new slots than this; :attr:`new_frames` says how many the last ``add`` took.
        """
        arrays, n = self._check_batch(batch)
        prio = None
        if priorities is not None:
            prio = np.asarray(priorities, dtype=np.float64).reshape(-1)
            if prio.shape[0] != n:
                raise ValueError(f"priorities has length {prio.shape[0]}, batch has {n}")
        if not self._schema:
            self._schema = {k: (tuple(a.shape[1:]), a.dtype) for k, a in arrays.items()}
            self._allocate()
        if n > self._capacity:
            arrays = {k: v[n - self._capacity :] for k, v in arrays.items()}
            prio = None if prio is None else prio[n - self._capacity :]
        n_keep = min(n, self._capacity)
        indices = (self._ptr + np.arange(n_keep, dtype=np.int64)) % self._capacity
        rows = dict(arrays)
        if self._frame_refs:
            assert self._pool is not None
            held = len(self._pool)
            rows.update(self._intern_frames(arrays, indices, max_new_frames))
            self.new_frames = len(self._pool) - held + self._released
        self._added += n
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

    def _intern_frames(self, arrays: Mapping[str, np.ndarray], indices: np.ndarray,
                       max_new: int | None = None) -> dict[str, np.ndarray]:
        """Frame slots for the frame keys of a batch about to be written at ``indices``.

        New frames are interned before the overwritten items release theirs, so a frame the
        batch shares with an evicted item is kept, not freed and stored again.
        """
        assert self._pool is not None
        keys = list(self._frame_refs)
        per_item = self._frame_refs[keys[0]].shape[1]
        n = indices.size
        frames = np.concatenate([arrays[k].reshape(n * per_item, *self._pool.frame_shape) for k in keys])
        slots = self._pool.intern(frames, max_new).reshape(len(keys), n, per_item)
        evicted = indices[indices < self._size]
        alive = len(self._pool)
        if evicted.size:
            self._pool.release(np.concatenate([self._frame_refs[k][evicted].reshape(-1) for k in keys]))
        self._released = alive - len(self._pool)
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
            match_schema(self._schema, {k: (tuple(a.shape[1:]), a.dtype) for k, a in arrays.items()}, "batch")
        return arrays, n

    def _allocate(self) -> None:
        """Zeroed ring storage (and an empty frame pool) for the schema."""
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
        self._pool = FramePool(frame_shape(shape, per_item), dtype, reserve, compress=self._compress)
        self._frame_refs = {k: np.zeros((self._capacity, per_item), dtype=np.int32) for k in keys}

    # ------------------------------------------------------------------ reading
    def get(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Return copies of the stored items at the given storage indices."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self._size):
            raise IndexError(f"indices must lie in [0, {self._size})")
        out = {k: v[idx] for k, v in self._storage.items()}
        if self._pool is not None:  # one gather for all frame keys: a compressed frame they share is unpacked once
            keys = list(self._frame_refs)
            frames = self._pool.gather(np.stack([self._frame_refs[k][idx] for k in keys]))
            for i, key in enumerate(keys):
                out[key] = frames[i].reshape(idx.shape + self._schema[key][0])
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
        """Restore counters and RNG state written by ``state_dict``; inconsistent values raise first."""
        self._apply_state(self._check_state(d))

    def _check_state(self, d: Mapping[str, Any]) -> dict[str, Any]:
        """The values of a ``state_dict`` checked and normalised, without changing anything."""
        if int(d["capacity"]) != self._capacity:
            raise ValueError(f"capacity mismatch: replay has {self._capacity}, state has {d['capacity']}")
        ptr, size, added = int(d["ptr"]), int(d["size"]), int(d["added"])
        # The ring fills from slot 0, so until it is full the next slot is the size.
        if not (0 <= ptr < self._capacity and 0 <= size <= self._capacity and (size == self._capacity or ptr == size)
                and added >= size):
            raise ValueError(f"inconsistent counters ptr={ptr} size={size} added={added} "
                             f"for capacity {self._capacity}")
        rng = dict(d["rng"])
        type(self._rng.bit_generator)().state = rng  # raises on a state this generator cannot take
        return {"capacity": self._capacity, "ptr": ptr, "size": size, "added": added, "rng": rng}

    def _apply_state(self, s: Mapping[str, Any]) -> None:
        """Set the values returned by ``_check_state``."""
        self._ptr, self._size, self._added = s["ptr"], s["size"], s["added"]
        self._rng.bit_generator.state = s["rng"]

    # ------------------------------------------------------------------ files
    def save(self, path: str, stamp: Mapping[str, Any] | None = None) -> None:
        """Write all storage and state to a single ``.npz`` file at exactly ``path``.

        ``stamp`` is small JSON-serialisable metadata (e.g. the optimisation step of the
        checkpoint the file belongs to), returned by ``load`` and by :func:`read_stamp`.
        """
        save_replay(path, self._contents(), stamp)

    def load(self, path: str) -> dict[str, Any]:
        """Replace storage and state with the contents of a file written by ``save``; return its stamp.

        The stamp is ``{}`` for a file saved without one. A file that cannot be read back whole
        and consistent (truncated, not an ``.npz``, arrays missing or of the wrong shape or dtype,
        another capacity, or another schema than one fixed at construction) raises ``ValueError``
        naming ``path``, and the replay is left as it was.
        """
        contents, stamp = read_replay(path, self._check_state, schema=self._schema if self._fixed else None,
                                      priorities=self._file_priorities)
        self._adopt(contents)
        return stamp

    def _contents(self) -> ReplayContents:
        """Storage and state as a file holds them (the arrays themselves, not copies)."""
        frames = None if self._pool is None else self._pool.frames_at(np.arange(self._pool.high))  # raw or compressed
        frame_schema = {k: v for k, v in self._schema.items() if k in self._frame_refs}
        return ReplayContents(self.state_dict(), dict(self._storage), dict(self._frame_refs), frame_schema, frames)

    def _adopt(self, contents: ReplayContents) -> None:
        """Take the checked contents of a file in place of this replay's own."""
        self._apply_state(contents.state)
        self._schema = contents.schema
        self._storage = contents.storage
        self._frame_refs, self._pool = {}, None
        if contents.frame_refs:
            assert contents.frames is not None
            refs = contents.frame_refs
            self._use_frames(list(refs), next(iter(refs.values())).shape[1], reserve=max(contents.frames.shape[0], 1))
            assert self._pool is not None
            self._pool.load(contents.frames, contents.frame_refcounts())
            self._frame_refs = {k: np.ascontiguousarray(r, dtype=np.int32) for k, r in refs.items()}
