"""The learner's store for on-policy algorithms (IMPALA, APPO): a bounded FIFO of segments, not replay.

An on-policy learner trains on what its actors' recent policies did: each segment once, or for
``epochs`` passes, oldest first, and never one made by a policy too many versions old. So where
replay keeps items to sample again and again, :class:`SegmentQueue` hands each segment out for one
batch and forgets it once that batch has been trained on ``epochs`` times:

- :meth:`SegmentQueue.sample` takes the oldest ``batch_size`` queued segments as the next batch
  and hands that same batch out ``epochs`` times (PPO's passes over one rollout), then the next;
- each segment carries the model version that acted for it (the oldest, where a batch of them
  spanned several); :meth:`SegmentQueue.at_version` tells the store the learner's version, and a
  queued segment more than ``max_lag`` versions behind it is dropped and counted (``dropped_lag``),
  as is one acted by another learner line (a version of ``-1``: ``dropped_other_line``);
- ``capacity`` is a soft bound: at it, :attr:`SegmentQueue.full` asks the learner to pause its
  actors (back-pressure through control); what was already on its way is still taken, up to
  ``hard_capacity``, beyond which the oldest segments make room (``dropped_overflow``). An honest
  sender's data is never refused.

Numpy only; the learner's intake has checked every segment before it is added.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

Batch = dict[str, np.ndarray]
OTHER_LINE = -1  # the version of a segment acted by a model of another learner line (or unknown)


class SegmentQueue:
    """A bounded FIFO of segments, each trained on for ``epochs`` passes (module docstring)."""

    new_frames = 0  # (ReplayBuffer's) image frames the last add stored anew: no frame pool here

    def __init__(self, capacity: int, epochs: int = 1, max_lag: int = 0, hard_capacity: int | None = None,
                 schema: Mapping[str, tuple[np.dtype, tuple[int, ...]]] | None = None) -> None:
        if capacity < 1 or epochs < 1 or max_lag < 0:
            raise ValueError(f"need capacity >= 1, epochs >= 1 and max_lag >= 0; got {capacity}, {epochs}, {max_lag}")
        self.capacity = int(capacity)
        self.hard_capacity = max(int(hard_capacity or 4 * capacity), self.capacity)
        self.epochs = int(epochs)
        self.max_lag = int(max_lag)  # 0: no segment is too old
        self.schema = dict(schema or {})
        self.version = 0  # the learner's newest model version
        self._chunks: collections.deque[tuple[Batch, np.ndarray]] = collections.deque()  # (arrays, versions)
        self._queued = 0
        self._batch: Batch | None = None  # the batch being trained on
        self._uses_left = 0
        self.added = 0  # segments ever added
        self.taken = 0  # segments taken into a batch (each trained on ``epochs`` times)
        self.samples = 0  # batches handed out (epochs included)
        self.dropped_lag = 0
        self.dropped_other_line = 0
        self.dropped_overflow = 0
        self.pauses = 0  # times the queue became full (each a pause of the actors)
        self.lag_sum = 0  # versions between the model that acted for each segment taken and the learner's then
        self.lag_max = 0
        self._was_full = False

    # --- in --------------------------------------------------------------------------------------
    def add(self, batch: Mapping[str, np.ndarray], priorities: np.ndarray | None = None,
            max_new_frames: int | None = None, versions: np.ndarray | None = None) -> np.ndarray:
        """Queue a batch of segments; ``versions`` (one per segment) the model version that acted for each
        (None: the newest, :attr:`version`, as in a single process). ``priorities`` are ignored (a FIFO
        has none). Returns the segments' positions in the order they arrived (``num_added`` before)."""
        arrays = {key: np.asarray(value) for key, value in batch.items() if key != "priority"}
        if not arrays:
            return np.zeros(0, dtype=np.int64)
        n = len(next(iter(arrays.values())))
        self._check(arrays, n)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        stamp = np.full(n, self.version, dtype=np.int64) if versions is None else \
            np.asarray(versions, dtype=np.int64).reshape(-1)
        if stamp.shape != (n,):
            raise ValueError(f"versions: expected {n} (one per segment), got shape {stamp.shape}")
        # copies: a received message's buffers are read-only and belong to the message
        self._chunks.append(({key: np.array(value) for key, value in arrays.items()}, stamp.copy()))
        self._queued += n
        first = self.added
        self.added += n
        self._drop_stale()
        while self._queued > self.hard_capacity:
            self._pop(min(self._queued - self.hard_capacity, len(self._chunks[0][1])), "overflow")
        self._note_full()
        return np.arange(first, first + n, dtype=np.int64)

    def add_frames(self, batch: Mapping[str, np.ndarray], frames: np.ndarray, frame_indices: Mapping[str, np.ndarray],
                   priorities: np.ndarray | None = None, max_new_frames: int | None = None,
                   fingerprints: np.ndarray | None = None, versions: np.ndarray | None = None) -> np.ndarray:
        """Segments whose image fields came as distinct ``frames`` and indices into them: stored as stacks."""
        arrays = dict(batch)
        for key, index in frame_indices.items():
            arrays[key] = np.asarray(frames)[np.asarray(index)]
        return self.add(arrays, priorities, max_new_frames, versions)

    def _check(self, arrays: Mapping[str, np.ndarray], n: int) -> None:
        for key, value in arrays.items():
            if len(value) != n:
                raise ValueError(f"{key}: {len(value)} segments, the batch's other fields have {n}")
            if key in self.schema:
                dtype, shape = self.schema[key]
                if value.dtype != np.dtype(dtype) or tuple(value.shape[1:]) != tuple(shape):
                    raise ValueError(f"{key}: expected {np.dtype(dtype)} {tuple(shape)} per segment, got "
                                     f"{value.dtype} {tuple(value.shape[1:])}")
        missing = set(self.schema) - set(arrays)
        if missing:
            raise ValueError(f"missing fields {sorted(missing)}")

    # --- versions and bounds ------------------------------------------------------------------------
    def at_version(self, version: int) -> None:
        """The learner's model version is now ``version``: queued segments too old for it are dropped."""
        self.version = int(version)
        self._drop_stale()
        self._note_full()

    def _drop_stale(self) -> None:
        """Drop, and count, queued segments of another learner line or more than ``max_lag`` versions old."""
        if not self._queued:
            return
        oldest = self.version - self.max_lag if self.max_lag else None
        kept: collections.deque[tuple[Batch, np.ndarray]] = collections.deque()
        for arrays, versions in self._chunks:
            other = versions == OTHER_LINE
            old = (versions < oldest) & ~other if oldest is not None else np.zeros_like(other)
            keep = ~(other | old)
            self.dropped_other_line += int(other.sum())
            self.dropped_lag += int(old.sum())
            if keep.all():
                kept.append((arrays, versions))
            elif keep.any():
                kept.append(({key: value[keep] for key, value in arrays.items()}, versions[keep]))
        self._chunks = kept
        self._queued = sum(len(versions) for _, versions in kept)

    def _pop(self, n: int, why: str = "") -> tuple[Batch, np.ndarray]:
        """The oldest ``n`` queued segments (at most one chunk's), taken off the queue."""
        arrays, versions = self._chunks[0]
        if n >= len(versions):
            self._chunks.popleft()
            taken, taken_versions = arrays, versions
        else:
            taken = {key: value[:n] for key, value in arrays.items()}
            taken_versions = versions[:n]
            self._chunks[0] = ({key: value[n:] for key, value in arrays.items()}, versions[n:])
        self._queued -= len(taken_versions)
        if why == "overflow":
            self.dropped_overflow += len(taken_versions)
        return taken, taken_versions

    def _note_full(self) -> None:
        full = self.full
        self.pauses += full and not self._was_full
        self._was_full = full

    @property
    def full(self) -> bool:
        """Whether the queue holds ``capacity`` segments: actors should pause until the learner catches up."""
        return self._queued >= self.capacity

    @property
    def queued(self) -> int:
        """Segments waiting for a batch."""
        return self._queued

    # --- out ---------------------------------------------------------------------------------------
    def updates_ready(self, batch_size: int) -> int:
        """Batches :meth:`sample` can hand out now without waiting for more segments (epochs included)."""
        return self._uses_left + self.epochs * (self._queued // batch_size)

    def sample(self, batch_size: int) -> Batch:
        """The batch being trained on, while it has passes left; else the oldest ``batch_size`` queued
        segments (fewer where fewer are queued) as the next batch. ``indices`` and ``weights`` (ones) are
        added, as replay adds them. ValueError when there is nothing to hand out."""
        if self._batch is None or self._uses_left <= 0:
            self._next_batch(batch_size)
        assert self._batch is not None
        self._uses_left -= 1
        self.samples += 1
        return dict(self._batch)

    def _next_batch(self, batch_size: int) -> None:
        self._drop_stale()
        if not self._queued:
            raise ValueError("the segment queue is empty: nothing to train on")
        parts: list[Batch] = []
        taken = 0
        while taken < batch_size and self._queued:
            arrays, versions = self._pop(batch_size - taken)
            parts.append(arrays)
            taken += len(versions)
            lags = self.version - versions
            self.lag_sum += int(lags.sum())
            self.lag_max = max(self.lag_max, int(lags.max()))
        batch = parts[0] if len(parts) == 1 else {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
        batch["indices"] = np.arange(self.taken, self.taken + taken, dtype=np.int64)
        batch["weights"] = np.ones(taken, dtype=np.float32)
        self.taken += taken
        self._batch, self._uses_left = batch, self.epochs
        self._note_full()

    def __len__(self) -> int:
        """Segments that can still be trained on: those queued and those of the batch with passes left."""
        current = len(self._batch["weights"]) if self._batch is not None and self._uses_left > 0 else 0
        return self._queued + current

    # --- ReplayBuffer's other parts -------------------------------------------------------------------
    @property
    def num_added(self) -> int:
        return self.added

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray, sampled_at: int | None = None) -> None:
        """Nothing: a FIFO has no priorities."""

    def summary(self) -> dict[str, Any]:
        """What the store did, for the learner's summary: segments added, trained on and dropped, by reason."""
        dropped = self.dropped_lag + self.dropped_other_line + self.dropped_overflow
        return {"kind": "segment FIFO", "capacity": self.capacity, "epochs": self.epochs,
                "max_policy_lag": self.max_lag, "queued": self._queued, "added": self.added, "trained": self.taken,
                "batches": self.samples,
                "dropped_lag": self.dropped_lag, "dropped_other_line": self.dropped_other_line,
                "dropped_overflow": self.dropped_overflow,
                "dropped_lag_share": round(self.dropped_lag / max(self.added, 1), 4),
                "dropped_share": round(dropped / max(self.added, 1), 4), "full_pauses": self.pauses,
                # the lag a batch is trained with: since its segments were acted (queue wait in), at its first pass
                "trained_lag_mean": round(self.lag_sum / max(self.taken, 1), 3), "trained_lag_max": self.lag_max}

    def state_dict(self) -> dict[str, Any]:
        """Counters (no contents), as JSON values."""
        return {"added": self.added, "taken": self.taken, "samples": self.samples, "dropped_lag": self.dropped_lag,
                "dropped_other_line": self.dropped_other_line, "dropped_overflow": self.dropped_overflow,
                "pauses": self.pauses, "version": self.version, "size": len(self), "lag_sum": self.lag_sum,
                "lag_max": self.lag_max}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for key in ("added", "taken", "samples", "dropped_lag", "dropped_other_line", "dropped_overflow", "pauses",
                    "version", "lag_sum", "lag_max"):
            setattr(self, key, int(state.get(key, getattr(self, key))))

    def save(self, path: str, stamp: Mapping[str, Any] | None = None) -> None:
        """The queued segments with their versions, the batch in training with its passes left, and the counters:
        :meth:`load` goes on exactly where this left off."""
        chunks = list(self._chunks)
        arrays: dict[str, np.ndarray] = {}
        if chunks:
            for key in chunks[0][0]:
                arrays[f"field/{key}"] = np.concatenate([c[0][key] for c in chunks])
            arrays["versions"] = np.concatenate([c[1] for c in chunks])
        if self._batch is not None and self._uses_left > 0:
            arrays.update({f"batch/{key}": value for key, value in self._batch.items()})
        meta = {"state": self.state_dict(), "stamp": dict(stamp or {}), "uses_left": self._uses_left}
        with open(path, "wb") as f:
            arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
            np.savez(f, **arrays)  # type: ignore[arg-type]

    def load(self, path: str) -> dict[str, Any]:
        """Inverse of :meth:`save`; returns its stamp."""
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            fields = {name.split("/", 1)[1]: data[name] for name in data.files if name.startswith("field/")}
            batch = {name.split("/", 1)[1]: data[name] for name in data.files if name.startswith("batch/")}
            versions = data["versions"] if "versions" in data.files else np.zeros(0, dtype=np.int64)
        self._chunks.clear()
        self._queued, self._batch, self._uses_left = 0, None, 0
        self.load_state_dict(meta["state"])
        if len(versions):
            self._chunks.append((fields, versions.astype(np.int64)))
            self._queued = len(versions)
        if batch:
            self._batch, self._uses_left = batch, int(meta["uses_left"])
        self._was_full = self.full
        return dict(meta.get("stamp", {}))
