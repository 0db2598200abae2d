"""Replay files: what :meth:`UniformReplay.save <zmqrl.replay.uniform.UniformReplay.save>` writes and
``load`` reads, an ``.npz`` of plain arrays (never pickles) with the state and an optional stamp as
JSON, read in bounded chunks so a damaged or foreign file is one clear error, not a crash."""

from __future__ import annotations

import json
import zipfile
import zlib
from collections.abc import Collection
from typing import IO, Any

import numpy as np

STATE_KEY = "state"
STAMP_KEY = "stamp"
STORAGE_PREFIX = "storage:"
REFS_PREFIX = "frame_refs:"
FRAMES_KEY = "frames"
READ_CHUNK = 1 << 24  # bytes read from a file at a time
# What reading a damaged or foreign file can raise; ``load`` reports each as one ValueError naming the file.
FILE_ERRORS = (OSError, EOFError, ValueError, KeyError, TypeError, IndexError, AttributeError, OverflowError,
                RuntimeError, MemoryError, zipfile.BadZipFile, zlib.error)


def read_stamp(path: str) -> dict[str, Any]:
    """The stamp saved with a replay file (``{}`` if none); reads only that, not the items.

    Raises ``ValueError`` naming ``path`` when the file is not a readable replay file.
    """
    try:
        arrays = read_npz(path, only={STAMP_KEY, STATE_KEY})
        if STATE_KEY not in arrays:
            raise ValueError(f"no {STATE_KEY!r} array")
        return decode_stamp(arrays.get(STAMP_KEY))
    except FILE_ERRORS as exc:
        raise ValueError(f"{path}: unreadable replay file: {describe_error(exc)}") from None


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
