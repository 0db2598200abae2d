"""Encode and decode wire messages (see :mod:`zmqrl.wire.protocol`).

Decoding validates everything before using it and raises only
:class:`~zmqrl.wire.protocol.WireError` for bad input.  Arrays are rebuilt with
``numpy.frombuffer`` (no copy, never pickle) and are read-only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import zmq

from .protocol import (
    ALLOWED_DTYPES,
    BATCH,
    BUNDLE,
    DEFAULT_LIMITS,
    EVAL,
    HELLO,
    MAX_INCARNATION_CHARS,
    MAX_INT,
    MAX_META_DEPTH,
    MAX_NAME_CHARS,
    MAX_NDIM,
    MAX_SENDER_CHARS,
    MODEL,
    NO_VERSION,
    PROTOCOL_NAME,
    PROTOCOL_VERSION,
    STATS,
    SUPPORTED_VERSIONS,
    Limits,
    Message,
    WireError,
)

Frame = bytes | bytearray | memoryview | zmq.Frame
Spec = tuple[str, np.dtype, tuple[int, ...], int]  # name, dtype, shape, nbytes
PACK_MAGIC = b"ZQP1"  # first bytes of a packed single-frame message (a JSON header starts with "{")
PACK_ALIGN = 8
_ZEROS = bytes(PACK_ALIGN)
HEADER_FIELDS = frozenset({"p", "v", "kind", "sender", "inc", "seq", "ver", "arrays", "meta"})
_DTYPES: dict[str, np.dtype] = {name: np.dtype(name) for name in ALLOWED_DTYPES}  # parsed once, not per array


# --------------------------------------------------------------------------- helpers


def _is_int(value: object) -> bool:
    """True for real ints (``bool`` is not accepted as an int)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages about untrusted input."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_text(value: object, what: str, max_chars: int, reason: str = "header") -> str:
    if not isinstance(value, str) or not 0 < len(value) <= max_chars or not value.isprintable():
        raise WireError(reason, f"{what} must be a printable string of 1..{max_chars} chars")
    return value


