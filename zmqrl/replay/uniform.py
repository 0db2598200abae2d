"""Uniform experience replay over a preallocated ring buffer, with image frames stored once."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from zmqrl.frames import check_codec, frame_layout, image_fields
from zmqrl.replay.files import (
    FILE_ERRORS,
    FRAMES_KEY,
    REFS_PREFIX,
    STAMP_KEY,
    STATE_KEY,
    STORAGE_PREFIX,
    decode_json,
    decode_stamp,
    describe_error,
    encode_json,
    read_npz,
)
from zmqrl.replay.frames import FramePool

Schema = Mapping[str, tuple[npt.DTypeLike, tuple[int, ...]]]  # key -> (dtype, per-item shape)
_Layout = dict[str, tuple[tuple[int, ...], np.dtype]]  # the stored form: key -> (per-item shape, dtype)

RESERVED_KEYS = ("indices", "weights")
FRAME_KEYS = ("obs", "next_obs")  # image keys whose frames go to the shared frame pool


@dataclass
class _Staged:
    """The checked contents of a replay file, ready to replace a replay's own."""

    state: dict[str, Any]
    schema: _Layout
    storage: dict[str, np.ndarray]
    refs: dict[str, np.ndarray]
    frames: np.ndarray | None
    extra: dict[str, Any] = field(default_factory=dict)


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
        self._schema: _Layout = {}
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
            self._schema = _parse_schema(schema)
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
        """Total number of items ever passed to ``add`` or ``add_frames``."""
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
            _match_schema(expected, {k: (tuple(a.shape[1:]), a.dtype) for k, a in arrays.items()}, "batch")
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
                                                   self._capacity + self._capacity // 4 + 1024))

    def _frame_layout(self) -> list[str]:
        """The frame keys of the schema, if frames are to be stored once (else empty)."""
        if self._frame_stack < 1:
            return []
        return list(_image_fields(self._schema))

    def _use_frames(self, per_item: Mapping[str, int], reserve: int) -> None:
        """An empty frame pool and zeroed slot rings for the keys of ``per_item`` (its frames per item)."""
        shape, dtype = self._schema[next(iter(per_item))]
        self._pool = FramePool(frame_layout(shape)[1], dtype, reserve, compress=self._compress)
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

    def _extra_arrays(self) -> dict[str, np.ndarray]:
        """Hook for subclasses: extra arrays to include in ``save``."""
        return {}

    def _stage_extra(self, arrays: Mapping[str, np.ndarray], state: Mapping[str, Any]) -> dict[str, Any]:
        """Hook for subclasses: check the arrays written by ``_extra_arrays``; raise if they do not fit."""
        return {}

    def _commit_extra(self, extra: Mapping[str, Any]) -> None:
        """Hook for subclasses: take the values returned by ``_stage_extra``."""

    def save(self, path: str, stamp: Mapping[str, Any] | None = None) -> None:
        """Write all storage and state to a single ``.npz`` file at exactly ``path``.

        ``stamp`` is small JSON-serialisable metadata (e.g. the optimisation step of the
        checkpoint the file belongs to), returned by ``load`` and by :func:`read_stamp`.
        """
        arrays = {}
        if stamp is not None:
            arrays[STAMP_KEY] = encode_json(dict(stamp), "stamp", strict=True)
        frames = {k: [list(shape), dtype.str] for k, (shape, dtype) in self._schema.items() if k in self._frame_refs}
        arrays.update({STORAGE_PREFIX + k: v for k, v in self._storage.items()})
        arrays.update({REFS_PREFIX + k: v for k, v in self._frame_refs.items()})
        if self._pool is not None:
            arrays[FRAMES_KEY] = self._pool.frames_at(np.arange(self._pool.high))  # raw, compressed or not
        arrays.update(self._extra_arrays())
        arrays[STATE_KEY] = encode_json({**self.state_dict(), "frame_schema": frames}, "state")
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as f:
            np.savez(f, allow_pickle=False, **arrays)
        os.replace(tmp, path)

    def load(self, path: str) -> dict[str, Any]:
        """Replace storage and state with the contents of a file written by ``save``; return its stamp.

        The stamp is ``{}`` for a file saved without one. A file that cannot be read back whole
        and consistent (truncated, not an ``.npz``, arrays missing or of the wrong shape or dtype,
        another capacity, or another schema than one fixed at construction) raises ``ValueError``
        naming ``path``, and the replay is left as it was.
        """
        try:
            arrays = read_npz(path)
            stamp = decode_stamp(arrays.pop(STAMP_KEY, None))
            staged = self._stage(arrays)
        except FILE_ERRORS as exc:
            raise ValueError(f"{path}: unreadable replay file: {describe_error(exc)}") from None
        self._apply_state(staged.state)
        self._schema = staged.schema
        self._storage = staged.storage
        self._frame_refs, self._pool = {}, None
        if staged.refs:
            assert staged.frames is not None
            self._load_frames(staged.refs, staged.frames)
        self._commit_extra(staged.extra)
        return stamp

    def _stage(self, arrays: dict[str, np.ndarray]) -> _Staged:
        """Check every array and value of a replay file against this replay; change nothing."""
        if STATE_KEY not in arrays:
            raise ValueError(f"no {STATE_KEY!r} array")
        state = decode_json(arrays.pop(STATE_KEY), STATE_KEY)
        if not isinstance(state, dict):
            raise ValueError(f"{STATE_KEY!r} is not a JSON object")
        frame_schema = _parse_frame_schema(state.pop("frame_schema", {}))
        checked = self._check_state(state)
        storage = {n[len(STORAGE_PREFIX) :]: arrays.pop(n) for n in list(arrays) if n.startswith(STORAGE_PREFIX)}
        refs = {n[len(REFS_PREFIX) :]: arrays.pop(n) for n in list(arrays) if n.startswith(REFS_PREFIX)}
        for key, arr in {**storage, **refs}.items():
            if arr.shape[:1] != (self._capacity,):
                raise ValueError(f"key {key!r}: stored length {arr.shape[:1]} != capacity {self._capacity}")
            if key in RESERVED_KEYS:
                raise ValueError(f"key {key!r} is reserved for sample() output")
        if sorted(refs) != sorted(frame_schema) or set(refs) & set(storage):
            raise ValueError(f"frame keys {sorted(refs)} do not match the file's frame schema {sorted(frame_schema)}")
        schema = {**{k: (tuple(a.shape[1:]), a.dtype) for k, a in storage.items()}, **frame_schema}
        if self._fixed:
            _match_schema(self._schema, schema, "file")
        frames = arrays.pop(FRAMES_KEY, None)
        if refs:
            frames = self._check_frames(refs, frame_schema, frames, checked["size"])
        return _Staged(checked, schema, storage, refs, frames, self._stage_extra(arrays, checked))

    def _check_frames(self, refs: dict[str, np.ndarray], frame_schema: _Layout,
                      frames: np.ndarray | None, size: int) -> np.ndarray:
        """Check a file's frame slots and frames; return the frames, each frame of the layout
        :func:`~zmqrl.frames.frame_layout` gives (files that kept a whole item as one frame have
        ``refs`` rewritten in place to slots of its frames)."""
        if frames is None:
            raise ValueError("the file has frame slots but no frames")
        dtypes = {dtype for _, dtype in frame_schema.values()}
        layouts = {key: frame_layout(shape) for key, (shape, _) in frame_schema.items()}
        if len(dtypes) != 1 or len({fs for _, fs in layouts.values()}) != 1:
            raise ValueError(f"frame keys {sorted(frame_schema)} differ in frame shape or dtype")
        if not all(r.ndim == 2 and np.issubdtype(r.dtype, np.integer) for r in refs.values()):
            raise ValueError("frame slots: expected one integer (capacity, frames per item) array per frame key")
        frame_shape, dtype = next(iter(layouts.values()))[1], dtypes.pop()
        whole = {key: r.shape[1] == 1 and layouts[key][0] > 1 for key, r in refs.items()}  # item-shaped frames
        for key, r in refs.items():
            if not whole[key] and r.shape[1] != layouts[key][0]:
                raise ValueError(f"frame slots: {r.shape[1]} frames per item do not fit {key!r} items of shape "
                                 f"{frame_schema[key][0]}")
        if any(whole.values()):
            if not all(whole.values()) or frames.shape[1:] != frame_schema[next(iter(refs))][0]:
                raise ValueError(f"frames: {frames.shape[1:]} fit neither items nor frames of {frame_shape}")
        elif frames.shape[1:] != frame_shape:
            raise ValueError(f"frames: expected {frame_shape} {dtype}, got {frames.shape[1:]} {frames.dtype}")
        if frames.dtype != dtype:
            raise ValueError(f"frames: expected {dtype}, got {frames.dtype}")
        live = np.concatenate([r[:size].reshape(-1) for r in refs.values()])
        if live.size and (live.min() < 0 or live.max() >= frames.shape[0]):
            raise ValueError(f"frame slots point outside the {frames.shape[0]} stored frames")
        if any(whole.values()):
            for key, r in refs.items():
                per_item = layouts[key][0]
                refs[key] = r.astype(np.int64) * per_item + np.arange(per_item)
            frames = frames.reshape(-1, *frame_shape)
        return frames

    def _load_frames(self, refs: Mapping[str, np.ndarray], frames: np.ndarray) -> None:
        self._use_frames({k: r.shape[1] for k, r in refs.items()}, reserve=max(frames.shape[0], 1))
        assert self._pool is not None
        live = np.concatenate([r[: self._size].reshape(-1) for r in refs.values()]).astype(np.int64)
        refcount = np.bincount(live, minlength=frames.shape[0]).astype(np.int32)
        self._pool.load(frames, refcount)
        self._frame_refs = {k: np.ascontiguousarray(r, dtype=np.int32) for k, r in refs.items()}


