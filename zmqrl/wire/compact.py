"""Image frames on the wire once per batch: a batch's ``obs`` and ``next_obs`` stacks as their
distinct frames and, per field, the frames' indices.

An Atari transition is two stacks of four 84x84 frames (56 KB), yet consecutive transitions of
one env share all their frames but one, and a transition's ``next_obs`` is a later one's ``obs``.
:class:`FrameCompactor` (the actor) turns ``obs`` (B, S, H, W) and ``next_obs`` into
``frames`` (K, H, W), the distinct frames of the batch, and int32 ``obs_frames`` /
``next_obs_frames`` (B, S) into it; :func:`expand` (the learner) gathers the stacks back. Frames
are found by a 64-bit fingerprint and compared byte for byte before they are shared, so a
collision costs a frame, never a wrong one.

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
from typing import Any

import numpy as np

from zmqrl.replay.frames import Fingerprints  # (numpy only: the replay's frame fingerprints)

from .protocol import DEFAULT_LIMITS, Limits, Message, WireError

IMAGE_FIELDS = ("obs", "next_obs")  # fields whose uint8 image frames may travel once per batch
FRAME_ARRAYS = {"frames": "none", "frames_lz4": "lz4", "frames_zstd": "zstd"}  # array name -> codec
CODEC_ARRAYS = {codec: name for name, codec in FRAME_ARRAYS.items()}
CODECS = tuple(CODEC_ARRAYS)
FRAMES_META = "frames"  # meta key of a compressed batch: how many frames its bytes hold
INDEX_DTYPE = np.dtype("<i4")


def index_name(field: str) -> str:
    """The index array of an image field: ``obs`` -> ``obs_frames``."""
    return f"{field}_frames"


def frame_layout(item_shape: tuple[int, ...]) -> tuple[int | None, tuple[int, ...]]:
    """Frames per item and the frame shape of an image field's item shape: (S, H, W, ...) is a
    stack of S frames of (H, W, ...); (H, W) is one frame (None: index arrays are (B,))."""
    if len(item_shape) >= 3:
        return int(item_shape[0]), tuple(int(d) for d in item_shape[1:])
    return None, tuple(int(d) for d in item_shape)


def image_fields(spec: Mapping[str, tuple[np.dtype, tuple[int, ...]]]) -> tuple[str, ...]:
    """The fields of a batch spec whose frames can travel once per batch: ``obs`` and ``next_obs``
    when both are uint8 images (at least two dimensions per item) of one frame shape; else none."""
    fields = [f for f in IMAGE_FIELDS if f in spec]
    if len(fields) != len(IMAGE_FIELDS):
        return ()
    layouts = set()
    for f in fields:
        dtype, shape = spec[f]
        if np.dtype(dtype) != np.uint8 or len(shape) < 2:
            return ()
        layouts.add(frame_layout(tuple(shape))[1])
    return tuple(fields) if len(layouts) == 1 else ()


def is_compact(arrays: Mapping[str, Any]) -> bool:
    """Whether a batch's arrays carry frames once (any frame or index array)."""
    return any(name in arrays for name in FRAME_ARRAYS) or any(index_name(f) in arrays for f in IMAGE_FIELDS)


def _codec_module(codec: str) -> Any:
    """The module of a codec, or WireError("compress") saying it is not installed here."""
    try:
        if codec == "lz4":
            import lz4.block

            return lz4.block
        if codec == "zstd":
            import zstandard

            return zstandard
    except ImportError:
        raise WireError("compress", f"frames compressed with {codec}, which is not installed here "
                                    f"(pip install {'lz4' if codec == 'lz4' else 'zstandard'})") from None
    raise WireError("compress", f"unknown frame codec {codec!r}")


def check_codec(codec: str) -> None:
    """Raise ValueError (naming ``net.compress``) unless ``codec`` is known and installed here."""
    if codec not in CODECS:
        raise ValueError(f"net.compress={codec!r}: expected one of {list(CODECS)}")
    if codec != "none":
        try:
            _codec_module(codec)
        except WireError as exc:
            raise ValueError(f"net.compress={codec}: {exc}") from None


