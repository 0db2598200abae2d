"""Replay on the learner's torch device (``replay.device``): the items and their frames as tensors there, and
sampled batches gathered there, so a step moves only indices, and an insert only its new frames and rows.

:class:`DeviceReplay` and :class:`PrioritizedDeviceReplay` are :class:`~zmqrl.replay.UniformReplay` and
:class:`~zmqrl.replay.PrioritizedReplay` with a copy of their contents on a torch device
(:class:`TensorStore`). The host keeps everything that decides: the ring's counters, the sampling RNG, the
sum tree, the frame pool's fingerprints and reference counts, the items as given, and a copy of every frame,
to compare a fingerprint's match byte for byte and to save (``replay.compress`` keeps that copy small: only
those two read it). Every write goes to both, the device's part in the order of its stream; ``sample`` draws
its indices on the host exactly as the numpy replay does (the same items for the same seed), sends them over
and gathers the items and stacks the frames on the device. A sampled batch is a dict of device tensors, but
for ``indices``, which stay on the host where the priorities come back to. ``save`` and ``load`` write and
read the numpy replay's own files from the host's side: a checkpoint moves between the two.

Prioritized sampling searches the host's sum tree by default (``sum_tree="host"``); ``sum_tree="device"``
keeps a copy of the tree on the device (:class:`DeviceSumTree`, the same two-level layout), searches it there
for targets drawn on the host, and computes the weights there; the batch's ``indices`` are then a device
tensor, copied back to the host without waiting when the batch is drawn.

One code path serves every torch device. On CUDA, host arrays cross through page-locked memory allocated for
each copy and sent without blocking (torch's caching host allocator hands that memory out again only once
the copy has completed), so an insert or a sample never waits for the step the device is running; on the CPU
tensors share the (writable) arrays' memory. Nothing here reads a device value on the host: no ``.item()``, no
shapes that depend on data (``unique``, ``nonzero``, boolean masks).

This is the only module of :mod:`zmqrl.replay` that imports torch, and only the learner's start-up
(:func:`zmqrl.run.startup.make_replay_from`, shared with ``zmqrl train``) imports it. Its writes come from the
thread that trains (the learner's loop inserts between steps).
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from zmqrl.config import ConfigError
from zmqrl.replay.files import ReplayContents
from zmqrl.replay.frames import FramePool
from zmqrl.replay.prioritized import PRIORITY_CAP, PrioritizedReplay
from zmqrl.replay.schema import Schema
from zmqrl.replay.sumtree import MAX_BLOCK, SumTree
from zmqrl.replay.uniform import UniformReplay

HEADROOM = 1 << 30  # device bytes a replay leaves free for the agent, its graphs and its batches
UPLOAD_CHUNK = 1 << 26  # bytes a bulk copy (a replay file's frames) sends at a time
SUM_TREES = ("host", "device")


def _torch_dtype(dtype: np.dtype, key: str = "") -> torch.dtype:
    try:
        return torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    except TypeError:
        raise ConfigError(f"replay.device: key {key!r} is {dtype}, which torch cannot hold; "
                          "replay.device: cpu keeps it on the host") from None


class Uploads:
    """Host arrays to tensors on ``device``: on CUDA through page-locked memory allocated per copy and a
    non-blocking copy (nothing waits for the device); elsewhere tensors that share the arrays' memory where
    the arrays are writable."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"

    def __call__(self, array: np.ndarray) -> torch.Tensor:
        array = np.ascontiguousarray(array)
        if not self.cuda:  # (torch tensors are writable: a read-only array, a received message's, is copied)
            return torch.from_numpy(array if array.flags.writeable else array.copy()).to(self.device)
        host = torch.empty(array.shape, dtype=_torch_dtype(array.dtype), pin_memory=True)
        host.numpy()[...] = array
        return host.to(self.device, non_blocking=True)


