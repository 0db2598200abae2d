"""Image frames on the wire once per batch: a batch's ``obs`` and ``next_obs`` stacks as their
distinct frames and, per field, the frames' indices.

An Atari transition is two stacks of four 84x84 frames (56 KB), yet consecutive transitions of
one env share all their frames but one, and a transition's ``next_obs`` is a later one's ``obs``.
:class:`FrameCompactor` (the actor) turns ``obs`` (B, S, H, W) and ``next_obs`` into
``frames`` (K, H, W), the distinct frames of the batch, and int32 ``obs_frames`` /
``next_obs_frames`` (B, S) into it (an index array has an item's shape less its frame's last two
axes: ``frames[obs_frames]`` is ``obs``). The learner checks such a batch without building a stack
(:func:`open_compact`: every size bounded, compressed frames decompressed, indices inside the
frames) and replay interns its frames as they came; :func:`expand` gathers the stacks back for a
replay that stores them as given. Frames are found by a 64-bit fingerprint
(:mod:`zmqrl.frames`) and compared byte for byte before they are shared, so a collision costs a
frame, never a wrong one. An item of any image shape works the same way: a sequence of stacks
``(T, S, H, W)`` is ``T * S`` frames (:func:`~zmqrl.frames.frame_layout`).

Each message stands alone: it references no frame of another message, so a lost, reordered or
refused message, a restarted learner or a hostile peer can spoil nothing but itself. The price is
that each message repeats its envs' first ``S - 1 + n_step`` frames: an env's run of ``L``
transitions in a batch takes ``L + S - 1 + n_step`` frames (Pong's 32-transition batches of 4 envs,
S = 4, n = 3: 56 frames for 32 transitions, 1.75 per transition; 1.1 needs runs of 60, 256-transition
batches).

With a codec (``net.compress``: lz4 or zstd) the frames travel compressed as ``frames_lz4`` /
``frames_zstd`` (uint8 bytes) and the batch's meta says how many there are (``{"frames": K}``),
so the receiver knows the exact size before it decompresses and never makes more than that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from zmqrl.frames import Codec, CodecError, Fingerprints, check_codec, dedup, frame_layout, image_fields

from .protocol import DEFAULT_LIMITS, Limits, Message, WireError

IMAGE_FIELDS = ("obs", "next_obs")  # fields whose uint8 image frames may travel once per batch
FRAME_ARRAYS = {"frames": "none", "frames_lz4": "lz4", "frames_zstd": "zstd"}  # array name -> codec
CODEC_ARRAYS = {codec: name for name, codec in FRAME_ARRAYS.items()}
CODECS = tuple(CODEC_ARRAYS)
FRAMES_META = "frames"  # meta key of a compressed batch: how many frames its bytes hold
INDEX_DTYPE = np.dtype("<i4")
WIRE_ZSTD_LEVEL = 1  # the sender's zstd level: on Pong frames close to level 3's size, faster


def index_name(field: str) -> str:
    """The index array of an image field: ``obs`` -> ``obs_frames``."""
    return f"{field}_frames"


def is_compact(arrays: Mapping[str, Any]) -> bool:
    """Whether a batch's arrays carry frames once (any frame or index array)."""
    return any(name in arrays for name in FRAME_ARRAYS) or any(index_name(f) in arrays for f in IMAGE_FIELDS)


def check_net_codec(codec: str) -> None:
    """Raise ``ConfigError`` (naming ``net.compress``) unless ``codec`` is known and installed here."""
    check_codec(codec, "net.compress")


_codecs: dict[str, Codec] = {}


def _codec(name: str) -> Codec:
    """The codec ``name`` (made once per process), or WireError("compress") where it is not installed."""
    codec = _codecs.get(name)
    if codec is None:
        try:
            codec = _codecs[name] = Codec(name, level=WIRE_ZSTD_LEVEL)
        except CodecError as exc:
            raise WireError("compress", f"frames compressed with {name}: {exc}") from None
    return codec


