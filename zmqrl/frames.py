"""Image frames, on the ground floor: their layout in an item, their fingerprints, their codecs.

The wire (a batch's distinct frames sent once, :mod:`zmqrl.wire.compact`) and replay (each
distinct frame stored once, :mod:`zmqrl.replay.frames`) both split image items into frames, find
equal frames by a 64-bit fingerprint, and may keep frames lz4- or zstd-compressed. They share
this module and import nothing of each other. Numpy and the standard library only; a codec's
package is imported when a codec is made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

_FINGERPRINT_SEED = 0x5EED
CODECS = ("none", "lz4", "zstd")
PACKAGES = {"lz4": "lz4", "zstd": "zstandard"}  # codec -> the package that provides it


def frame_layout(item_shape: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """Frames per item and the frame shape of an image item: an item of three or more dimensions
    (a stack ``(S, H, W)``, a sequence of stacks ``(T, S, H, W)``) is ``prod(leading dims)`` frames of
    its last two dimensions; a two-dimensional item is one frame."""
    shape = tuple(int(d) for d in item_shape)
    if len(shape) >= 3:
        return int(np.prod(shape[:-2], dtype=np.int64)), shape[-2:]
    return 1, shape


def image_fields(spec: Mapping[str, tuple[np.dtype, tuple[int, ...]]],
                 candidates: tuple[str, ...] = ("obs", "next_obs")) -> tuple[str, ...]:
    """The fields of a batch spec among ``candidates`` whose items are uint8 images (two or more
    dimensions) of one frame shape: the fields whose frames may be kept (and sent) once."""
    fields = [f for f in candidates if f in spec and np.dtype(spec[f][0]) == np.uint8 and len(spec[f][1]) >= 2]
    if len({frame_layout(tuple(spec[f][1]))[1] for f in fields}) > 1:
        return ()
    return tuple(fields)


class Fingerprints:
    """64-bit fingerprints of frames of one byte length: each frame's bytes as uint64 words (the
    last zero-padded) times fixed random odd multipliers, summed mod 2**64; one integer matrix
    product per batch (numpy releases the interpreter lock for it). Equal frames have equal
    fingerprints; callers compare the bytes of frames whose fingerprints are equal before they
    treat them as one."""

    def __init__(self, frame_nbytes: int) -> None:
        self.nbytes = int(frame_nbytes)
        self.words = -(-self.nbytes // 8)
        rng = np.random.default_rng(_FINGERPRINT_SEED)
        self.mult = rng.integers(0, 2**63, size=self.words, dtype=np.uint64) * np.uint64(2) + np.uint64(1)

    def as_words(self, frames: np.ndarray) -> np.ndarray:
        """Frames ``(N, ...)`` of ``nbytes`` bytes each as ``(N, words)`` uint64 (a view where the length allows)."""
        flat = np.ascontiguousarray(frames).reshape(frames.shape[0], -1).view(np.uint8)
        pad = self.words * 8 - flat.shape[1]
        if pad:
            flat = np.pad(flat, ((0, 0), (0, pad)))
        return flat.view(np.uint64)

    def of(self, words: np.ndarray) -> np.ndarray:
        """The fingerprints of frames given as :meth:`as_words`."""
        return words @ self.mult  # (wraps mod 2**64)

    def of_frames(self, frames: np.ndarray) -> np.ndarray:
        """The fingerprints of frames ``(N, ...)``."""
        return self.of(self.as_words(frames))


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


class CodecError(ValueError):
    """A codec that is unknown or not installed, or data that does not decompress to its size."""


class Codec:
    """lz4 (block, no stored size) or zstd (no content size, no checksum) over raw bytes whose
    decompressed length the caller knows: :meth:`unpack` never makes more than that many bytes,
    and data that does not come back to exactly that many is a :class:`CodecError`."""

    def __init__(self, name: str, level: int = 1) -> None:
        if name not in PACKAGES:
            raise CodecError(f"unknown frame codec {name!r} (expected one of {list(CODECS)})")
        self.name = name
        self.pack: Callable[[memoryview | bytes], bytes]
        self._unpack: Callable[[memoryview | bytes, int], bytes]
        try:
            if name == "lz4":
                import lz4.block

                self.pack = lambda data: lz4.block.compress(data, store_size=False)
                self._unpack = lambda data, n: lz4.block.decompress(data, uncompressed_size=n)
            else:
                import zstandard

                packer = zstandard.ZstdCompressor(level=level, write_content_size=False, write_checksum=False,
                                                  write_dict_id=False)
                unpacker = zstandard.ZstdDecompressor()
                self.pack = packer.compress
                self._unpack = lambda data, n: unpacker.decompress(data, max_output_size=n)
        except ImportError:
            package = PACKAGES[name]
            raise CodecError(f"the {package} package is not installed here (pip install {package}, or the "
                             "zmqrl[compress] extra)") from None

    def unpack(self, data: memoryview | bytes, nbytes: int) -> bytes:
        """``data`` decompressed into exactly ``nbytes`` bytes (CodecError otherwise)."""
        if nbytes == 0:
            if len(data):
                raise CodecError(f"{self.name}: {len(data)} bytes of data for 0 bytes of frames")
            return b""
        try:
            out = self._unpack(data, nbytes)
        except Exception as exc:  # (each codec raises its own error type for corrupt input)
            raise CodecError(f"{self.name} data does not decompress ({type(exc).__name__}: "
                             f"{str(exc)[:80]})") from None
        if len(out) != nbytes:
            raise CodecError(f"{self.name} data decompresses to {len(out)} bytes, not the {nbytes} announced")
        return bytes(out)


def check_codec(name: str, key: str) -> None:
    """Raise ``ConfigError`` naming the config ``key`` unless ``name`` is a known codec installed here."""
    from zmqrl.config import ConfigError  # (the config package is a leaf; imported only to report)

    if name not in CODECS:
        raise ConfigError(f"{key}={name!r}: expected one of {list(CODECS)}")
    if name != "none":
        try:
            Codec(name)
        except CodecError as exc:
            raise ConfigError(f"{key}={name!r}: {exc}") from None
