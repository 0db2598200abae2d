"""Reference-counted storage that keeps each distinct image frame once, optionally compressed.

A stacked image observation shares all but one frame with the next observation of its episode,
and an n-step transition's ``next_obs`` is a later transition's ``obs``: storing ``obs`` and
``next_obs`` stacks as given keeps every frame about ``2 * stack`` times. :class:`FramePool`
stores each distinct frame once; transitions hold int32 slot numbers.

Frames are found by a 64-bit fingerprint of their raw bytes and always compared byte for byte
before they are shared (a compressed frame is decompressed to be compared), so a fingerprint
collision costs a little memory, never a wrong frame.

With ``compress="lz4"`` or ``"zstd"`` each distinct frame is kept compressed in one byte arena
(no Python object per frame): a slot holds an offset and a length, extents are whole granules of
``GRANULE`` bytes, a freed extent is reused by the next frame of the same granule count, and the
arena is compacted in place when it would otherwise grow with a quarter of it free. ``gather``
decompresses each distinct slot of a batch once.
"""

from __future__ import annotations

import numpy as np

from zmqrl.frames import Codec, Fingerprints, check_codec

ZSTD_LEVEL = 3  # zstd's default: on Pong frames as small as level 1's output, and faster to decompress
GRANULE = 16  # arena extents are whole granules, so a freed extent fits the next frame of its size class
_INDEX_ENTRY_BYTES = 100  # a dict entry and its two ints