class TensorStore:
    """A replay's contents on a torch device: a ring tensor per key stored as given, a ring of int32 frame
    slots per frame key, and the frame pool's frames by slot; written by index and gathered by index."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.upload = Uploads(device)
        self.items: dict[str, torch.Tensor] = {}  # key -> (capacity, *item shape)
        self.refs: dict[str, torch.Tensor] = {}  # frame key -> (capacity, frames per item) int32
        self.shapes: dict[str, tuple[int, ...]] = {}  # frame key -> item shape
        self.frames: torch.Tensor | None = None  # (slots, *frame shape)

    @property
    def nbytes(self) -> int:
        """Bytes the tensors hold on the device."""
        tensors = [*self.items.values(), *self.refs.values(), *([] if self.frames is None else [self.frames])]
        return sum(t.numel() * t.element_size() for t in tensors)

    def allocate(self, storage: Mapping[str, np.ndarray], refs: Mapping[str, np.ndarray],
                 shapes: Mapping[str, tuple[int, ...]], pool: FramePool | None) -> None:
        """Zeroed tensors shaped as the host's ring arrays ``storage`` and frame slots ``refs`` (frame keys'
        item ``shapes``), and room for the frames of every slot of ``pool``."""
        self.items = self.refs = {}
        self.frames = None  # (what the last allocation held goes before the next is made)
        self.items = {k: torch.zeros(a.shape, dtype=_torch_dtype(a.dtype, k), device=self.device)
                      for k, a in storage.items()}
        self.refs = {k: torch.zeros(r.shape, dtype=torch.int32, device=self.device) for k, r in refs.items()}
        self.shapes = {k: tuple(shapes[k]) for k in refs}
        if pool is not None:
            self.frames = torch.empty((pool.refcount.size, *pool.frame_shape), dtype=_torch_dtype(pool.dtype, "frames"),
                                      device=self.device)

    def write(self, rows: Mapping[str, np.ndarray], indices: np.ndarray) -> None:
        """Rows of items (frame keys: their slots) at the storage ``indices`` (distinct)."""
        at = self.upload(indices)
        for key, array in rows.items():
            (self.refs[key] if key in self.refs else self.items[key]).index_copy_(0, at, self.upload(array))

    def write_frames(self, slots: np.ndarray, frames: np.ndarray, pool_slots: int) -> None:
        """``frames`` at the pool's ``slots`` (distinct), the tensor first grown to ``pool_slots`` if it is smaller."""
        assert self.frames is not None
        if pool_slots > self.frames.shape[0]:
            self._grow(pool_slots)
        self.frames.index_copy_(0, self.upload(slots), self.upload(frames))

    def _grow(self, slots: int) -> None:
        assert self.frames is not None
        old = self.frames
        try:
            grown = torch.empty((slots, *old.shape[1:]), dtype=old.dtype, device=self.device)
        except torch.cuda.OutOfMemoryError:
            raise RuntimeError(f"replay.device: {slots:,} frame slots do not fit {self.device} (these episodes share "
                               f"fewer frames than replay reserved for); lower replay.capacity or set "
                               "replay.device: cpu") from None
        grown[: old.shape[0]] = old
        self.frames = grown

    def load(self, rings: Mapping[str, np.ndarray], frames: np.ndarray | None) -> None:
        """Whole rings (frame keys: their slots) and a file's frames (into slots ``0 .. len(frames) - 1``),
        a bounded chunk at a time."""
        for key, array in rings.items():
            _copy_chunks(self.refs[key] if key in self.refs else self.items[key], array, self.upload)
        if frames is not None:
            assert self.frames is not None
            _copy_chunks(self.frames, frames, self.upload)

    def gather(self, at: torch.Tensor) -> dict[str, torch.Tensor]:
        """The items at the storage indices ``at`` (a device tensor), frame keys' stacks assembled from their slots
        (``index_select`` along the first axis: on the CPU whole rows copied at once, ~14x faster than indexing)."""
        out = {key: ring.index_select(0, at) for key, ring in self.items.items()}
        if self.refs:
            assert self.frames is not None
            for key, ring in self.refs.items():
                slots = ring.index_select(0, at).reshape(-1)
                out[key] = self.frames.index_select(0, slots).reshape(at.shape[0], *self.shapes[key])
        return out


