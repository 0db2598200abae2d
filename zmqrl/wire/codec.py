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
    CONTROL,
    CONTROL_TOPIC,
    DEFAULT_LIMITS,
    HELLO,
    MAX_INCARNATION_CHARS,
    MAX_INT,
    MAX_META_DEPTH,
    MAX_NAME_CHARS,
    MAX_NDIM,
    MAX_SENDER_CHARS,
    MODEL,
    MODEL_TOPIC,
    NO_VERSION,
    PACK_MAGIC,
    PACKED_MAGICS,
    PROTOCOL_NAME,
    PROTOCOL_VERSION,
    SNAPSHOT,
    STATS,
    SUPPORTED_VERSIONS,
    TOPIC_KINDS,
    Limits,
    Message,
    WireError,
)

Frame = bytes | bytearray | memoryview | zmq.Frame
Spec = tuple[str, np.dtype, tuple[int, ...], int]  # name, dtype, shape, nbytes
PACK_ALIGN = 8
_ZEROS = bytes(PACK_ALIGN)
HEADER_FIELDS = frozenset({"p", "v", "kind", "sender", "inc", "seq", "ver", "arrays", "meta"})
_DTYPES: dict[str, np.dtype] = {name: np.dtype(name) for name in ALLOWED_DTYPES}  # parsed once, not per array


# --------------------------------------------------------------------------- helpers


def is_int(value: object) -> bool:
    """True for real ints (``bool`` is not accepted as an int)."""
    return isinstance(value, int) and not isinstance(value, bool)


def short_repr(value: object, limit: int = 60) -> str:
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
            raise WireError("dtype", f"array {name!r}: dtype {short_repr(dtype_str)} not allowed")
        if not isinstance(shape, list) or len(shape) > MAX_NDIM:
            raise WireError("shape", f"array {name!r}: shape must be a list of at most {MAX_NDIM} ints")
        for d in shape:
            if type(d) is not int or not 0 <= d <= MAX_INT:  # (bool is not an int here)
                raise WireError("shape", f"array {name!r}: shape {short_repr(shape)} must hold ints >= 0")
        nbytes = math.prod(shape) * dtype.itemsize
        # An empty array may still name absurd other dimensions ([0, 2**62]): numpy refuses to build
        # it, so the product of the non-zero dimensions must fit the limit too.
        if nbytes == 0 and math.prod(d for d in shape if d) * dtype.itemsize > limits.max_message_bytes:
            raise WireError("shape", f"array {name!r}: shape {short_repr(shape)} names more elements than "
                                     f"max_message_bytes={limits.max_message_bytes} could hold")
        total += nbytes
        if total > limits.max_message_bytes:
            raise WireError("size", f"payload exceeds max_message_bytes={limits.max_message_bytes}")
        specs.append((name, dtype, tuple(shape), nbytes))
    return tuple(specs), total


def check_ids(sender: Any, inc: Any, seq: Any, ver: Any, reason: str, where: str) -> None:
    """Check a sender name, incarnation, sequence number and model version (``where`` prefixes errors)."""
    _check_text(sender, f"{where}sender", MAX_SENDER_CHARS, reason)
    _check_text(inc, f"{where}inc", MAX_INCARNATION_CHARS, reason)
    if not is_int(seq) or not 0 <= seq <= MAX_INT:
        raise WireError(reason, f"{where}seq must be an int in 0..2**63-1, got {short_repr(seq)}")
    if not is_int(ver) or not NO_VERSION <= ver <= MAX_INT:
        raise WireError(reason, f"{where}ver must be an int in -1..2**63-1, got {short_repr(ver)}")


def _check_header(header: object, limits: Limits) -> tuple[dict[str, Any], Sequence[Spec]]:
    """Validate a parsed header object (fields, types, kind, arrays, meta); return it and its array specs."""
    if not isinstance(header, dict):
        raise WireError("header", "header must be a JSON object")
    if header.get("p") != PROTOCOL_NAME:
        raise WireError("protocol", f"protocol name {short_repr(header.get('p'))}, expected {PROTOCOL_NAME!r}")
    version = header.get("v")
    if not is_int(version) or version not in SUPPORTED_VERSIONS:
        raise WireError("version", f"protocol version {short_repr(version)}, supported {sorted(SUPPORTED_VERSIONS)}")
    if header.keys() != HEADER_FIELDS:
        keys = set(header)
        missing, extra = sorted(HEADER_FIELDS - keys), sorted(keys - HEADER_FIELDS)
        raise WireError("header", f"header fields wrong (missing {missing}, unexpected {short_repr(extra)})")
    kind = header["kind"]
    if not isinstance(kind, str) or not limits.allows(kind):
        raise WireError("kind", f"message kind {short_repr(kind)} unknown or not allowed")
    check_ids(header["sender"], header["inc"], header["seq"], header["ver"], "header", "")
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


