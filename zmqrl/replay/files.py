"""Replay files: what :meth:`UniformReplay.save <zmqrl.replay.uniform.UniformReplay.save>` writes and
``load`` reads, an ``.npz`` of plain arrays (never pickles) with the state and an optional stamp as
JSON, read in bounded chunks so a damaged or foreign file is one clear error, not a crash.

A replay hands :func:`save_replay` its :class:`ReplayContents`; :func:`read_replay` checks a whole
file against the replay about to take it and hands the contents back, or raises before anything changes.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
import zlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from zmqrl.frames import frame_layout
from zmqrl.replay.schema import RESERVED_KEYS, Layout, match_schema, parse_schema

STATE_KEY = "state"
STAMP_KEY = "stamp"
STORAGE_PREFIX = "storage:"
REFS_PREFIX = "frame_refs:"
FRAMES_KEY = "frames"
PRIORITIES_KEY = "priorities"
LEGACY_TREE_KEY = "tree"  # priorities of files written before the two-level sum tree: a binary tree, leaves last
READ_CHUNK = 1 << 24  # bytes read from a file at a time
# What reading a damaged or foreign file can raise; ``load`` reports each as one ValueError naming the file.
FILE_ERRORS = (OSError, EOFError, ValueError, KeyError, TypeError, IndexError, AttributeError, OverflowError,
                RuntimeError, MemoryError, zipfile.BadZipFile, zlib.error)


StateCheck = Callable[[Mapping[str, Any]], dict[str, Any]]  # a replay's check of a file's state, normalising it


@dataclass
class ReplayContents:
    """A replay's items and state as its file holds them: what ``save`` writes and ``load`` takes back."""

    state: dict[str, Any]  # the replay's state_dict(): counters, RNG, a prioritized replay's own values
    storage: dict[str, np.ndarray]  # ring arrays of the keys stored as given, one row per slot
    frame_refs: dict[str, np.ndarray] = field(default_factory=dict)  # per frame key: (slots, frames per item)
    frame_schema: Layout = field(default_factory=dict)  # per frame key: its items' shape and dtype
    frames: np.ndarray | None = None  # the frame pool's frames by pool slot, compressed or not
    priorities: np.ndarray | None = None  # a prioritized replay's sum-tree leaves, one per slot

    @property
    def schema(self) -> Layout:
        """Every stored key's per-item shape and dtype."""
        return {**{k: (tuple(a.shape[1:]), a.dtype) for k, a in self.storage.items()}, **self.frame_schema}

    def frame_refcounts(self) -> np.ndarray:
        """Per frame: how many frame slots of the stored items (the first ``state["size"]``) point at it."""
        assert self.frames is not None
        size = self.state["size"]
        live = np.concatenate([r[:size].reshape(-1) for r in self.frame_refs.values()]).astype(np.int64)
        return np.bincount(live, minlength=self.frames.shape[0]).astype(np.int32)


def save_replay(path: str, contents: ReplayContents, stamp: Mapping[str, Any] | None = None) -> None:
    """Write ``contents`` (and ``stamp``, small JSON-serialisable metadata) to one ``.npz`` file at exactly
    ``path``, through a temporary file beside it: a crash never leaves a torn one."""
    arrays = {}
    if stamp is not None:
        arrays[STAMP_KEY] = encode_json(dict(stamp), "stamp", strict=True)
    frame_schema = {k: [list(shape), dtype.str] for k, (shape, dtype) in contents.frame_schema.items()}
    arrays.update({STORAGE_PREFIX + k: v for k, v in contents.storage.items()})
    arrays.update({REFS_PREFIX + k: v for k, v in contents.frame_refs.items()})
    if contents.frames is not None:
        arrays[FRAMES_KEY] = contents.frames
    if contents.priorities is not None:
        arrays[PRIORITIES_KEY] = contents.priorities
    arrays[STATE_KEY] = encode_json({**contents.state, "frame_schema": frame_schema}, "state")
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, allow_pickle=False, **arrays)
    os.replace(tmp, path)


def read_replay(path: str, check_state: StateCheck, *, schema: Layout | None = None,
                priorities: bool = False) -> tuple[ReplayContents, dict[str, Any]]:
    """The contents of a file written by :func:`save_replay`, checked whole, and its stamp (``{}`` if none).

    ``check_state`` is the replay's own check of the file's state (its capacity among it), returning the
    state normalised; ``schema``, where the replay's is fixed, is what the file's items must match;
    ``priorities`` says the file must hold a prioritized replay's priorities (or its older binary tree).
    A file that cannot be read back whole and consistent raises ``ValueError`` naming ``path``.
    """
    try:
        arrays = read_npz(path)
        stamp = decode_stamp(arrays.pop(STAMP_KEY, None))
        return _contents(arrays, check_state, schema, priorities), stamp
    except FILE_ERRORS as exc:
        raise ValueError(f"{path}: unreadable replay file: {describe_error(exc)}") from None


