"""Uniform experience replay over a preallocated ring buffer, with image frames stored once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from zmqrl.frames import check_codec, frame_layout, image_fields
from zmqrl.replay.files import ReplayContents, read_replay, save_replay
from zmqrl.replay.frames import FramePool
from zmqrl.replay.schema import RESERVED_KEYS, Layout, Schema, match_schema, parse_schema

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
    _FRAME_HEADROOM = 4  # frame slots reserved: capacity + capacity // this (+ 1024), more as needed
    _FRAME_GROWTH = 0.5  # ... by this share of the slots at a time

    def __init__(self, capacity: int, seed: int | None = None, frame_stack: int = 0, *,
                 schema: Schema | None = None, compress: str = "none") -> None:
        if int(capacity) < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if int(frame_stack) < 0:
            raise ValueError(f"frame_stack must be >= 0, got {frame_stack}")
        check_codec(compress, "replay.compress")
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
    def frames_held(self) -> int:
        """Distinct image frames held in the frame pool (0 without one): with each frame once, about the
        new frames an item brings per item (one for a stacked transition, the period for a sequence)."""
        return len(self._pool) if self._pool is not None else 0

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
        prio = _priorities(priorities, n)
        if not self._schema:
            self._schema = {k: (tuple(a.shape[1:]), a.dtype) for k, a in arrays.items()}
            self._allocate()
        keep = slice(max(0, n - self._capacity), n)  # the newest ``capacity`` items
        arrays = {k: v[keep] for k, v in arrays.items()}
        prio = None if prio is None else prio[keep]
        indices = self._next_indices(min(n, self._capacity))
        rows = dict(arrays)
        if self._frame_refs:
            assert self._pool is not None
            keys = list(self._frame_refs)
            frames = np.concatenate([arrays[k].reshape(-1, *self._pool.frame_shape) for k in keys])
            rows.update(self._intern(frames, None, None, max_new_frames, indices))
        return self._write(rows, indices, prio, n)

    def add_frames(self, batch: Mapping[str, np.ndarray], frames: np.ndarray, frame_indices: Mapping[str, np.ndarray],
                   priorities: np.ndarray | None = None, max_new_frames: int | None = None,
                   fingerprints: np.ndarray | None = None) -> np.ndarray:
        """Store a batch whose image fields come as their distinct frames (:mod:`zmqrl.wire.compact`):
        ``frames`` ``(K, *frame shape)`` and, per image field, integer indices into them (an item's
        shape less the frame's last two axes: ``frames[indices]`` is the field); ``batch`` holds the
        other fields. The items are those ``add`` would store with each
        image field's stacks ``frames[indices]``; with a frame pool no stack is ever built: the frames
        are interned (``fingerprints``: theirs, where the caller has them) and the indices become
        slots. Frames no index refers to are not kept. Returns the storage indices written.

        A ValueError, with nothing stored, when the frames or indices do not fit this replay's
        images (fields, dtype, shapes, indices outside ``frames``) or, as for ``add``, the other
        fields or priorities do not fit, or the frames would take more than ``max_new_frames`` new slots.
        """
        frames = np.asarray(frames)
        if not self._schema:  # the first batch fixes the schema: the image items are what the indices make
            shapes = {k: (tuple(np.shape(idx)[1:]) + frames.shape[1:], frames.dtype)
                      for k, idx in frame_indices.items()}
            arrays, _ = self._check_batch(batch)
            self._schema = {**{k: (tuple(a.shape[1:]), a.dtype) for k, a in arrays.items()}, **shapes}
            self._allocate()
        fields = self._frame_refs if self._pool is not None else {k: None for k in _image_fields(self._schema)}
        if set(frame_indices) != set(fields) or not fields:
            raise ValueError(f"frame indices for {sorted(frame_indices)}, this replay's image fields are "
                             f"{sorted(fields)}")
        rest, n = self._check_batch(batch, without=tuple(fields))
        per_field = {k: frame_layout(self._schema[k][0]) for k in fields}
        frame_shape = next(iter(per_field.values()))[1]
        dtype = self._schema[next(iter(fields))][1]
        if frames.ndim != 1 + len(frame_shape) or frames.shape[1:] != frame_shape or frames.dtype != dtype:
            raise ValueError(f"frames are {frames.dtype}{list(frames.shape)}, expected {dtype} frames of "
                             f"{list(frame_shape)}")
        k = frames.shape[0]
        indices = {}
        for key, idx in frame_indices.items():
            idx = np.asarray(idx)
            per_item = per_field[key][0]
            shape = (n, *self._schema[key][0][:-2])  # an item's leading axes: frames[idx] is the item
            if idx.dtype.kind not in "iu" or idx.shape != shape:
                raise ValueError(f"{key} frame indices are {idx.dtype}{list(idx.shape)}, expected integers of "
                                 f"{list(shape)}")
            if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= k):
                raise ValueError(f"{key} frame indices run from {idx.min()} to {idx.max()}, outside the {k} frames")
            indices[key] = idx.reshape(n, per_item)
        prio = _priorities(priorities, n)
        if self._pool is None:  # frames stored as given: the stacks are built after all
            stacks = {key: frames[idx].reshape(n, *self._schema[key][0]) for key, idx in indices.items()}
            return self.add({**rest, **stacks}, prio, max_new_frames)
        if fingerprints is not None and np.shape(fingerprints) != (k,):
            raise ValueError(f"{np.shape(fingerprints)} fingerprints for {k} frames")
        keep = slice(max(0, n - self._capacity), n)
        rest = {key: v[keep] for key, v in rest.items()}
        refs = np.concatenate([indices[key][keep].reshape(-1) for key in self._frame_refs])
        prio = None if prio is None else prio[keep]
        rows = dict(rest)
        at = self._next_indices(keep.stop - keep.start)
        used, where = np.unique(refs, return_inverse=True)
        if used.size < k:  # keep only the frames the kept items refer to
            frames = frames[used]
            fingerprints = None if fingerprints is None else np.asarray(fingerprints)[used]
        rows.update(self._intern(frames, where.reshape(-1), fingerprints, max_new_frames, at))
        return self._write(rows, at, prio, n)

    def _next_indices(self, n_keep: int) -> np.ndarray:
        """The storage indices the next ``n_keep`` items go to."""
        return (self._ptr + np.arange(n_keep, dtype=np.int64)) % self._capacity

    def _write(self, rows: Mapping[str, np.ndarray], indices: np.ndarray, prio: np.ndarray | None,
               n: int) -> np.ndarray:
        """Write ``rows`` (the items kept of a batch of ``n``) at ``indices``, the ring's next slots."""
        self._added += n
        n_keep = indices.size
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

    def _intern(self, frames: np.ndarray, where: np.ndarray | None, fingerprints: np.ndarray | None,
                max_new: int | None, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Frame slots, per frame key, of items about to be written at ``indices``: ``frames`` are
        their frames, key after key and item after item (``where`` None), or distinct frames that
        ``where`` refers to in that order. Sets :attr:`new_frames`.

        New frames are interned before the overwritten items release theirs, so a frame the
        batch shares with an evicted item is kept, not freed and stored again.
        """
        pool = self._pool
        assert pool is not None
        held = len(pool)
        if where is None:
            slots = pool.intern(frames, max_new, fingerprints=fingerprints)
        else:
            refs = np.bincount(where, minlength=frames.shape[0])
            slots = pool.intern(frames, max_new, fingerprints=fingerprints, refs=refs)[where]
        evicted = indices[indices < self._size]
        alive = len(pool)
        if evicted.size:
            pool.release(np.concatenate([self._frame_refs[k][evicted].reshape(-1) for k in self._frame_refs]))
        self.new_frames = alive - held
        out, start = {}, 0
        for key, ring in self._frame_refs.items():
            size = indices.size * ring.shape[1]
            out[key] = slots[start : start + size].reshape(indices.size, ring.shape[1])
            start += size
        return out

    def _check_batch(self, batch: Mapping[str, np.ndarray],
                     without: tuple[str, ...] = ()) -> tuple[dict[str, np.ndarray], int]:
        """Validate a batch against the stored schema (less the keys ``without``); return arrays and length."""
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
            expected = {k: v for k, v in self._schema.items() if k not in without}
            match_schema(expected, {k: (tuple(a.shape[1:]), a.dtype) for k, a in arrays.items()}, "batch")
        return arrays, n

    def _allocate(self) -> None:
        """Zeroed ring storage (and an empty frame pool) for the schema."""
        frame_keys = self._frame_layout()
        self._storage = {k: np.zeros((self._capacity, *shape), dtype=dtype)
                         for k, (shape, dtype) in self._schema.items() if k not in frame_keys}
        if frame_keys:
            per_item = {k: frame_layout(self._schema[k][0])[0] for k in frame_keys}
            # Frames alive ~ one per item plus each episode's first frames; more grows the pool.
            most = max(per_item.values())
            self._use_frames(per_item, reserve=min(2 * most * self._capacity,
                                                   self._capacity + self._capacity // self._FRAME_HEADROOM + 1024))

    def _frame_layout(self) -> list[str]:
        """The frame keys of the schema, if frames are to be stored once (else empty)."""
        if self._frame_stack < 1:
            return []
        return list(_image_fields(self._schema))

    def _use_frames(self, per_item: Mapping[str, int], reserve: int) -> None:
        """An empty frame pool and zeroed slot rings for the keys of ``per_item`` (its frames per item)."""
        shape, dtype = self._schema[next(iter(per_item))]
        self._pool = FramePool(frame_layout(shape)[1], dtype, reserve, compress=self._compress,
                               growth=self._FRAME_GROWTH)
        self._frame_refs = {k: np.zeros((self._capacity, n), dtype=np.int32) for k, n in per_item.items()}

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
        indices, weights = self._draw(batch_size)
        out = self.get(indices)
        out["indices"] = indices
        out["weights"] = weights
        return out

    def _draw(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """The storage indices (int64) and importance weights (float32) of the next sample."""
        self._check_sample(batch_size)
        indices = self._rng.integers(0, self._size, size=batch_size, dtype=np.int64)
        return indices, np.ones(batch_size, dtype=np.float32)

    def _check_sample(self, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay")

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray, sampled_at: int | None = None) -> None:
        """No-op: uniform replay has no priorities."""

    def written_since(self, indices: np.ndarray, added: int) -> np.ndarray:
        """Which storage ``indices`` were written after :attr:`num_added` was ``added`` (bool per index):
        their items are not the ones a batch sampled then drew."""
        idx = np.asarray(indices, dtype=np.int64)
        since = self._added - int(added)
        if since <= 0:
            return np.zeros(idx.shape, dtype=bool)
        if since >= self._capacity:
            return np.ones(idx.shape, dtype=bool)
        return (self._ptr - 1 - idx) % self._capacity < since

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
        checkpoint the file belongs to), returned by ``load``.
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
            self._use_frames({k: r.shape[1] for k, r in refs.items()}, reserve=max(contents.frames.shape[0], 1))
            assert self._pool is not None
            self._pool.load(contents.frames, contents.frame_refcounts())
            self._frame_refs = {k: np.ascontiguousarray(r, dtype=np.int32) for k, r in refs.items()}


def _priorities(priorities: np.ndarray | None, n: int) -> np.ndarray | None:
    """``priorities`` as float64 of a batch of ``n`` (ValueError for another length)."""
    if priorities is None:
        return None
    prio = np.asarray(priorities, dtype=np.float64).reshape(-1)
    if prio.shape[0] != n:
        raise ValueError(f"priorities has length {prio.shape[0]}, batch has {n}")
    return prio


def _image_fields(schema: Layout) -> tuple[str, ...]:
    """The keys of a stored layout whose frames a frame pool keeps once (:func:`~zmqrl.frames.image_fields`)."""
    return image_fields({k: (dtype, shape) for k, (shape, dtype) in schema.items()}, FRAME_KEYS)