class FrameCompactor:
    """A sender's image batches with each distinct frame once (and, with a codec, compressed).

    ``fields``: the image fields (:func:`~zmqrl.frames.image_fields` of the run's batch spec);
    ``codec``: none, lz4 or zstd (``net.compress``). :meth:`compact` returns the arrays to send and
    the meta to add.
    """

    def __init__(self, fields: tuple[str, ...], codec: str = "none") -> None:
        check_net_codec(codec)
        self.fields, self.codec = tuple(fields), codec
        self._prints: Fingerprints | None = None
        self._packer = _codec(codec) if codec != "none" else None
        self.batches = self.transitions = self.frames = self.full = 0  # what it did (``full``: sent as they were)

    def compact(self, batch: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """``batch`` with its image fields as frames and indices, and the meta that goes with them;
        ``batch`` unchanged (and no meta) when that would not be smaller or it has no such fields."""
        stacks = [np.asarray(batch[f]) for f in self.fields if f in batch]
        if not self.fields or len(stacks) != len(self.fields) or any(s.dtype != np.uint8 for s in stacks):
            return dict(batch), {}
        n = len(stacks[0])
        layouts = [frame_layout(tuple(s.shape[1:])) for s in stacks]
        frame_shape = layouts[0][1]
        frame_nbytes = int(np.prod(frame_shape, dtype=np.int64))
        if n == 0 or frame_nbytes == 0 or any(s.shape[0] != n for s in stacks) or \
                any(fs != frame_shape for _, fs in layouts):
            return dict(batch), {}
        if self._prints is None or self._prints.nbytes != frame_nbytes:
            self._prints = Fingerprints(frame_nbytes)
        flat = np.concatenate([s.reshape(-1, frame_nbytes) for s in stacks])
        first, inverse = dedup(flat, self._prints)
        k = len(first)
        full_bytes = sum(s.nbytes for s in stacks)
        if k * frame_nbytes + inverse.size * INDEX_DTYPE.itemsize >= full_bytes:
            self.full += 1
            return dict(batch), {}
        frames = flat[first].reshape(k, *frame_shape)
        out: dict[str, np.ndarray] = {}
        start = 0
        for f, stack, (per_item, _) in zip(self.fields, stacks, layouts, strict=True):
            out[index_name(f)] = inverse[start:start + n * per_item].reshape(n, *stack.shape[1:-2])
            start += n * per_item
        out.update((key, value) for key, value in batch.items() if key not in self.fields)
        meta: dict[str, Any] = {}
        if self._packer is None:
            out["frames"] = frames
        else:
            out[CODEC_ARRAYS[self.codec]] = np.frombuffer(self._packer.pack(frames.data.cast("B")), np.uint8)
            meta[FRAMES_META] = k
        self.batches += 1
        self.transitions += n
        self.frames += k
        return out, meta


def decompress(codec: str, data: np.ndarray, nbytes: int) -> np.ndarray:
    """``data`` (compressed frame bytes) decompressed into exactly ``nbytes`` bytes, which the caller
    has bounded: never more is made. WireError("compress") for data that does not decompress to
    exactly that."""
    raw = np.ascontiguousarray(data).data.cast("B")
    try:
        return np.frombuffer(_codec(codec).unpack(raw, nbytes), np.uint8)
    except CodecError as exc:
        raise WireError("compress", str(exc)) from None


@dataclass
class CompactBatch:
    """A compact batch, checked and opened (:func:`open_compact`): its distinct ``frames`` (K, *frame
    shape), per image field the indices into them (``frames[indices]`` is the field), and the other fields."""

    rest: dict[str, np.ndarray]
    frames: np.ndarray
    indices: dict[str, np.ndarray]
    rows: int

    @property
    def nbytes(self) -> int:
        """Bytes of its arrays as they are now (frames once)."""
        return self.frames.nbytes + sum(a.nbytes for a in (*self.rest.values(), *self.indices.values()))


def open_compact(msg: Message, spec: Mapping[str, tuple[np.dtype, tuple[int, ...]]],
                 limits: Limits = DEFAULT_LIMITS) -> CompactBatch:
    """A compact BATCH (frames once, :class:`FrameCompactor`) checked against the run's image fields
    and opened: its frames decompressed (never more bytes than its rows' stacks would take) and its
    indices checked against them; no stack is built. WireError ("compact": frames or indices that do
    not fit the run's images or each other; "compress": frames that do not decompress; "size": stacks
    larger than ``limits`` allow; "shape": rows of unequal length). The other fields are the
    caller's to check (:func:`~zmqrl.wire.batches.check_batch_spec` less the image fields)."""
    arrays = msg.arrays
    fields = image_fields(spec, IMAGE_FIELDS)
    if not fields:
        raise WireError("compact", "frames sent once per batch, but this run's observations are not uint8 images")
    frame_names = [name for name in FRAME_ARRAYS if name in arrays]
    if len(frame_names) != 1:
        raise WireError("compact", f"a compact batch needs exactly one of {sorted(FRAME_ARRAYS)}, has {frame_names}")
    frame_name = frame_names[0]
    codec = FRAME_ARRAYS[frame_name]
    layouts = {f: frame_layout(tuple(spec[f][1])) for f in fields}
    frame_shape = layouts[fields[0]][1]
    frame_nbytes = int(np.prod(frame_shape, dtype=np.int64))
    index_names = {index_name(f) for f in IMAGE_FIELDS}
    rest = {k: a for k, a in arrays.items() if k != frame_name and k not in index_names}
    if any(f in rest for f in fields):
        raise WireError("compact", f"a compact batch carries {fields} as indices, not also as stacks")
    rows = {int(a.shape[0]) for a in rest.values() if a.ndim}
    if len(rows) != 1 or any(a.ndim == 0 for a in rest.values()):
        raise WireError("shape", f"compact batch arrays have unequal or no leading lengths: {sorted(rows)}")
    n = rows.pop()
    extra = sorted(k for k in index_names if k in arrays and k[: -len("_frames")] not in fields)
    if extra:
        raise WireError("compact", f"compact batch has {extra}, but only {fields} are this run's images")
    indices = {}
    for f in fields:
        idx = arrays.get(index_name(f))
        index_shape = (n, *tuple(spec[f][1])[:-2])  # an item's frame numbers, laid out as its leading axes
        if idx is None:
            raise WireError("compact", f"compact batch lacks {index_name(f)!r}")
        if idx.dtype != INDEX_DTYPE or idx.shape != index_shape:
            raise WireError("compact", f"{index_name(f)} is {idx.dtype}{list(idx.shape)}, expected "
                                       f"{INDEX_DTYPE}{list(index_shape)}")
        indices[f] = idx
    max_frames = sum(idx.size for idx in indices.values())
    expanded = max_frames * frame_nbytes + sum(a.nbytes for a in rest.values())
    if expanded > limits.max_message_bytes:
        raise WireError("size", f"its {n} items' stacks would take {expanded} bytes, more than "
                                f"max_message_bytes={limits.max_message_bytes}")
    data = arrays[frame_name]
    if codec == "none":
        k = int(data.shape[0]) if data.ndim else -1
        if data.dtype != np.uint8 or tuple(data.shape[1:]) != frame_shape:
            raise WireError("compact", f"frames are {data.dtype}{list(data.shape[1:])} per frame, this run's "
                                       f"{np.dtype(np.uint8)}{list(frame_shape)}")
        if not 0 < k <= max_frames:
            raise WireError("compact", f"{k} frames for {n} items (at most {max_frames})")
        frames = data
    else:
        claimed = msg.meta.get(FRAMES_META)
        if type(claimed) is not int or not 0 < claimed <= max_frames:
            raise WireError("compact", f"meta {FRAMES_META!r} must be the count of frames, 1..{max_frames} for "
                                       f"{n} items; got {str(claimed)[:40]}")
        k = claimed
        if data.dtype != np.uint8 or data.ndim != 1:
            raise WireError("compact", f"{frame_name} must be uint8 bytes, is {data.dtype}{list(data.shape)}")
        frames = decompress(codec, data, k * frame_nbytes).reshape(k, *frame_shape)
    for f, idx in indices.items():
        if idx.size and not (int(idx.min()) >= 0 and int(idx.max()) < k):
            raise WireError("compact", f"{index_name(f)} holds indices from {idx.min()} to {idx.max()}, outside "
                                       f"its {k} frames")
    return CompactBatch(rest, frames, indices, n)


def expand(msg: Message, spec: Mapping[str, tuple[np.dtype, tuple[int, ...]]],
           limits: Limits = DEFAULT_LIMITS) -> Message:
    """A compact BATCH as the batch it stands for, its image fields' stacks gathered from its frames
    (for a replay that stores stacks as given); every bound is checked first (:func:`open_compact`).
    A batch that is not compact comes back as it is."""
    if not is_compact(msg.arrays):
        return msg
    opened = open_compact(msg, spec, limits)
    out = {f: opened.frames[idx] for f, idx in opened.indices.items()}
    out.update(opened.rest)
    return Message(msg.kind, msg.sender, msg.incarnation, msg.seq, msg.version, out, msg.meta,
                   sum(a.nbytes for a in out.values()))