def _contents(arrays: dict[str, np.ndarray], check_state: StateCheck, schema: Layout | None,
              priorities: bool) -> ReplayContents:
    """Check every array and value of a replay file (see :func:`read_replay`)."""
    if STATE_KEY not in arrays:
        raise ValueError(f"no {STATE_KEY!r} array")
    state = decode_json(arrays.pop(STATE_KEY), STATE_KEY)
    if not isinstance(state, dict):
        raise ValueError(f"{STATE_KEY!r} is not a JSON object")
    frame_schema = _parse_frame_schema(state.pop("frame_schema", {}))
    checked = check_state(state)
    capacity, size = checked["capacity"], checked["size"]
    storage = {n[len(STORAGE_PREFIX) :]: arrays.pop(n) for n in list(arrays) if n.startswith(STORAGE_PREFIX)}
    refs = {n[len(REFS_PREFIX) :]: arrays.pop(n) for n in list(arrays) if n.startswith(REFS_PREFIX)}
    for key, arr in {**storage, **refs}.items():
        if arr.shape[:1] != (capacity,):
            raise ValueError(f"key {key!r}: stored length {arr.shape[:1]} != capacity {capacity}")
        if key in RESERVED_KEYS:
            raise ValueError(f"key {key!r} is reserved for sample() output")
    if sorted(refs) != sorted(frame_schema) or set(refs) & set(storage):
        raise ValueError(f"frame keys {sorted(refs)} do not match the file's frame schema {sorted(frame_schema)}")
    contents = ReplayContents(checked, storage, refs, frame_schema)
    if schema is not None:
        match_schema(schema, contents.schema, "file")
    if refs:
        contents.frames = _check_frames(refs, frame_schema, arrays.pop(FRAMES_KEY, None), size)
    if priorities:
        contents.priorities = _read_priorities(arrays, capacity, size)
    return contents


def _parse_frame_schema(raw: Any) -> Layout:
    """The ``frame_schema`` of a file's state: ``{key: [shape, dtype string]}``."""
    try:
        return parse_schema({k: (dtype, shape) for k, (shape, dtype) in raw.items()}, allow_empty=True)
    except (AttributeError, TypeError, ValueError):
        raise ValueError(f"frame_schema: expected {{key: [shape, dtype]}}, got {str(raw)[:80]}") from None


def _check_frames(refs: dict[str, np.ndarray], frame_schema: Layout, frames: np.ndarray | None,
                  size: int) -> np.ndarray:
    """Check a file's frame slots and frames; return the frames, each of the layout
    :func:`~zmqrl.frames.frame_layout` gives (files that kept a whole item as one frame have ``refs``
    rewritten in place to slots of its frames)."""
    if frames is None:
        raise ValueError("the file has frame slots but no frames")
    dtypes = {dtype for _, dtype in frame_schema.values()}
    layouts = {key: frame_layout(shape) for key, (shape, _) in frame_schema.items()}
    if len(dtypes) != 1 or len({fs for _, fs in layouts.values()}) != 1:
        raise ValueError(f"frame keys {sorted(frame_schema)} differ in frame shape or dtype")
    if not all(r.ndim == 2 and np.issubdtype(r.dtype, np.integer) for r in refs.values()):
        raise ValueError("frame slots: expected one integer (capacity, frames per item) array per frame key")
    shape, dtype = next(iter(layouts.values()))[1], dtypes.pop()
    whole = {key: r.shape[1] == 1 and layouts[key][0] > 1 for key, r in refs.items()}  # item-shaped frames
    for key, r in refs.items():
        if not whole[key] and r.shape[1] != layouts[key][0]:
            raise ValueError(f"frame slots: {r.shape[1]} frames per item do not fit {key!r} items of shape "
                             f"{frame_schema[key][0]}")
    if any(whole.values()):
        if not all(whole.values()) or frames.shape[1:] != frame_schema[next(iter(refs))][0]:
            raise ValueError(f"frames: {frames.shape[1:]} fit neither items nor frames of {shape}")
    elif frames.shape[1:] != shape:
        raise ValueError(f"frames: expected {shape} {dtype}, got {frames.shape[1:]} {frames.dtype}")
    if frames.dtype != dtype:
        raise ValueError(f"frames: expected {dtype}, got {frames.dtype}")
    live = np.concatenate([r[:size].reshape(-1) for r in refs.values()])
    if live.size and (live.min() < 0 or live.max() >= frames.shape[0]):
        raise ValueError(f"frame slots point outside the {frames.shape[0]} stored frames")
    if any(whole.values()):
        for key, r in refs.items():
            per_item = layouts[key][0]
            refs[key] = r.astype(np.int64) * per_item + np.arange(per_item)
        frames = frames.reshape(-1, *shape)
    return frames