def _copy_chunks(into: torch.Tensor, array: np.ndarray, upload: Uploads) -> None:
    """``into[:len(array)] = array``, :data:`UPLOAD_CHUNK` bytes at a time."""
    step = max(1, UPLOAD_CHUNK // max(1, array[:1].nbytes))
    for lo in range(0, array.shape[0], step):
        into[lo : lo + step] = upload(array[lo : lo + step])


class DeviceSumTree:
    """A copy of a :class:`~zmqrl.replay.SumTree` on a torch device, in the same layout (float32 leaves in blocks,
    each block's float64 sum and smallest positive leaf), searched and read there without a branch on its data.
    The host's tree computes every sum; the copy takes its leaves and its blocks' sums as they are, so a search
    finds there what it finds on the host (where the device's prefix sums round alike: on the CPU always)."""

    def __init__(self, tree: SumTree, device: torch.device) -> None:
        self.block, self.num_blocks = tree.block, tree.num_blocks
        self._shift = tree.block.bit_length() - 1
        self.upload = Uploads(device)
        self.leaves = torch.zeros(tree.num_blocks * tree.block, dtype=torch.float32, device=device)
        self.block_sums = torch.zeros(tree.num_blocks, dtype=torch.float64, device=device)
        self.block_mins = torch.full((tree.num_blocks,), torch.inf, dtype=torch.float64, device=device)
        self._inside = torch.arange(tree.block, device=device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.leaves, self.block_sums, self.block_mins))

    def set(self, tree: SumTree, nodes: np.ndarray) -> None:
        """The leaves at ``nodes`` and the sums and minima of their blocks, as ``tree`` (the host's) has them now."""
        blocks = np.unique(nodes >> self._shift)
        self.leaves[self.upload(nodes)] = self.upload(tree._leaves[nodes])
        at = self.upload(blocks)
        self.block_sums[at] = self.upload(tree.block_sums[blocks])
        self.block_mins[at] = self.upload(tree.block_mins[blocks])

    def load(self, tree: SumTree) -> None:
        """Every leaf, sum and minimum of ``tree``."""
        self.leaves.copy_(self.upload(tree._leaves))
        self.block_sums.copy_(self.upload(tree.block_sums))
        self.block_mins.copy_(self.upload(tree.block_mins))

    def find(self, targets: torch.Tensor) -> torch.Tensor:
        """The leaf holding each prefix sum of ``targets`` (float64 on the device), as
        :meth:`SumTree.find <zmqrl.replay.SumTree.find>` finds it: the first leaf whose cumulative sum exceeds it,
        or where round-off lands past a block's last positive leaf, that leaf."""
        ends = torch.cumsum(self.block_sums, dim=0)
        last = ends[-1:]
        v = torch.minimum(targets.clamp(min=0.0), torch.nextafter(last, torch.zeros_like(last)))
        blocks = torch.searchsorted(ends, v, right=True).clamp_(max=self.num_blocks - 1)
        v = v - (ends[blocks] - self.block_sums[blocks])
        rows = self.leaves.view(self.num_blocks, self.block)[blocks]
        prefix = torch.cumsum(rows, dim=1, dtype=torch.float64)
        inside = (prefix <= v[:, None]).sum(dim=1)
        last_positive = torch.where(rows > 0, self._inside, 0).amax(dim=1)
        return (blocks << self._shift) + torch.minimum(inside, last_positive)

    def weights(self, leaves: torch.Tensor, beta: float) -> torch.Tensor:
        """Importance weights ``(p / p_min) ** -beta`` (float32) of the leaves at ``leaves``."""
        p = self.leaves[leaves].double()
        return (p / self.block_mins.amin()).pow(-beta).float()