def _parse_schema(schema: Mapping[str, Any], allow_empty: bool = False) -> _Layout:
    """``{key: (dtype, per-item shape)}`` as ``{key: (shape, np.dtype)}``, checked."""
    if not schema and not allow_empty:
        raise ValueError("schema must name at least one key")
    out: _Layout = {}
    for key, spec in schema.items():
        if not isinstance(key, str) or key in RESERVED_KEYS:
            raise ValueError(f"schema key {key!r}: keys must be strings other than {RESERVED_KEYS}")
        try:
            dtype_like, shape_like = spec
            dtype = np.dtype(dtype_like)
            shape = tuple(int(d) for d in shape_like)
        except (TypeError, ValueError):
            raise ValueError(f"schema key {key!r}: expected (dtype, per-item shape), got {spec!r}") from None
        if dtype.hasobject or any(d < 0 for d in shape):
            raise ValueError(f"schema key {key!r}: expected a plain dtype and non-negative dims, got {spec!r}")
        out[key] = (shape, dtype)
    return out


def _parse_frame_schema(raw: Any) -> _Layout:
    """The ``frame_schema`` of a file's state: ``{key: [shape, dtype string]}``."""
    try:
        return _parse_schema({k: (dtype, shape) for k, (shape, dtype) in raw.items()}, allow_empty=True)
    except (AttributeError, TypeError, ValueError):
        raise ValueError(f"frame_schema: expected {{key: [shape, dtype]}}, got {str(raw)[:80]}") from None