def _read_priorities(arrays: Mapping[str, np.ndarray], capacity: int, size: int) -> np.ndarray:
    """A prioritized replay's priorities (sum-tree leaves), checked: finite, non-negative, zero beyond the
    ``size`` stored items."""
    if PRIORITIES_KEY in arrays:
        leaves = arrays[PRIORITIES_KEY]
    elif LEGACY_TREE_KEY in arrays:
        tree = arrays[LEGACY_TREE_KEY]
        num_leaves = 1 << (capacity - 1).bit_length()
        if tree.shape != (2 * num_leaves,):
            raise ValueError(f"tree: expected shape {(2 * num_leaves,)}, got {tree.shape}")
        leaves = tree[num_leaves : num_leaves + capacity]
    else:
        raise ValueError(f"no {PRIORITIES_KEY!r} array in the replay file")
    if leaves.shape != (capacity,) or leaves.dtype.kind != "f":
        raise ValueError(f"priorities: expected {(capacity,)} floats, got {leaves.shape} {leaves.dtype}")
    leaves = leaves.astype(np.float64)
    if not np.all((leaves >= 0) & (leaves < math.inf)):
        raise ValueError("priorities must be finite and non-negative")
    if np.any(leaves[size:] != 0):
        raise ValueError(f"priorities: non-zero priority beyond the {size} stored items")
    return leaves


# ---------------------------------------------------------------------- helpers


def encode_json(value: Any, name: str, strict: bool = False) -> np.ndarray:
    try:
        text = json.dumps(value, allow_nan=not strict)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be JSON-serialisable: {exc}") from None
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def decode_json(arr: np.ndarray, name: str) -> Any:
    if arr.dtype != np.uint8 or arr.ndim != 1:
        raise ValueError(f"{name!r}: expected 1-D uint8 JSON bytes, got {arr.dtype} {arr.shape}")
    return json.loads(arr.tobytes().decode("utf-8"))


def decode_stamp(arr: np.ndarray | None) -> dict[str, Any]:
    if arr is None:
        return {}
    stamp = decode_json(arr, STAMP_KEY)
    if not isinstance(stamp, dict):
        raise ValueError(f"{STAMP_KEY!r} is not a JSON object")
    return stamp


def describe_error(exc: BaseException) -> str:
    """One line for an error raised while reading a file."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else "no detail"
    if isinstance(exc, KeyError):
        return f"missing {text}"
    if isinstance(exc, zipfile.BadZipFile):
        return f"not a complete .npz archive (truncated or another kind of file): {text}"
    return text if type(exc) is ValueError else f"{type(exc).__name__}: {text}"


def read_npz(path: str, only: Collection[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file (those named in ``only``, if given), read without pickles.

    Each array's header is checked against the bytes the archive holds for it before any
    memory is allocated, so a damaged header fails cleanly instead of asking for terabytes.
    """
    arrays: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if not info.filename.endswith(".npy"):
                raise ValueError(f"unexpected member {info.filename!r} (not an .npy array)")
            name = info.filename[: -len(".npy")]
            if name in arrays:
                raise ValueError(f"array {name!r} appears twice")
            if only is None or name in only:
                with zf.open(info) as f:
                    arrays[name] = read_npy(f, info.file_size, name)
    return arrays


def read_npy(f: IO[bytes], size: int, name: str) -> np.ndarray:
    fmt = np.lib.format
    version = fmt.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = fmt.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = fmt.read_array_header_2_0(f)
    else:
        raise ValueError(f"array {name!r}: unsupported .npy format version {version}")
    if dtype.hasobject:
        raise ValueError(f"array {name!r}: object arrays are not replay data")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    nbytes = count * dtype.itemsize
    if nbytes != size - f.tell():
        raise ValueError(f"array {name!r}: header says {shape} {dtype} ({nbytes} bytes), "
                         f"the file holds {size - f.tell()} bytes for it")
    flat = np.empty(count, dtype=dtype)
    view = flat.view(np.uint8) if nbytes else np.zeros(0, np.uint8)
    pos = 0
    while pos < nbytes:
        chunk = f.read(min(READ_CHUNK, nbytes - pos))
        if not chunk:
            raise ValueError(f"array {name!r}: data ends after {pos} of {nbytes} bytes")
        view[pos : pos + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
        pos += len(chunk)
    if f.read(1):  # also makes the archive check the member's CRC
        raise ValueError(f"array {name!r}: trailing bytes after the data")
    return flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)