def meta_depth_ok(meta: object, max_depth: int) -> bool:
    """Iteratively check that containers inside ``meta`` nest at most ``max_depth`` deep.

    Only containers go on the stack (scalars, the bulk of a meta, are skipped in place).
    """
    if not isinstance(meta, (dict, list)):
        return True
    stack: list[tuple[dict[Any, Any] | list[Any], int]] = [(meta, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            return False
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return True


def _frame_view(frame: object) -> memoryview:
    """A flat byte view of one frame, or WireError("frames")."""
    try:
        view = frame.buffer if isinstance(frame, zmq.Frame) else memoryview(frame)  # type: ignore[arg-type]
        if view.ndim != 1 or view.format not in ("B", "b", "c"):
            view = view.cast("B")
        return view
    except (TypeError, ValueError, BufferError) as exc:
        raise WireError("frames", f"frame is not a contiguous byte buffer ({exc})") from None


def _frame_views(frames: object, limits: Limits) -> list[memoryview]:
    try:
        count = len(frames)  # type: ignore[arg-type]
    except TypeError:
        raise WireError("frames", "frames must be a sequence of byte buffers") from None
    if isinstance(frames, (bytes, bytearray, memoryview, str)):
        raise WireError("frames", "frames must be a sequence of byte buffers, not a single buffer")
    if not 1 <= count <= limits.max_frames:
        raise WireError("frames", f"{count} frames, expected 1..{limits.max_frames}")
    return [_frame_view(frame) for frame in frames]  # type: ignore[attr-defined]


def _spec_key(entries: object) -> tuple[Any, ...] | None:
    """``entries`` as a key of :data:`_SPECS_SEEN` when it has the form of a valid ``arrays`` list
    (lists of three, shapes lists of exact ints: ``true`` or ``64.0`` would equal 1 or 64 in a key);
    None otherwise. The names and dtypes are compared by the lookup itself."""
    if type(entries) is not list:
        return None
    parts = []
    for entry in entries:
        if type(entry) is not list or len(entry) != 3:
            return None
        name, dtype, shape = entry
        if type(shape) is not list:
            return None
        for d in shape:
            if type(d) is not int:
                return None
        parts.append((name, dtype, *shape))
    return tuple(parts)


_SPECS_SEEN: dict[tuple[Any, ...], tuple[tuple[Spec, ...], int]] = {}  # arrays lists validated: specs, bytes
_SPECS_SEEN_MAX = 1024  # forgotten all at once when full: a flood of distinct layouts costs checks, not memory


def _array_specs(entries: object, limits: Limits) -> Sequence[Spec]:
    """Validate the header's ``arrays`` list; return (name, dtype, shape, nbytes) tuples.

    A sender's batches repeat one ``arrays`` list, so one validated before is looked up instead
    (5 us less per CartPole batch); only the limits, which differ between callers, are checked again.
    """
    key = _spec_key(entries)
    try:
        seen = _SPECS_SEEN.get(key) if key is not None else None
    except TypeError:  # a name or dtype that is not hashable: not valid either
        seen = None
    if seen is not None:
        specs, total = seen
        if len(specs) <= limits.max_frames - 1 and total <= limits.max_message_bytes:
            return specs
    specs, total = _check_array_specs(entries, limits)
    if key is not None:
        if len(_SPECS_SEEN) >= _SPECS_SEEN_MAX:
            _SPECS_SEEN.clear()
        _SPECS_SEEN[key] = (specs, total)
    return specs


def _check_array_specs(entries: object, limits: Limits) -> tuple[tuple[Spec, ...], int]:
    """Every check of the header's ``arrays`` list; its specs and their bytes in all."""
    if not isinstance(entries, list):
        raise WireError("header", "'arrays' must be a list")
    if len(entries) > limits.max_frames - 1:
        raise WireError("frames", f"{len(entries)} arrays, at most {limits.max_frames - 1} allowed")
    specs = []
    names: set[str] = set()
    total = 0
    for i, entry in enumerate(entries):
        if not isinstance(entry, list) or len(entry) != 3:
            raise WireError("header", f"arrays[{i}] must be [name, dtype, shape]")
        name, dtype_str, shape = entry
        name = _check_text(name, f"arrays[{i}] name", MAX_NAME_CHARS)
        if name in names:
            raise WireError("header", f"duplicate array name {name!r}")
        names.add(name)
        dtype = _DTYPES.get(dtype_str) if isinstance(dtype_str, str) else None
        if dtype is None:
            raise WireError("dtype", f"array {name!r}: dtype {_short(dtype_str)} not allowed")
        if not isinstance(shape, list) or len(shape) > MAX_NDIM:
            raise WireError("shape", f"array {name!r}: shape must be a list of at most {MAX_NDIM} ints")
        for d in shape:
            if type(d) is not int or not 0 <= d <= MAX_INT:  # (bool is not an int here)
                raise WireError("shape", f"array {name!r}: shape {_short(shape)} must hold ints >= 0")
        nbytes = math.prod(shape) * dtype.itemsize
        # An empty array may still name absurd other dimensions ([0, 2**62]): numpy refuses to build
        # it, so the product of the non-zero dimensions must fit the limit too.
        if nbytes == 0 and math.prod(d for d in shape if d) * dtype.itemsize > limits.max_message_bytes:
            raise WireError("shape", f"array {name!r}: shape {_short(shape)} names more elements than "
                                     f"max_message_bytes={limits.max_message_bytes} could hold")
        total += nbytes
        if total > limits.max_message_bytes:
            raise WireError("size", f"payload exceeds max_message_bytes={limits.max_message_bytes}")
        specs.append((name, dtype, tuple(shape), nbytes))
    return tuple(specs), total


def _check_ids(sender: Any, inc: Any, seq: Any, ver: Any, reason: str, where: str) -> None:
    """Check a sender name, incarnation, sequence number and model version (``where`` prefixes errors)."""
    _check_text(sender, f"{where}sender", MAX_SENDER_CHARS, reason)
    _check_text(inc, f"{where}inc", MAX_INCARNATION_CHARS, reason)
    if not _is_int(seq) or not 0 <= seq <= MAX_INT:
        raise WireError(reason, f"{where}seq must be an int in 0..2**63-1, got {_short(seq)}")
    if not _is_int(ver) or not NO_VERSION <= ver <= MAX_INT:
        raise WireError(reason, f"{where}ver must be an int in -1..2**63-1, got {_short(ver)}")


def _check_header(header: object, limits: Limits) -> tuple[dict[str, Any], Sequence[Spec]]:
    """Validate a parsed header object (fields, types, kind, arrays, meta); return it and its array specs."""
    if not isinstance(header, dict):
        raise WireError("header", "header must be a JSON object")
    if header.get("p") != PROTOCOL_NAME:
        raise WireError("protocol", f"protocol name {_short(header.get('p'))}, expected {PROTOCOL_NAME!r}")
    version = header.get("v")
    if not _is_int(version) or version not in SUPPORTED_VERSIONS:
        raise WireError("version", f"protocol version {_short(version)}, supported {sorted(SUPPORTED_VERSIONS)}")
    if header.keys() != HEADER_FIELDS:
        keys = set(header)
        missing, extra = sorted(HEADER_FIELDS - keys), sorted(keys - HEADER_FIELDS)
        raise WireError("header", f"header fields wrong (missing {missing}, unexpected {_short(extra)})")
    kind = header["kind"]
    if not isinstance(kind, str) or not limits.allows(kind):
        raise WireError("kind", f"message kind {_short(kind)} unknown or not allowed")
    _check_ids(header["sender"], header["inc"], header["seq"], header["ver"], "header", "")
    meta = header["meta"]
    if not isinstance(meta, dict):
        raise WireError("meta", "meta must be a JSON object")
    if not meta_depth_ok(meta, MAX_META_DEPTH):
        raise WireError("meta", f"meta nests deeper than {MAX_META_DEPTH}")
    return header, _array_specs(header["arrays"], limits)


def _parse_header(view: memoryview, limits: Limits) -> tuple[dict[str, Any], Sequence[Spec]]:
    if view.nbytes > limits.max_header_bytes:
        raise WireError("size", f"header is {view.nbytes} bytes, limit {limits.max_header_bytes}")
    try:
        obj = json.loads(view.tobytes().decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # JSON / UTF-8 / int-size errors
        raise WireError("header", f"header is not UTF-8 JSON ({type(exc).__name__})") from None
    return _check_header(obj, limits)


def _aligned(offset: int) -> int:
    return (offset + PACK_ALIGN - 1) // PACK_ALIGN * PACK_ALIGN


def _unpack(view: memoryview, limits: Limits) -> tuple[dict[str, Any], list[memoryview], Sequence[Spec]]:
    """Split a packed single-frame message into header and array views (no copies)."""
    if view.nbytes < len(PACK_MAGIC) + 4:
        raise WireError("frames", "packed message shorter than its preamble")
    header_len = int.from_bytes(view[len(PACK_MAGIC):len(PACK_MAGIC) + 4], "little")
    start = len(PACK_MAGIC) + 4
    if start + header_len > view.nbytes:
        raise WireError("frames", f"packed header of {header_len} bytes overruns the {view.nbytes}-byte frame")
    header_view = view[start:start + header_len]
    header, specs = _parse_header(header_view, limits)
    views = [header_view]
    offset = _aligned(start + header_len)
    for name, _, _, nbytes in specs:
        if offset + nbytes > view.nbytes:
            raise WireError("size", f"packed array {name!r} needs {nbytes} bytes past offset {offset}, "
                                    f"frame has {view.nbytes}")
        views.append(view[offset:offset + nbytes])
        offset = _aligned(offset + nbytes)
    if offset < view.nbytes:
        raise WireError("size", f"{view.nbytes - offset} unexpected trailing bytes in packed message")
    return header, views, specs


def pack(frames: Sequence[bytes | memoryview]) -> bytes:
    """``[header, buffer...]`` as one frame: magic, header length, header, arrays at 8-byte offsets.

    Used for models: a single frame lets subscribers set ``ZMQ_CONFLATE`` (keep only the newest
    message), which ZeroMQ offers for single-frame messages only.
    """
    return _packed(bytes(frames[0]), [[buf] for buf in frames[1:]])


def _packed(header: bytes, arrays: Sequence[Sequence[bytes | memoryview]]) -> bytes:
    """The packed frame of ``header`` and arrays, each array's bytes given as pieces laid end to end."""
    out: list[bytes | memoryview] = [PACK_MAGIC, len(header).to_bytes(4, "little"), header]
    size = len(PACK_MAGIC) + 4 + len(header)
    for pieces in (*arrays, ()):  # (the empty last one pads the frame's end)
        pad = _aligned(size) - size
        if pad:
            out.append(_ZEROS[:pad])
            size += pad
        for piece in pieces:
            out.append(piece)
            size += memoryview(piece).nbytes
    return b"".join(out)


def _validate(frames: Sequence[Frame], limits: Limits) -> tuple[dict[str, Any], list[memoryview], Sequence[Spec]]:
    """Validate frame count, header and frame lengths (or a packed single frame)."""
    views = _frame_views(frames, limits)
    if len(views) == 1 and views[0][:len(PACK_MAGIC)] == PACK_MAGIC:
        return _unpack(views[0], limits)
    header, specs = _parse_header(views[0], limits)
    if len(views) != 1 + len(specs):
        raise WireError("frames", f"{len(views)} frames for {len(specs)} arrays (expected {1 + len(specs)})")
    for (name, dtype, shape, nbytes), view in zip(specs, views[1:], strict=True):
        if view.nbytes != nbytes:
            spec = f"{name!r} {dtype.str}{list(shape)}"
            raise WireError("size", f"array {spec} needs {nbytes} bytes, frame has {view.nbytes}")
    return header, views, specs


# --------------------------------------------------------------------------- public API


def peek_header(frames: Sequence[Frame], limits: Limits = DEFAULT_LIMITS) -> dict[str, Any]:
    """Validate a whole message (header and frame lengths) without building arrays.

    Returns the parsed header dict.  Meant for relays that count and forward
    the original frames unchanged.  Raises :class:`WireError` on bad input.
    """
    return peek(frames, limits)[0]


def peek(frames: Sequence[Frame], limits: Limits = DEFAULT_LIMITS
         ) -> tuple[dict[str, Any], list[memoryview], Sequence[Spec]]:
    """:func:`peek_header`, also returning the frames' views (header first, then each array's
    bytes) and the arrays' specs ``(name, dtype, shape, nbytes)``: what a relay needs to join
    messages (:func:`encode_bundle`) without building arrays."""
    return _validate(frames, limits)


def decode(frames: Sequence[Frame], limits: Limits = DEFAULT_LIMITS) -> Message:
    """Decode ``[header, buffer...]`` into a :class:`Message`; WireError on bad input.

    Arrays are read-only ``frombuffer`` views of the frames; copy them before
    writing.  Accepts ``bytes``, ``memoryview`` or ``zmq.Frame`` frames.
    """
    header, views, specs = _validate(frames, limits)
    arrays: dict[str, np.ndarray] = {}
    nbytes = 0
    for (name, dtype, shape, size), view in zip(specs, views[1:], strict=True):
        array = np.ndarray(shape, dtype, view)  # (one call: frombuffer + reshape cost twice as much)
        if not view.readonly:  # a received frame's view already is
            array.flags.writeable = False
        arrays[name] = array
        nbytes += size
    return Message(header["kind"], header["sender"], header["inc"], header["seq"], header["ver"], arrays,
                   header["meta"], nbytes)


def _json_default(value: object) -> Any:
    """Let numpy scalars and small arrays appear in meta."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def encode(
    kind: str,
    *,
    sender: str,
    incarnation: str,
    seq: int,
    version: int = NO_VERSION,
    arrays: Mapping[str, np.ndarray] | None = None,
    meta: Mapping[str, Any] | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> list[bytes | memoryview]:
    """Build the frames ``[header, buffer...]`` of one message.

    Buffers are memoryviews of the (C-contiguous) arrays, not copies: when they
    are sent zero-copy, do not modify the arrays until the send has completed
    (simplest: never reuse an array after handing it to ``encode``).  Raises
    :class:`WireError` if the message would not pass :func:`decode` under ``limits``.
    """
    entries: list[list[Any]] = []
    buffers: list[bytes | memoryview] = []
    for name, value in (arrays or {}).items():
        array = np.asarray(value)
        if not array.flags.c_contiguous:  # (ascontiguousarray would turn 0-d into 1-d)
            array = np.ascontiguousarray(array)
        if array.dtype.str not in ALLOWED_DTYPES:
            raise WireError("dtype", f"array {name!r}: dtype {array.dtype.str!r} not allowed")
        entries.append([name, array.dtype.str, list(array.shape)])
        buffers.append(array.reshape(-1).view(np.uint8).data)
    try:
        meta_obj = json.loads(json.dumps(dict(meta or {}), default=_json_default))
    except (TypeError, ValueError, RecursionError) as exc:
        raise WireError("meta", f"meta is not JSON serialisable ({exc})") from None
    header = {
        "p": PROTOCOL_NAME,
        "v": PROTOCOL_VERSION,
        "kind": kind,
        "sender": sender,
        "inc": incarnation,
        "seq": seq,
        "ver": version,
        "arrays": entries,
        "meta": meta_obj,
    }
    _check_header(header, limits)
    data = json.dumps(header, separators=(",", ":")).encode("utf-8")
    if len(data) > limits.max_header_bytes:
        raise WireError("size", f"header is {len(data)} bytes, limit {limits.max_header_bytes}")
    return [data, *buffers]


def _batch_size(arrays: Mapping[str, np.ndarray]) -> int:
    """Common leading length of batch arrays (0 for no arrays); WireError("shape") otherwise."""
    sizes: dict[str, int] = {}
    for name, array in arrays.items():
        shape = np.shape(array)
        if not shape:
            raise WireError("shape", f"batch array {name!r} has no leading (batch) dimension")
        sizes[name] = int(shape[0])
    if len(set(sizes.values())) > 1:
        raise WireError("shape", f"batch arrays have unequal leading lengths: {sizes}")
    return next(iter(sizes.values()), 0)


def check_batch(msg: Message) -> int:
    """Check that ``msg`` is a BATCH whose arrays share one leading length; return it."""
    if msg.kind not in (BATCH, BUNDLE):
        raise WireError("kind", f"expected a {BATCH!r} message, got {msg.kind!r}")
    return _batch_size(msg.arrays)


BatchSpec = Mapping[str, tuple[np.dtype, tuple[int, ...]]]  # field -> (dtype, per-item shape)
OPTIONAL_FIELDS: dict[str, tuple[np.dtype, tuple[int, ...]]] = {"priority": (np.dtype(np.float32), ())}


def _fits_spec(msg: Message, spec: BatchSpec) -> int | None:
    """A batch's length when it fits ``spec`` exactly (the common case, checked in one pass); else None."""
    if msg.kind not in (BATCH, BUNDLE) or not msg.arrays:
        return None
    n, required = -1, 0
    for key, array in msg.arrays.items():
        want = spec.get(key)
        if want is not None:
            required += 1
        else:
            want = OPTIONAL_FIELDS.get(key)
            if want is None:
                return None
        shape = array.shape
        if not shape or array.dtype != want[0] or shape[1:] != want[1] or (n >= 0 and shape[0] != n):
            return None
        n = shape[0]
    return n if required == len(spec) else None


def check_batch_spec(msg: Message, spec: BatchSpec) -> int:
    """Check a BATCH (or a BUNDLE of them) against the run's batch spec (every field of ``spec``, plus the optional
    ``priority``; each dtype and per-item shape exact); return its length.

    A message can pass every other check and still not be this run's data (another env, a
    stray script): it raises WireError("schema") naming the field, before it reaches replay.
    """
    n = _fits_spec(msg, spec)
    if n is not None:
        return n
    n = check_batch(msg)  # something does not fit: find what, and say it
    keys, expected = set(msg.arrays), set(spec)
    missing, extra = sorted(expected - keys), sorted(keys - expected - set(OPTIONAL_FIELDS))
    if missing or extra:
        raise WireError("schema", f"batch fields differ from this run's: missing {missing}, unexpected {extra}")
    for key, array in msg.arrays.items():
        dtype, shape = spec[key] if key in spec else OPTIONAL_FIELDS[key]
        if array.dtype != dtype or tuple(array.shape[1:]) != tuple(shape):
            raise WireError("schema", f"batch field {key!r} is {array.dtype}{list(array.shape[1:])} per item, "
                                      f"this run's is {np.dtype(dtype)}{list(shape)}")
    return n


def encode_hello(sender: str, incarnation: str, seq: int, meta: Mapping[str, Any]) -> list[bytes | memoryview]:
    """A HELLO: a peer telling the learner about itself (e.g. why it refused the learner's model)."""
    return encode(HELLO, sender=sender, incarnation=incarnation, seq=seq, version=NO_VERSION, meta=dict(meta))


def encode_batch(
    sender: str,
    incarnation: str,
    seq: int,
    version: int,
    batch: Mapping[str, np.ndarray],
    episodes: Mapping[str, Any] | None = None,
) -> list[bytes | memoryview]:
    """A BATCH of transitions (equal leading lengths); ``meta = {"episodes": episodes}`` if given."""
    _batch_size(batch)
    meta = {"episodes": dict(episodes)} if episodes is not None else {}
    return encode(BATCH, sender=sender, incarnation=incarnation, seq=seq, version=version, arrays=batch, meta=meta)


def encode_model(
    sender: str, incarnation: str, version: int, params: Mapping[str, np.ndarray],
    meta: Mapping[str, Any] | None = None,
) -> list[bytes | memoryview]:
    """A MODEL message, packed into one frame; ``seq`` equals ``version`` (which must be >= 0)."""
    return [pack(encode(MODEL, sender=sender, incarnation=incarnation, seq=version, version=version, arrays=params,
                        meta=meta))]


def encode_stats(sender: str, incarnation: str, seq: int, stats: Mapping[str, Any]) -> list[bytes | memoryview]:
    """A STATS message: a role's counters in meta, no arrays."""
    return encode(STATS, sender=sender, incarnation=incarnation, seq=seq, meta=stats)


def eval_meta(version: int, returns: Sequence[float], lengths: Sequence[int],
              extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The meta of an EVAL report: ``{"version", "returns", "lengths"}`` and ``extra``."""
    return {"version": version, "returns": [float(r) for r in returns], "lengths": [int(n) for n in lengths],
            **(extra or {})}


def encode_eval(
    sender: str,
    incarnation: str,
    seq: int,
    version: int,
    returns: Sequence[float],
    lengths: Sequence[int],
    extra: Mapping[str, Any] | None = None,
) -> list[bytes | memoryview]:
    """An EVAL report: meta :func:`eval_meta` (``extra`` as the evaluator fills it: the learner
    incarnation of the model, the report's MAC)."""
    return encode(EVAL, sender=sender, incarnation=incarnation, seq=seq, version=version,
                  meta=eval_meta(version, returns, lengths, extra))


# --------------------------------------------------------------------------- bundles (proxy -> learner)

BUNDLE_META_DEPTH = MAX_META_DEPTH - 3  # a part's meta sits three containers deep in its bundle's meta


def batch_layout(specs: Sequence[Spec]) -> tuple[tuple[Any, ...], int] | None:
    """A batch's layout (each array's name, dtype and item shape) and its length, from the specs
    :func:`peek` returns; None when its arrays could not be joined with others' (none at all, one
    without a leading dimension, unequal leading lengths, no rows)."""
    if not specs:
        return None
    n = -1
    for _, _, shape, _ in specs:
        if not shape or (n >= 0 and shape[0] != n):
            return None
        n = shape[0]
    if n <= 0:
        return None
    return tuple((name, dtype.str, shape[1:]) for name, dtype, shape, _ in specs), n


def encode_bundle(sender: str, incarnation: str, seq: int,
                  parts: Sequence[tuple[Mapping[str, Any], Sequence[memoryview], int]],
                  limits: Limits = DEFAULT_LIMITS) -> list[bytes]:
    """One packed frame joining BATCH messages of one layout: ``parts`` holds each one's header
    (as :func:`peek` returns it), its views (header first, then its arrays' bytes) and its length.
    Each array's bytes are the parts' bytes end to end; meta lists whose rows are whose.
    Raises WireError when the parts' layouts differ or the header would exceed the limit."""
    if not parts:
        raise WireError("shape", "a bundle needs at least one batch")
    first = parts[0][0]["arrays"]
    total = sum(n for _, _, n in parts)
    entries = [[name, dtype, [total, *shape[1:]]] for name, dtype, shape in first]
    layout = [(name, dtype, shape[1:]) for name, dtype, shape in first]
    for header, _, _ in parts[1:]:
        if [(name, dtype, shape[1:]) for name, dtype, shape in header["arrays"]] != layout:
            raise WireError("schema", f"batch from {header['sender']!r} has another array layout than "
                                      f"{parts[0][0]['sender']!r}'s: they cannot share a bundle")
    meta = {"parts": [[h["sender"], h["inc"], h["seq"], h["ver"], n, h["meta"]] for h, _, n in parts]}
    data = json.dumps({"p": PROTOCOL_NAME, "v": PROTOCOL_VERSION, "kind": BUNDLE, "sender": sender,
                       "inc": incarnation, "seq": seq, "ver": NO_VERSION, "arrays": entries, "meta": meta},
                      separators=(",", ":")).encode("utf-8")
    if len(data) > limits.max_header_bytes:
        raise WireError("size", f"bundle header is {len(data)} bytes, limit {limits.max_header_bytes}")
    return [_packed(data, [[views[j] for _, views, _ in parts] for j in range(1, len(entries) + 1)])]


def unbundle(msg: Message, rows: int | None = None) -> list[Message]:
    """The BATCH messages a BUNDLE joined, in order, their arrays views of the bundle's; WireError
    ("meta" or "shape") unless its parts are well formed and account for its rows exactly.
    ``rows``: its length, where the caller already checked it (:func:`check_batch_spec`)."""
    parts = msg.meta.get("parts") if msg.meta.keys() == {"parts"} else None
    if type(parts) is not list or not parts:
        raise WireError("meta", "a bundle's meta must be {\"parts\": [[sender, inc, seq, ver, n, meta], ...]}")
    total = check_batch(msg) if rows is None else rows
    row_bytes = msg.nbytes // total if total else 0
    out: list[Message] = []
    lo = 0
    for i, part in enumerate(parts):
        if type(part) is not list or len(part) != 6:
            raise WireError("meta", f"bundle part {i} must be [sender, inc, seq, ver, n, meta]")
        sender, inc, seq, ver, n, meta = part
        _check_ids(sender, inc, seq, ver, "meta", f"bundle part {i}: ")
        if not _is_int(n) or not 0 < n <= total - lo:
            raise WireError("shape", f"bundle part {i} claims {_short(n)} rows; {total - lo} of {total} are left")
        if not isinstance(meta, dict):
            raise WireError("meta", f"bundle part {i}: meta must be a JSON object")
        hi = lo + n
        out.append(Message(BATCH, sender, inc, seq, ver, {k: a[lo:hi] for k, a in msg.arrays.items()}, meta,
                           n * row_bytes))
        lo = hi
    if lo != total:
        raise WireError("shape", f"bundle parts hold {lo} rows, its arrays {total}")
    return out