def _match_schema(expected: _Layout, got: _Layout, what: str) -> None:
    """Raise ``ValueError`` naming the first key whose presence, dtype or per-item shape differs."""
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    if missing:
        raise ValueError(f"{what} is missing key {missing[0]!r} (expected keys {sorted(expected)})")
    if extra:
        raise ValueError(f"{what} has unexpected key {extra[0]!r} (expected keys {sorted(expected)})")
    for key, (shape, dtype) in got.items():
        want_shape, want_dtype = expected[key]
        if shape != want_shape:
            raise ValueError(f"key {key!r}: expected per-item shape {want_shape}, got {shape}")
        if dtype != want_dtype:
            raise ValueError(f"key {key!r}: expected dtype {want_dtype}, got {dtype}")


def _priorities(priorities: np.ndarray | None, n: int) -> np.ndarray | None:
    """``priorities`` as float64 of a batch of ``n`` (ValueError for another length)."""
    if priorities is None:
        return None
    prio = np.asarray(priorities, dtype=np.float64).reshape(-1)
    if prio.shape[0] != n:
        raise ValueError(f"priorities has length {prio.shape[0]}, batch has {n}")
    return prio


def _image_fields(schema: _Layout) -> tuple[str, ...]:
    """The keys of a stored layout whose frames a frame pool keeps once (:func:`~zmqrl.frames.image_fields`)."""
    return image_fields({k: (dtype, shape) for k, (shape, dtype) in schema.items()}, FRAME_KEYS)