def pack(frames: Sequence[bytes | memoryview], magic: bytes = PACK_MAGIC) -> bytes:
    """``[header, buffer...]`` as one frame: magic, header length, header, arrays at 8-byte offsets.

    Used for the learner's stream (``magic`` its topic: a single frame lets subscribers set
    ``ZMQ_CONFLATE``, keep only the newest message, which ZeroMQ offers for single-frame messages
    only) and small batches.
    """
    return packed_frame(bytes(frames[0]), [[buf] for buf in frames[1:]], magic)


def packed_frame(header: bytes, arrays: Sequence[Sequence[bytes | memoryview]], magic: bytes = PACK_MAGIC) -> bytes:
    """The packed frame of ``header`` and arrays, each array's bytes given as pieces laid end to end."""
    out: list[bytes | memoryview] = [magic, len(header).to_bytes(4, "little"), header]
    size = len(magic) + 4 + len(header)
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
    magic = views[0][:len(PACK_MAGIC)]
    if len(views) == 1 and magic in PACKED_MAGICS:
        header, arrays, specs = _unpack(views[0], limits)
        kind = TOPIC_KINDS.get(bytes(magic))
        if kind is not None and header["kind"] != kind:
            raise WireError("kind", f"a {header['kind']!r} message on the {kind} topic")
        return header, arrays, specs
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


def encode_hello(sender: str, incarnation: str, seq: int, meta: Mapping[str, Any]) -> list[bytes | memoryview]:
    """A HELLO: a peer telling the learner about itself (e.g. why it refused the learner's model)."""
    return encode(HELLO, sender=sender, incarnation=incarnation, seq=seq, version=NO_VERSION, meta=dict(meta))


def encode_model(
    sender: str, incarnation: str, version: int, params: Mapping[str, np.ndarray],
    meta: Mapping[str, Any] | None = None,
) -> list[bytes | memoryview]:
    """A MODEL message, packed into one frame on the model topic; ``seq`` equals ``version`` (>= 0)."""
    return [pack(encode(MODEL, sender=sender, incarnation=incarnation, seq=version, version=version, arrays=params,
                        meta=meta), MODEL_TOPIC)]


def encode_control(sender: str, incarnation: str, seq: int, version: int,
                   meta: Mapping[str, Any]) -> list[bytes | memoryview]:
    """A CONTROL message (no arrays), packed into one frame on the control topic: the learner's
    requests to every role in ``meta``, ``version`` its newest model's, ``seq`` counting its controls."""
    return [pack(encode(CONTROL, sender=sender, incarnation=incarnation, seq=seq, version=version, meta=meta),
                 CONTROL_TOPIC)]


def encode_snapshot_request(sender: str, incarnation: str, seq: int,
                            have: tuple[str, int] | None) -> list[bytes | memoryview]:
    """A SNAPSHOT request (one frame): the newest control and model, please; ``have`` is the
    ``(incarnation, version)`` of the model held, if any (a server that has nothing newer sends no model)."""
    meta: dict[str, Any] = {} if have is None else {"have": [have[0], int(have[1])]}
    return encode(SNAPSHOT, sender=sender, incarnation=incarnation, seq=seq, version=NO_VERSION, meta=meta)


def encode_stats(sender: str, incarnation: str, seq: int, stats: Mapping[str, Any]) -> list[bytes | memoryview]:
    """A STATS message: a role's counters in meta, no arrays."""
    return encode(STATS, sender=sender, incarnation=incarnation, seq=seq, meta=stats)


def eval_meta(version: int, returns: Sequence[float], lengths: Sequence[int],
              extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The meta of an EVAL report: ``{"version", "returns", "lengths"}`` and ``extra``."""
    return {"version": version, "returns": [float(r) for r in returns], "lengths": [int(n) for n in lengths],
            **(extra or {})}