class FramePool:
    """Distinct frames of one shape and dtype, each with a reference count.

    Released slots are reused before new ones, so the memory in use follows the number of
    distinct frames alive. Uncompressed, the frame array is reserved up front for ``reserve``
    frames (pages are only touched when written) and grows by ``growth`` (half) when a stream of
    distinct frames outruns it. Compressed (``compress`` "lz4" or "zstd"), frames live in a byte arena
    that grows by half as needed (see the module's docstring).
    """

    def __init__(self, frame_shape: tuple[int, ...], dtype: np.dtype, reserve: int, compress: str = "none",
                 growth: float = 0.5) -> None:
        self.frame_shape = tuple(int(d) for d in frame_shape)
        self.dtype = np.dtype(dtype)
        self.frame_nbytes = int(np.prod(self.frame_shape, dtype=np.int64)) * self.dtype.itemsize
        self._prints = Fingerprints(self.frame_nbytes)
        self.compress = compress
        check_codec(compress, "replay.compress")
        self._codec = None if compress == "none" else Codec(compress, level=ZSTD_LEVEL)
        reserve = max(1, int(reserve))
        if self._codec is None:
            self.frames = np.empty((reserve, *self.frame_shape), dtype=self.dtype)
        else:
            self.frames = np.empty((0, *self.frame_shape), dtype=self.dtype)  # (unused: frames are in the arena)
        self.refcount = np.zeros(reserve, dtype=np.int32)
        self.fingerprint = np.zeros(reserve, dtype=np.uint64)
        self.high = 0  # slots ever used: [0, high) may hold frames
        self._free: list[int] = []  # released slots below ``high``, reused before new ones
        self._index: dict[int, int] = {}  # fingerprint -> slot of a live frame with it
        self._mult = self._prints.mult  # (the multipliers, shared: tests force collisions through them)
        # The compressed arena: slot -> (offset, length); extents of whole granules; freed extents by granules.
        self._arena = np.empty(0, dtype=np.uint8)
        self._top = 0  # arena bytes ever handed out: [0, top) holds extents, live or free
        self._offset = np.zeros(reserve if self._codec else 0, dtype=np.int64)
        self._length = np.zeros(reserve if self._codec else 0, dtype=np.int32)
        self._spare: dict[int, list[int]] = {}  # granule count -> offsets of free extents of that size
        self._spare_bytes = 0
        self.growth = float(growth)  # slots grow by this share of their number when a new frame finds none free
        # (slots, frames) stored since the owner last took them, where it keeps a copy elsewhere (None: not kept)
        self.stored: list[tuple[np.ndarray, np.ndarray]] | None = None

    def __len__(self) -> int:
        """Number of distinct frames alive."""
        return self.high - len(self._free)

    @property
    def nbytes(self) -> int:
        """Bytes in use: frames (compressed: the arena's bytes handed out, live or free, and each
        slot's offset and length), counts, fingerprints, plus the index."""
        per_slot = self.refcount.itemsize + self.fingerprint.itemsize
        if self._codec is None:
            held = self.high * self.frame_nbytes
        else:
            held = self._top + self.high * (self._offset.itemsize + self._length.itemsize)
        return held + self.high * per_slot + _INDEX_ENTRY_BYTES * len(self._index)

    @property
    def compressed_nbytes(self) -> int:
        """Compressed bytes of the live frames (0 uncompressed): what the arena would hold compacted."""
        return int(self._length[: self.high].sum()) if self._codec is not None else 0

    # ------------------------------------------------------------------ writing
    def intern(self, frames: np.ndarray, max_new: int | None = None, *, fingerprints: np.ndarray | None = None,
               refs: np.ndarray | None = None) -> np.ndarray:
        """Store frames ``(N, *frame_shape)`` not already held; return their int32 slots, each with
        ``refs`` more references (one per frame by default; each at least one).

        ``max_new``: a ValueError, with nothing stored, when the frames would take more than this many
        new slots (distinct frames not held yet; a caller's budget against data that does not share).
        ``fingerprints``: the frames' fingerprints (:class:`~zmqrl.frames.Fingerprints` of this pool's
        frame size), where the caller has them already; frames are still compared byte for byte
        before they are shared, so a wrong one costs a slot, never a wrong frame.
        """
        n = frames.shape[0]
        if n == 0:
            return np.zeros(0, dtype=np.int32)
        words = self._as_words(frames)
        fps = self._prints.of(words) if fingerprints is None else np.asarray(fingerprints, dtype=np.uint64)
        counts = np.ones(n, dtype=np.int64) if refs is None else np.asarray(refs, dtype=np.int64).reshape(-1)
        if fps.shape != (n,) or counts.shape != (n,) or (refs is not None and counts.min() < 1):
            raise ValueError(f"frame pool: {n} frames need {n} fingerprints and {n} reference counts of at least 1")
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
        repeated = np.flatnonzero(first[inverse] != np.arange(n))
        if repeated.size:
            differs = repeated[~np.all(words[repeated] == words[first[inverse[repeated]]], axis=1)]
            for row in differs.tolist():
                slots[row] = self._store(frames[row : row + 1], fps[row : row + 1], index=False)[0]
        used, where = np.unique(slots, return_inverse=True)
        self.refcount[used] += np.bincount(where.reshape(-1), weights=counts, minlength=used.size).astype(np.int32)
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
        if self._codec is not None:
            self._free_extents(dead)
        self._free.extend(dead.tolist())

    def gather(self, slots: np.ndarray) -> np.ndarray:
        """Frames at ``slots`` (any shape), as a new array of shape ``slots.shape + frame_shape``."""
        slots = np.asarray(slots)
        if self._codec is None:
            return self.frames[slots]
        uniq, inverse = np.unique(slots.reshape(-1), return_inverse=True)
        parts = self._decompressed(uniq)
        data = bytearray().join([parts[i] for i in inverse.reshape(-1).tolist()])  # one copy per frame
        return np.frombuffer(data, dtype=self.dtype).reshape(*slots.shape, *self.frame_shape)

    def frames_at(self, slots: np.ndarray) -> np.ndarray:
        """Frames at ``slots`` ``(N,)``, zeros where a slot holds no frame (a freed slot of a compressed pool)."""
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        if self._codec is None:
            return self.frames[slots]
        out = np.zeros((slots.size, *self.frame_shape), dtype=self.dtype)
        held = np.flatnonzero(self.refcount[slots] > 0)
        if held.size:
            out[held] = self.gather(slots[held])
        return out

    def _decompressed(self, slots: np.ndarray) -> list[bytes]:
        """The raw bytes of the frames at distinct live ``slots``, in order."""
        assert self._codec is not None
        view = self._arena.data
        unpack, size = self._codec.unpack, self.frame_nbytes
        offsets, lengths = self._offset[slots].tolist(), self._length[slots].tolist()
        return [unpack(view[o : o + n], size) for o, n in zip(offsets, lengths, strict=True)]

    def _lookup_or_store(self, fps: np.ndarray, frames: np.ndarray, words: np.ndarray) -> np.ndarray:
        get = self._index.get
        slots = np.fromiter((get(fp, -1) for fp in fps.tolist()), dtype=np.int64, count=fps.size)
        hit = np.flatnonzero(slots >= 0)
        if hit.size:  # a known fingerprint is shared only if the bytes match too
            if self._codec is None:
                held = self._as_words(self.frames[slots[hit]])
            else:
                raw = np.frombuffer(b"".join(self._decompressed(slots[hit])), dtype=np.uint8)
                held = self._as_words(raw.reshape(hit.size, self.frame_nbytes))
            same = np.all(held == words[hit], axis=1)
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
        if self._codec is None:
            self.frames[slots] = frames
        else:
            self._pack(slots, frames)
        self.fingerprint[slots] = fps
        if self.stored is not None:
            self.stored.append((slots, frames))
        if index:
            self._index.update(zip(fps.tolist(), slots.tolist(), strict=True))
        return slots

    def _allocate(self, n: int) -> np.ndarray:
        reuse = min(n, len(self._free))
        taken = self._free[len(self._free) - reuse :]
        del self._free[len(self._free) - reuse :]
        fresh = n - reuse
        if self.high + fresh > self.refcount.size:
            self._grow(self.high + fresh)
        out = np.concatenate([np.asarray(taken, dtype=np.int64), np.arange(self.high, self.high + fresh)])
        self.high += fresh
        return out

    def _grow(self, needed: int) -> None:
        size = max(needed, self.refcount.size + int(self.refcount.size * self.growth))
        if self._codec is None:
            frames = np.empty((size, *self.frame_shape), dtype=self.dtype)
            frames[: self.high] = self.frames[: self.high]
            self.frames = frames
        else:
            self._offset = np.concatenate([self._offset, np.zeros(size - self._offset.size, np.int64)])
            self._length = np.concatenate([self._length, np.zeros(size - self._length.size, np.int32)])
        self.refcount = np.concatenate([self.refcount, np.zeros(size - self.refcount.size, np.int32)])
        self.fingerprint = np.concatenate([self.fingerprint, np.zeros(size - self.fingerprint.size, np.uint64)])

    def _as_words(self, frames: np.ndarray) -> np.ndarray:
        return self._prints.as_words(frames)

    # ------------------------------------------------------------------ the compressed arena
    def _pack(self, slots: np.ndarray, frames: np.ndarray) -> None:
        """Compress ``frames`` into extents of the arena for ``slots`` (slots without an extent)."""
        assert self._codec is not None
        flat = np.ascontiguousarray(frames).reshape(frames.shape[0], -1).view(np.uint8)
        pack = self._codec.pack
        blobs = [pack(row.data) for row in flat]
        for slot, blob in zip(slots.tolist(), blobs, strict=True):
            size = len(blob)
            offset = self._take_extent(-(-size // GRANULE))
            self._arena[offset : offset + size] = np.frombuffer(blob, dtype=np.uint8)
            self._offset[slot] = offset
            self._length[slot] = size

    def _take_extent(self, granules: int) -> int:
        spare = self._spare.get(granules)
        if spare:
            self._spare_bytes -= granules * GRANULE
            return spare.pop()
        size = granules * GRANULE
        if self._top + size > self._arena.size:
            if self._spare_bytes >= self._arena.size // 4:
                self._compact()
            if self._top + size > self._arena.size:
                grown = np.empty(max(self._top + size, self._arena.size + self._arena.size // 2, 1 << 16), np.uint8)
                grown[: self._top] = self._arena[: self._top]
                self._arena = grown
        offset = self._top
        self._top += size
        return offset

    def _free_extents(self, dead: np.ndarray) -> None:
        for offset, size in zip(self._offset[dead].tolist(), self._length[dead].tolist(), strict=True):
            granules = -(-size // GRANULE)
            self._spare.setdefault(granules, []).append(offset)
            self._spare_bytes += granules * GRANULE
        self._length[dead] = 0

    def _compact(self) -> None:
        """Move the live extents down over the free ones, in place and in order; forget free extents."""
        live = np.flatnonzero(self._length[: self.high] > 0)  # (frames being stored have no references yet)
        live = live[np.argsort(self._offset[live], kind="stable")]
        old = self._offset[live]
        sizes = -(-self._length[live].astype(np.int64) // GRANULE) * GRANULE
        new = np.cumsum(sizes) - sizes
        # Copy runs of extents that are already contiguous in one move each; new <= old throughout.
        breaks = np.flatnonzero(old[1:] != old[:-1] + sizes[:-1]) + 1
        starts = np.concatenate([[0], breaks]).astype(np.int64)
        ends = np.concatenate([breaks, [live.size]]).astype(np.int64)
        arena = self._arena
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            if s < e and old[s] != new[s]:
                length = int(new[e - 1] + sizes[e - 1] - new[s])
                arena[new[s] : new[s] + length] = arena[old[s] : old[s] + length].copy()
        self._offset[live] = new
        self._top = int(new[-1] + sizes[-1]) if live.size else 0
        self._spare, self._spare_bytes = {}, 0

    # ------------------------------------------------------------------ state
    def load(self, frames: np.ndarray, refcount: np.ndarray) -> None:
        """Replace the contents with ``frames`` (slots 0..N-1) and their reference counts.

        A compressed pool compresses the frames still referenced (a saved pool holds them raw).
        """
        if frames.shape[1:] != self.frame_shape or frames.dtype != self.dtype:
            raise ValueError(f"frames: expected {self.frame_shape} {self.dtype}, got {frames.shape[1:]} {frames.dtype}")
        if refcount.shape != frames.shape[:1] or np.any(refcount < 0):
            raise ValueError("frames: reference counts do not match the frames")
        high = frames.shape[0]
        if high > self.refcount.size:
            self._grow(high)
        live = np.flatnonzero(refcount > 0)
        if self._codec is None:
            self.frames[:high] = frames
        else:
            self._arena, self._top, self._spare, self._spare_bytes = np.empty(0, np.uint8), 0, {}, 0
            self._offset[:] = 0
            self._length[:] = 0
            for start in range(0, live.size, 4096):  # (a chunk at a time: no second copy of all frames)
                part = live[start : start + 4096]
                self._pack(part, frames[part])
        self.refcount[:] = 0
        self.refcount[:high] = refcount
        self.high = high
        self.fingerprint[:] = 0
        for start in range(0, high, 65536):
            self.fingerprint[start : start + 65536] = self._prints.of(self._as_words(frames[start : start + 65536]))
        self._free = np.flatnonzero(refcount == 0)[::-1].tolist()
        self._index = {}
        for slot, fp in zip(live.tolist(), self.fingerprint[live].tolist(), strict=True):
            self._index.setdefault(fp, slot)
