"""Reference-counted storage that keeps each distinct image frame once.

A stacked image observation shares all but one frame with the next observation of its episode,
and an n-step transition's ``next_obs`` is a later transition's ``obs``: storing ``obs`` and
``next_obs`` stacks as given keeps every frame about ``2 * stack`` times. :class:`FramePool`
stores each distinct frame once; transitions hold int32 slot numbers.

Frames are found by a 64-bit fingerprint and always compared byte for byte before they are
shared, so a fingerprint collision costs a little memory, never a wrong frame.
"""

from __future__ import annotations

import numpy as np

_FINGERPRINT_SEED = 0x5EED


class FramePool:
    """Distinct frames of one shape and dtype, each with a reference count.

    Released slots are reused before new ones, so the memory in use follows the number of
    distinct frames alive. The frame array is reserved up front for ``reserve`` frames (pages
    are only touched when written) and grows by half when a stream of distinct frames outruns it.
    """

    def __init__(self, frame_shape: tuple[int, ...], dtype: np.dtype, reserve: int) -> None:
        self.frame_shape = tuple(int(d) for d in frame_shape)
        self.dtype = np.dtype(dtype)
        self.frame_nbytes = int(np.prod(self.frame_shape, dtype=np.int64)) * self.dtype.itemsize
        self._words = -(-self.frame_nbytes // 8)  # frame length in uint64 words (zero-padded)
        reserve = max(1, int(reserve))
        self.frames = np.empty((reserve, *self.frame_shape), dtype=self.dtype)
        self.refcount = np.zeros(reserve, dtype=np.int32)
        self.fingerprint = np.zeros(reserve, dtype=np.uint64)
        self.high = 0  # slots ever used: [0, high) may hold frames
        self._free: list[int] = []  # released slots below ``high``, reused before new ones
        self._index: dict[int, int] = {}  # fingerprint -> slot of a live frame with it
        rng = np.random.default_rng(_FINGERPRINT_SEED)
        self._mult = rng.integers(0, 2**63, size=self._words, dtype=np.uint64) * np.uint64(2) + np.uint64(1)

    def __len__(self) -> int:
        """Number of distinct frames alive."""
        return self.high - len(self._free)

    @property
    def nbytes(self) -> int:
        """Bytes of the slots in use (frames, counts, fingerprints) plus the index."""
        per_slot = self.frame_nbytes + self.refcount.itemsize + self.fingerprint.itemsize
        return self.high * per_slot + 100 * len(self._index)  # a dict entry and its two ints: ~100 B

    # ------------------------------------------------------------------ writing
    def intern(self, frames: np.ndarray, max_new: int | None = None) -> np.ndarray:
        """Store frames ``(N, *frame_shape)`` not already held; return their int32 slots, each +1 ref.

        ``max_new``: a ValueError, with nothing stored, when the frames would take more than this many
        new slots (distinct frames not held yet; a caller's budget against data that does not share).
        """
        n = frames.shape[0]
        if n == 0:
            return np.zeros(0, dtype=np.int32)
        words = self._as_words(frames)
        fps = words @ self._mult  # wraps mod 2**64
        uniq, first, inverse = np.unique(fps, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        if max_new is not None:
            get = self._index.get
            new = sum(1 for fp in uniq.tolist() if get(fp) is None)
            if new > max_new:
                raise ValueError(f"{new} distinct new frames for {n} frames, more than the {max_new} allowed "
                                 "(frames that share nothing with what replay holds)")
        slots = self._lookup_or_store(uniq, frames[first], words[first])[inverse]
        # Equal fingerprints inside the batch: share only frames equal to the group's first.
        differs = ~np.all(words == words[first[inverse]], axis=1)
        for row in np.flatnonzero(differs):
            slots[row] = self._store(frames[row : row + 1], fps[row : row + 1], index=False)[0]
        used, counts = np.unique(slots, return_counts=True)
        self.refcount[used] += counts.astype(np.int32)
        return slots.astype(np.int32)

    def release(self, slots: np.ndarray) -> None:
        """Drop one reference per entry of ``slots``; frames left without references are freed."""
        used, counts = np.unique(np.asarray(slots, dtype=np.int64).reshape(-1), return_counts=True)
        if used.size == 0:
            return
        left = self.refcount[used] - counts.astype(np.int32)
        if np.any(left < 0):
            raise RuntimeError("frame pool: released more references than were taken")
        self.refcount[used] = left
        dead = used[left == 0]
        index = self._index
        for slot, fp in zip(dead.tolist(), self.fingerprint[dead].tolist(), strict=True):
            if index.get(fp) == slot:
                del index[fp]
        self._free.extend(dead.tolist())

    def gather(self, slots: np.ndarray) -> np.ndarray:
        """Frames at ``slots`` (any shape), as a new array of shape ``slots.shape + frame_shape``."""
        return self.frames[slots]

    def _lookup_or_store(self, fps: np.ndarray, frames: np.ndarray, words: np.ndarray) -> np.ndarray:
        get = self._index.get
        slots = np.fromiter((get(fp, -1) for fp in fps.tolist()), dtype=np.int64, count=fps.size)
        hit = np.flatnonzero(slots >= 0)
        if hit.size:  # a known fingerprint is shared only if the bytes match too
            same = np.all(self._as_words(self.frames[slots[hit]]) == words[hit], axis=1)
            slots[hit[~same]] = -2  # collision with a different live frame: store apart
        new = np.flatnonzero(slots == -1)
        if new.size:
            slots[new] = self._store(frames[new], fps[new], index=True)
        apart = np.flatnonzero(slots == -2)
        if apart.size:
            slots[apart] = self._store(frames[apart], fps[apart], index=False)
        return slots

    def _store(self, frames: np.ndarray, fps: np.ndarray, index: bool) -> np.ndarray:
        slots = self._allocate(frames.shape[0])
        self.frames[slots] = frames
        self.fingerprint[slots] = fps
        if index:
            self._index.update(zip(fps.tolist(), slots.tolist(), strict=True))
        return slots

    def _allocate(self, n: int) -> np.ndarray:
        reuse = min(n, len(self._free))
        taken = self._free[len(self._free) - reuse :]
        del self._free[len(self._free) - reuse :]
        fresh = n - reuse
        if self.high + fresh > self.frames.shape[0]:
            self._grow(self.high + fresh)
        out = np.concatenate([np.asarray(taken, dtype=np.int64), np.arange(self.high, self.high + fresh)])
        self.high += fresh
        return out

    def _grow(self, needed: int) -> None:
        size = max(needed, self.frames.shape[0] + self.frames.shape[0] // 2)
        frames = np.empty((size, *self.frame_shape), dtype=self.dtype)
        frames[: self.high] = self.frames[: self.high]
        self.frames = frames
        self.refcount = np.concatenate([self.refcount, np.zeros(size - self.refcount.size, np.int32)])
        self.fingerprint = np.concatenate([self.fingerprint, np.zeros(size - self.fingerprint.size, np.uint64)])

    def _as_words(self, frames: np.ndarray) -> np.ndarray:
        flat = np.ascontiguousarray(frames).reshape(frames.shape[0], -1).view(np.uint8)
        pad = self._words * 8 - flat.shape[1]
        if pad:
            flat = np.pad(flat, ((0, 0), (0, pad)))
        return flat.view(np.uint64)

    # ------------------------------------------------------------------ state
    def load(self, frames: np.ndarray, refcount: np.ndarray) -> None:
        """Replace the contents with ``frames`` (slots 0..N-1) and their reference counts."""
        if frames.shape[1:] != self.frame_shape or frames.dtype != self.dtype:
            raise ValueError(f"frames: expected {self.frame_shape} {self.dtype}, got {frames.shape[1:]} {frames.dtype}")
        if refcount.shape != frames.shape[:1] or np.any(refcount < 0):
            raise ValueError("frames: reference counts do not match the frames")
        high = frames.shape[0]
        if high > self.frames.shape[0]:
            self._grow(high)
        self.frames[:high] = frames
        self.refcount[:] = 0
        self.refcount[:high] = refcount
        self.high = high
        self.fingerprint[:high] = self._as_words(frames) @ self._mult if high else 0
        live = np.flatnonzero(refcount > 0)
        self._free = np.flatnonzero(refcount == 0)[::-1].tolist()
        self._index = {}
        for slot, fp in zip(live.tolist(), self.fingerprint[live].tolist(), strict=True):
            self._index.setdefault(fp, slot)