def dedup(flat: np.ndarray, prints: Fingerprints) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of ``flat`` (N, nbytes) uint8: the row index of each distinct frame (its first
    occurrence) and, per row, the int32 number of its distinct frame. Rows are shared only when
    their bytes are equal."""
    words = prints.as_words(flat)
    fps = prints.of(words)
    _, first, inverse = np.unique(fps, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1).astype(np.int32)
    same = first[inverse]
    check = np.flatnonzero(same != np.arange(len(same)))
    if check.size:
        differs = check[~np.all(words[check] == words[same[check]], axis=1)]
        if differs.size:  # a fingerprint collision: those rows get frames of their own
            inverse[differs] = np.arange(len(first), len(first) + differs.size, dtype=np.int32)
            first = np.concatenate([first, differs])
    return first, inverse


class FrameCompactor:
    """A sender's image batches with each distinct frame once (and, with a codec, compressed).

    ``fields``: the image fields (:func:`image_fields` of the run's batch spec); ``codec``: none,
    lz4 or zstd (``net.compress``). :meth:`compact` returns the arrays to send and the meta to add.
    """

    def __init__(self, fields: tuple[str, ...], codec: str = "none", level: int = 1) -> None:
        check_codec(codec)
        self.fields, self.codec = tuple(fields), codec
        self._prints: Fingerprints | None = None
        self._zstd = _codec_module("zstd").ZstdCompressor(level=level) if codec == "zstd" else None
        self._lz4 = _codec_module("lz4") if codec == "lz4" else None
        self.batches = self.transitions = self.frames = self.full = 0  # what it did (``full``: sent as they were)

    def compact(self, batch: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """``batch`` with its image fields as frames and indices, and the meta that goes with them;
        ``batch`` unchanged (and no meta) when that would not be smaller or it has no such fields."""
        stacks = [np.asarray(batch[f]) for f in self.fields if f in batch]
        if not self.fields or len(stacks) != len(self.fields) or any(s.dtype != np.uint8 for s in stacks):
            return dict(batch), {}
        n = len(stacks[0])
        per_item, frame_shape = frame_layout(tuple(stacks[0].shape[1:]))
        frame_nbytes = int(np.prod(frame_shape, dtype=np.int64))
        if n == 0 or frame_nbytes == 0 or any(s.shape != stacks[0].shape for s in stacks):
            return dict(batch), {}
        if self._prints is None or self._prints.nbytes != frame_nbytes:
            self._prints = Fingerprints(frame_nbytes)
        flat = np.concatenate([s.reshape(-1, frame_nbytes) for s in stacks])
        first, inverse = dedup(flat, self._prints)
        k = len(first)
        index_shape = (n,) if per_item is None else (n, per_item)
        full_bytes = sum(s.nbytes for s in stacks)
        if k * frame_nbytes + len(stacks) * n * (per_item or 1) * INDEX_DTYPE.itemsize >= full_bytes:
            self.full += 1
            return dict(batch), {}
        frames = flat[first].reshape(k, *frame_shape)
        out: dict[str, np.ndarray] = {}
        per_field = inverse.size // len(stacks)
        for i, f in enumerate(self.fields):
            out[index_name(f)] = inverse[i * per_field:(i + 1) * per_field].reshape(index_shape)
        out.update((key, value) for key, value in batch.items() if key not in self.fields)
        meta: dict[str, Any] = {}
        if self.codec == "none":
            out["frames"] = frames
        else:
            out[CODEC_ARRAYS[self.codec]] = np.frombuffer(self._compress(frames), np.uint8)
            meta[FRAMES_META] = k
        self.batches += 1
        self.transitions += n
        self.frames += k
        return out, meta

    def _compress(self, frames: np.ndarray) -> bytes:
        data = np.ascontiguousarray(frames).data.cast("B")
        if self._zstd is not None:
            return bytes(self._zstd.compress(data))
        assert self._lz4 is not None
        return bytes(self._lz4.compress(data, store_size=False))


def decompress(codec: str, data: np.ndarray, nbytes: int) -> np.ndarray:
    """``data`` (compressed frame bytes) decompressed into exactly ``nbytes`` bytes, which the caller
    has bounded: never more is made. WireError("compress") for data that does not decompress to
    exactly that (a claim of more is refused before anything is allocated)."""
    module = _codec_module(codec)
    raw = np.ascontiguousarray(data).data.cast("B")
    try:
        if codec == "lz4":
            out = module.decompress(raw, uncompressed_size=nbytes) if nbytes else b""
        else:
            claimed = module.get_frame_parameters(raw).content_size
            if claimed != nbytes:
                raise WireError("compress", f"zstd frame claims {claimed} bytes, the batch's frames are {nbytes}")
            out = module.ZstdDecompressor().decompress(raw, max_output_size=nbytes)
    except WireError:
        raise
    except Exception as exc:  # (each codec raises its own error type for corrupt input)
        raise WireError("compress", f"{codec} frames do not decompress ({type(exc).__name__}: "
                                    f"{str(exc)[:80]})") from None
    if len(out) != nbytes:
        raise WireError("compress", f"{codec} frames decompress to {len(out)} bytes, not the {nbytes} announced")
    return np.frombuffer(out, np.uint8)


def expand(msg: Message, spec: Mapping[str, tuple[np.dtype, tuple[int, ...]]],
           limits: Limits = DEFAULT_LIMITS) -> Message:
    """A compact BATCH (frames once, :class:`FrameCompactor`) as the batch it stands for: its image
    fields' stacks gathered from its frames, every bound checked before anything is allocated.
    A batch that is not compact comes back as it is. WireError ("compact": frames or indices that
    do not fit the run's images; "compress": frames that do not decompress; "size": stacks larger
    than ``limits`` allow) otherwise."""
    arrays = msg.arrays
    if not is_compact(arrays):
        return msg
    fields = image_fields(spec)
    if not fields:
        raise WireError("compact", "frames sent once per batch, but this run's observations are not uint8 images")
    frame_names = [name for name in FRAME_ARRAYS if name in arrays]
    if len(frame_names) != 1:
        raise WireError("compact", f"a compact batch needs exactly one of {sorted(FRAME_ARRAYS)}, has {frame_names}")
    frame_name = frame_names[0]
    codec = FRAME_ARRAYS[frame_name]
    per_item, frame_shape = frame_layout(tuple(spec[fields[0]][1]))
    frame_nbytes = int(np.prod(frame_shape, dtype=np.int64))
    rest = {k: a for k, a in arrays.items() if k != frame_name and not (k.endswith("_frames") and
                                                                         k[:-7] in IMAGE_FIELDS)}
    if any(f in rest for f in fields):
        raise WireError("compact", f"a compact batch carries {fields} as indices, not also as stacks")
    rows = {int(a.shape[0]) for a in rest.values() if a.ndim}
    if len(rows) != 1 or any(a.ndim == 0 for a in rest.values()):
        raise WireError("shape", f"compact batch arrays have unequal or no leading lengths: {sorted(rows)}")
    n = rows.pop()
    stack = per_item or 1
    index_shape = (n,) if per_item is None else (n, per_item)
    indices = {}
    for f in fields:
        idx = arrays.get(index_name(f))
        if idx is None:
            raise WireError("compact", f"compact batch lacks {index_name(f)!r}")
        if idx.dtype != INDEX_DTYPE or idx.shape != index_shape:
            raise WireError("compact", f"{index_name(f)} is {idx.dtype}{list(idx.shape)}, expected "
                                       f"{INDEX_DTYPE}{list(index_shape)}")
        indices[f] = idx
    max_frames = len(fields) * n * stack
    expanded = len(fields) * n * stack * frame_nbytes + sum(a.nbytes for a in rest.values())
    if expanded > limits.max_message_bytes:
        raise WireError("size", f"its {n} transitions' stacks would take {expanded} bytes, more than "
                                f"max_message_bytes={limits.max_message_bytes}")
    data = arrays[frame_name]
    if codec == "none":
        k = int(data.shape[0]) if data.ndim else -1
        if data.dtype != np.uint8 or tuple(data.shape[1:]) != frame_shape:
            raise WireError("compact", f"frames are {data.dtype}{list(data.shape[1:])} per frame, this run's "
                                       f"{np.dtype(np.uint8)}{list(frame_shape)}")
        if not 0 < k <= max_frames:
            raise WireError("compact", f"{k} frames for {n} transitions (at most {max_frames})")
        frames = data
    else:
        claimed = msg.meta.get(FRAMES_META)
        if type(claimed) is not int or not 0 < claimed <= max_frames:
            raise WireError("compact", f"meta {FRAMES_META!r} must be the count of frames, 1..{max_frames} for "
                                       f"{n} transitions; got {str(claimed)[:40]}")
        k = claimed
        if data.dtype != np.uint8 or data.ndim != 1:
            raise WireError("compact", f"{frame_name} must be uint8 bytes, is {data.dtype}{list(data.shape)}")
        frames = decompress(codec, data, k * frame_nbytes).reshape(k, *frame_shape)
    out: dict[str, np.ndarray] = {}
    for f in fields:
        idx = indices[f]
        if idx.size and not (int(idx.min()) >= 0 and int(idx.max()) < k):
            raise WireError("compact", f"{index_name(f)} holds indices from {idx.min()} to {idx.max()}, outside "
                                       f"its {k} frames")
        out[f] = frames[idx]
    out.update(rest)
    return Message(msg.kind, msg.sender, msg.incarnation, msg.seq, msg.version, out, msg.meta,
                   sum(a.nbytes for a in out.values()))