class _TreeWithCopy(SumTree):
    """The host's sum tree, each change also made to its :class:`DeviceSumTree` (when it has one)."""

    copy: DeviceSumTree | None = None

    def update(self, indices: np.ndarray, values: np.ndarray) -> None:
        super().update(indices, values)
        if self.copy is not None:
            nodes = np.unique(np.asarray(indices, dtype=np.int64).reshape(-1))
            if nodes.size:
                self.copy.set(self, nodes)

    def load_leaves(self, values: np.ndarray) -> None:
        super().load_leaves(values)
        if self.copy is not None:
            self.copy.load(self)


class _OnDevice(UniformReplay):
    """What both replays on a device add to their numpy replay (see the module's docstring)."""

    _FRAME_HEADROOM = 16  # device memory is allocated when reserved: 1/16 over the items (Pong needs ~1/100)
    _FRAME_GROWTH = 0.125
    _dev: TensorStore | None  # None: detached (a snapshot), the numpy replay alone

    def _init_device(self, device: torch.device | str) -> None:
        self._dev = TensorStore(torch.device(device))

    @property
    def device(self) -> torch.device:
        """The torch device the items and batches are on."""
        assert self._dev is not None
        return self._dev.device

    @property
    def device_nbytes(self) -> int:
        """Bytes the replay holds on its device (allocated: frame slots reserved as well as used)."""
        return 0 if self._dev is None else self._dev.nbytes

    # ------------------------------------------------------------------ the device's copy
    def _allocate(self) -> None:
        super()._allocate()
        self._place()

    def _place(self) -> None:
        """Tensors for this replay's layout on the device (those it held go first), checked to fit it first."""
        if self._dev is None:
            return
        self._check_fits(self.planned_nbytes())
        shapes = {k: self._schema[k][0] for k in self._frame_refs}
        self._dev.allocate(self._storage, self._frame_refs, shapes, self._pool)

    def _check_fits(self, need: int) -> None:
        """A ConfigError naming ``replay.capacity`` when tensors of ``need`` bytes would not fit the device's free
        memory (with what this replay holds there now, which they replace) less :data:`HEADROOM`, where the
        device says how much it has."""
        assert self._dev is not None
        free = free_bytes(self._dev.device)
        if free is None or need + HEADROOM <= free + self._dev.nbytes:
            return
        free += self._dev.nbytes
        per_item = need / self._capacity
        fit = max(0, int((free - HEADROOM) / per_item))
        raise ConfigError(f"replay.capacity={self._capacity:,} needs {need / 2**30:.2f} GiB on {self._dev.device} "
                          f"(replay.device; {per_item:,.0f} bytes a transition), which has {free / 2**30:.2f} GiB "
                          f"free, {HEADROOM / 2**30:.0f} GiB of it left to the agent: lower replay.capacity (about "
                          f"{fit:,} fit) or set replay.device: cpu")

    def planned_nbytes(self) -> int:
        """Bytes the device's tensors take for this replay's layout (frames: the slots reserved)."""
        rings = sum(a.nbytes for a in self._storage.values()) + sum(r.nbytes for r in self._frame_refs.values())
        frames = 0 if self._pool is None else self._pool.refcount.size * self._pool.frame_nbytes
        return rings + frames + self._tree_nbytes()

    def _tree_nbytes(self) -> int:
        return 0

    def _use_frames(self, per_item: Mapping[str, int], reserve: int) -> None:
        super()._use_frames(per_item, reserve)
        assert self._pool is not None
        self._pool.stored = None if self._dev is None else []  # new frames go to the device as well

    def _write(self, rows: Mapping[str, np.ndarray], indices: np.ndarray, prio: np.ndarray | None,
               n: int) -> np.ndarray:
        out = super()._write(rows, indices, prio, n)
        if self._dev is not None:
            if self._pool is not None and self._pool.stored:
                stored, self._pool.stored = self._pool.stored, []
                slots = np.concatenate([s for s, _ in stored])
                frames = np.concatenate([f for _, f in stored]) if len(stored) > 1 else stored[0][1]
                self._dev.write_frames(slots, frames, self._pool.refcount.size)
            self._dev.write(rows, indices)
        return out

    def _adopt(self, contents: ReplayContents) -> None:
        if self._dev is not None:  # (before anything changes: a file too large for the device leaves replay as it was)
            rings = [*contents.storage.values(), *contents.frame_refs.values()]
            frames = 0 if contents.frames is None else contents.frames.nbytes
            self._check_fits(sum(a.nbytes for a in rings) + frames + self._tree_nbytes())
        super()._adopt(contents)
        if self._dev is None:
            return
        self._place()
        self._dev.load({**self._storage, **self._frame_refs}, contents.frames)

    # ------------------------------------------------------------------ reading
    def sample(self, batch_size: int) -> dict[str, Any]:  # type: ignore[override]
        """``batch_size`` items drawn as the numpy replay draws them, gathered on the device: device tensors,
        but for ``indices`` (int64 on the host)."""
        if self._dev is None:
            return super().sample(batch_size)
        indices, weights = self._draw(batch_size)
        out: dict[str, Any] = self._dev.gather(self._dev.upload(indices))
        out["indices"] = indices
        out["weights"] = self._dev.upload(weights)
        return out

    def gather(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
        """The stored items at ``indices``, from the device's copy (``get`` reads the host's)."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self._size):
            raise IndexError(f"indices must lie in [0, {self._size})")
        assert self._dev is not None
        return self._dev.gather(self._dev.upload(idx.reshape(-1)))

    def snapshot(self) -> UniformReplay:
        """A copy of this replay's host side (nothing on the device), to :meth:`save` later: what a checkpoint
        writes off the training loop. It samples and saves as the numpy replay does."""
        held, self._dev = self._dev, None
        try:
            twin = copy.deepcopy(self)
        finally:
            self._dev = held
        if twin._pool is not None:
            twin._pool.stored = None
        return twin


class DeviceReplay(_OnDevice, UniformReplay):
    """:class:`~zmqrl.replay.UniformReplay` with its items on ``device`` (see the module's docstring)."""

    def __init__(self, capacity: int, seed: int | None = None, frame_stack: int = 0, *,
                 schema: Schema | None = None, compress: str = "none", device: torch.device | str = "cpu") -> None:
        self._init_device(device)
        super().__init__(capacity, seed, frame_stack, schema=schema, compress=compress)


class PrioritizedDeviceReplay(_OnDevice, PrioritizedReplay):
    """:class:`~zmqrl.replay.PrioritizedReplay` with its items on ``device``; ``sum_tree`` says where sampling
    searches the priorities: the host's tree (``host``, only indices cross) or a copy on the device (``device``)."""

    def __init__(self, capacity: int, alpha: float = 0.6, beta0: float = 0.4, beta_steps: int = 100_000,
                 eps: float = 1e-6, seed: int | None = None, frame_stack: int = 0, *, schema: Schema | None = None,
                 priority_cap: float = PRIORITY_CAP, compress: str = "none", device: torch.device | str = "cpu",
                 sum_tree: str = "host") -> None:
        if sum_tree not in SUM_TREES:
            raise ValueError(f"sum_tree must be one of {SUM_TREES}, got {sum_tree!r}")
        self.sum_tree = sum_tree
        self._init_device(device)
        super().__init__(capacity, alpha, beta0, beta_steps, eps, seed, frame_stack, schema=schema, compress=compress,
                         priority_cap=priority_cap)
        self._tree = _TreeWithCopy(capacity)
        if sum_tree == "device":
            self._tree.copy = DeviceSumTree(self._tree, self.device)
        # (device indices of the last batches, their host copy, and the event after that copy)
        self._indices_back: collections.deque[tuple[torch.Tensor, torch.Tensor, Any]] = collections.deque(maxlen=8)

    def _tree_nbytes(self) -> int:
        if self.sum_tree != "device":
            return 0
        block = min(MAX_BLOCK, 1 << (self._capacity - 1).bit_length())
        blocks = -(-self._capacity // block)
        return blocks * (4 * block + 8 + 8)  # float32 leaves (padded), float64 sums and minima

    @property
    def device_nbytes(self) -> int:
        tree = self._tree.copy if isinstance(self._tree, _TreeWithCopy) else None
        return super().device_nbytes + (0 if tree is None or self._dev is None else tree.nbytes)

    def sample(self, batch_size: int) -> dict[str, Any]:  # type: ignore[override]
        """As :meth:`DeviceReplay.sample`; with the sum tree on the device, searched there (``indices`` is then a
        device tensor too, whose host copy :meth:`update_priorities` takes)."""
        tree = self._tree.copy if isinstance(self._tree, _TreeWithCopy) else None
        if self._dev is None or tree is None:
            return super().sample(batch_size)
        targets = self._targets(batch_size)
        if targets is None:  # every priority zero: uniform, drawn on the host
            return super().sample(batch_size)
        leaves = tree.find(self._dev.upload(targets))
        weights = tree.weights(leaves, self.beta)
        self._sample_calls += 1
        out: dict[str, Any] = self._dev.gather(leaves)
        out["indices"] = leaves
        out["weights"] = weights
        self._send_back(leaves)
        return out

    def _send_back(self, leaves: torch.Tensor) -> None:
        """Start copying a batch's device indices to the host (read by :meth:`update_priorities`)."""
        if leaves.device.type != "cuda":
            return
        host = torch.empty(leaves.shape, dtype=leaves.dtype, pin_memory=True)
        host.copy_(leaves, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self._indices_back.append((leaves, host, done))

    def _host_indices(self, indices: Any) -> np.ndarray:
        """``indices`` as a host array: a batch's device indices through the copy started when it was drawn."""
        if not isinstance(indices, torch.Tensor):
            return np.asarray(indices)
        for leaves, host, done in self._indices_back:
            if leaves is indices:
                if not done.query():  # (done long before in the learner: the step that trained on it was read)
                    done.synchronize()
                return host.numpy().copy()
        return indices.cpu().numpy()

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray, sampled_at: int | None = None) -> None:
        """As :meth:`PrioritizedReplay.update_priorities`; ``indices`` may be a batch's device tensor."""
        super().update_priorities(self._host_indices(indices), priorities, sampled_at)

    def written_since(self, indices: np.ndarray, added: int) -> np.ndarray:
        return super().written_since(self._host_indices(indices), added)

    def snapshot(self) -> UniformReplay:
        tree = self._tree.copy if isinstance(self._tree, _TreeWithCopy) else None
        if isinstance(self._tree, _TreeWithCopy):
            self._tree.copy = None
        backs, self._indices_back = self._indices_back, collections.deque(maxlen=8)
        try:
            return super().snapshot()
        finally:
            if isinstance(self._tree, _TreeWithCopy):
                self._tree.copy = tree
            self._indices_back = backs


def free_bytes(device: torch.device) -> int | None:
    """Memory free on ``device`` for new tensors: CUDA's free memory and what torch's caching allocator holds
    unused, the host's available memory for the CPU (None where it cannot be told)."""
    if device.type == "cuda":  # the driver's free memory, and what torch's allocator holds unused
        free, _ = torch.cuda.mem_get_info(device)
        return int(free) + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


def make_device_replay(device: torch.device | str, capacity: int, prioritized: bool = False, seed: int | None = None,
                       frame_stack: int = 0, *, schema: Schema | None = None, compress: str = "none",
                       sum_tree: str = "host", **options: Any) -> DeviceReplay | PrioritizedDeviceReplay:
    """A :class:`PrioritizedDeviceReplay` if ``prioritized`` (``options`` as for :func:`~zmqrl.replay.make_replay`),
    else a :class:`DeviceReplay`, with its items on ``device``."""
    if prioritized:
        return PrioritizedDeviceReplay(capacity, seed=seed, frame_stack=frame_stack, schema=schema, compress=compress,
                                       device=device, sum_tree=sum_tree, **options)
    return DeviceReplay(capacity, seed=seed, frame_stack=frame_stack, schema=schema, compress=compress, device=device)
