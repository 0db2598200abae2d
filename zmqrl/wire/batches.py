"""Transition batches on the wire: a batch's checks against the run's batch spec, bundles (a
proxy's join of several actors' batches of one layout, taken apart again by the learner) and
:class:`BatchEncoder`, which makes a sender's stream of BATCH messages from a header template --
the same bytes as ``encode``, for a third of the work."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .codec import Spec, check_ids, encode, is_int, pack, packed_frame, short_repr
from .compact import FRAME_ARRAYS
from .protocol import (
    BATCH,
    BUNDLE,
    DEFAULT_LIMITS,
    MAX_INT,
    MAX_META_DEPTH,
    NO_VERSION,
    PROTOCOL_NAME,
    PROTOCOL_VERSION,
    Limits,
    Message,
    WireError,
)


def _batch_size(arrays: Mapping[str, np.ndarray]) -> int:
    """Common leading length of batch arrays (0 for no arrays); WireError("shape") otherwise. A
    compact batch's frames (:data:`~zmqrl.wire.compact.FRAME_ARRAYS`) count frames, not rows: they
    need a leading dimension but no particular length."""
    sizes: dict[str, int] = {}
    for name, array in arrays.items():
        shape = np.shape(array)
        if not shape:
            raise WireError("shape", f"batch array {name!r} has no leading (batch) dimension")
        if name not in FRAME_ARRAYS:
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


BUNDLE_META_DEPTH = MAX_META_DEPTH - 3  # a part's meta sits three containers deep in its bundle's meta


def batch_layout(specs: Sequence[Spec]) -> tuple[tuple[Any, ...], int] | None:
    """A batch's layout (each array's name, dtype and item shape) and its length, from the specs
    :func:`peek` returns; None when its arrays could not be joined with others' (none at all, one
    without a leading dimension, unequal leading lengths, no rows). A compact batch's frames
    (:data:`~zmqrl.wire.compact.FRAME_ARRAYS`) may have any leading length."""
    if not specs:
        return None
    n = -1
    for name, _, shape, _ in specs:
        if not shape:
            return None
        if name in FRAME_ARRAYS:  # a compact batch's frames: its own length, recorded per part
            continue
        if n >= 0 and shape[0] != n:
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
    Each array's bytes are the parts' bytes end to end; meta lists whose rows are whose (and, for
    compact batches, whose frames: a seventh entry per part, ``{frames array: its length}``).
    Raises WireError when the parts' layouts differ or the header would exceed the limit."""
    if not parts:
        raise WireError("shape", "a bundle needs at least one batch")
    first = parts[0][0]["arrays"]
    total = sum(n for _, _, n in parts)
    layout = [(name, dtype, shape[1:]) for name, dtype, shape in first]
    for header, _, _ in parts[1:]:
        if [(name, dtype, shape[1:]) for name, dtype, shape in header["arrays"]] != layout:
            raise WireError("schema", f"batch from {header['sender']!r} has another array layout than "
                                      f"{parts[0][0]['sender']!r}'s: they cannot share a bundle")
    side = [name for name, _, _ in first if name in FRAME_ARRAYS]  # leading lengths of their own, per part
    lengths = [{name: shape[0] for name, _, shape in h["arrays"] if name in FRAME_ARRAYS} for h, _, _ in parts]
    entries = [[name, dtype, [sum(p[name] for p in lengths) if name in side else total, *shape[1:]]]
               for name, dtype, shape in first]
    meta = {"parts": [[h["sender"], h["inc"], h["seq"], h["ver"], n, h["meta"], *([own] if side else [])]
                      for (h, _, n), own in zip(parts, lengths, strict=True)]}
    data = json.dumps({"p": PROTOCOL_NAME, "v": PROTOCOL_VERSION, "kind": BUNDLE, "sender": sender,
                       "inc": incarnation, "seq": seq, "ver": NO_VERSION, "arrays": entries, "meta": meta},
                      separators=(",", ":")).encode("utf-8")
    if len(data) > limits.max_header_bytes:
        raise WireError("size", f"bundle header is {len(data)} bytes, limit {limits.max_header_bytes}")
    return [packed_frame(data, [[views[j] for _, views, _ in parts] for j in range(1, len(entries) + 1)])]


def unbundle(msg: Message, rows: int | None = None) -> list[Message]:
    """The BATCH messages a BUNDLE joined, in order, their arrays views of the bundle's; WireError
    ("meta" or "shape") unless its parts are well formed and account for its rows exactly.
    ``rows``: its length, where the caller already checked it (:func:`check_batch_spec`)."""
    parts = msg.meta.get("parts") if msg.meta.keys() == {"parts"} else None
    if type(parts) is not list or not parts:
        raise WireError("meta", "a bundle's meta must be {\"parts\": [[sender, inc, seq, ver, n, meta], ...]}")
    total = check_batch(msg) if rows is None else rows
    side = {k: int(a.shape[0]) for k, a in msg.arrays.items() if k in FRAME_ARRAYS}
    if side:
        return _unbundle_compact(msg, parts, total, side)
    row_bytes = msg.nbytes // total if total else 0
    out: list[Message] = []
    lo = 0
    for i, part in enumerate(parts):
        if type(part) is not list or len(part) != 6:
            raise WireError("meta", f"bundle part {i} must be [sender, inc, seq, ver, n, meta]")
        sender, inc, seq, ver, n, meta = part
        check_ids(sender, inc, seq, ver, "meta", f"bundle part {i}: ")
        if not is_int(n) or not 0 < n <= total - lo:
            raise WireError("shape", f"bundle part {i} claims {short_repr(n)} rows; {total - lo} of {total} are left")
        if not isinstance(meta, dict):
            raise WireError("meta", f"bundle part {i}: meta must be a JSON object")
        hi = lo + n
        out.append(Message(BATCH, sender, inc, seq, ver, {k: a[lo:hi] for k, a in msg.arrays.items()}, meta,
                           n * row_bytes))
        lo = hi
    if lo != total:
        raise WireError("shape", f"bundle parts hold {lo} rows, its arrays {total}")
    return out


def _unbundle_compact(msg: Message, parts: list[Any], total: int, side: dict[str, int]) -> list[Message]:
    """:func:`unbundle` of compact batches: each part also names its share of the frames arrays
    (``side``: their leading lengths), ``[sender, inc, seq, ver, n, meta, {name: length}]``."""
    out: list[Message] = []
    lo = 0
    starts = dict.fromkeys(side, 0)
    for i, part in enumerate(parts):
        if type(part) is not list or len(part) != 7:
            raise WireError("meta", f"bundle part {i} must be [sender, inc, seq, ver, n, meta, {{frames: length}}]")
        sender, inc, seq, ver, n, meta, own = part
        check_ids(sender, inc, seq, ver, "meta", f"bundle part {i}: ")
        if not is_int(n) or not 0 < n <= total - lo:
            raise WireError("shape", f"bundle part {i} claims {short_repr(n)} rows; {total - lo} of {total} are left")
        if not isinstance(meta, dict):
            raise WireError("meta", f"bundle part {i}: meta must be a JSON object")
        if type(own) is not dict or own.keys() != side.keys():
            raise WireError("meta", f"bundle part {i} must give its length of each of {sorted(side)}")
        spans = {}
        for name, length in own.items():
            if not is_int(length) or not 0 <= length <= side[name] - starts[name]:
                raise WireError("shape", f"bundle part {i} claims {short_repr(length)} of {name!r}; "
                                         f"{side[name] - starts[name]} of {side[name]} are left")
            spans[name] = (starts[name], starts[name] + length)
            starts[name] += length
        hi = lo + n
        arrays = {k: a[slice(*spans[k])] if k in spans else a[lo:hi] for k, a in msg.arrays.items()}
        out.append(Message(BATCH, sender, inc, seq, ver, arrays, meta, sum(a.nbytes for a in arrays.values())))
        lo = hi
    if lo != total or starts != side:
        raise WireError("shape", f"bundle parts hold {lo} rows and {starts} frames, its arrays {total} and {side}")
    return out


_HOLE = "\x00hole\x00"  # stands for a value filled in per message while a header template is made
_HOLE_JSON = json.dumps(_HOLE)


def _meta_json(meta: object, max_depth: int) -> str | None:
    """``meta`` as the compact JSON :func:`encode` puts in a header, or None where only ``encode`` can say.

    None for anything but a dict of JSON values (numpy scalars, for instance, which ``encode``
    converts) and for JSON with more than ``max_depth`` brackets, an upper bound of its nesting depth.
    """
    if not isinstance(meta, dict):
        return None
    try:
        text = json.dumps(meta, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        return None
    return text if text.count("{") + text.count("[") <= max_depth else None


class BatchEncoder:
    """The frames :func:`~zmqrl.wire.codec.encode` makes for one sender's BATCH messages, for less work.

    Batches from one sender differ only in ``seq``, ``ver``, the arrays' leading lengths and
    ``meta``, yet ``encode`` builds, validates and serialises the whole header each time, which
    costs an actor several percent of its steps. The first batch of each array layout (names,
    dtypes, trailing shapes) goes through ``encode`` with every check; its header then becomes a
    template, kept only if it reproduces that header byte for byte (so a change to the codec's
    header format makes this fall back to ``encode``; it never diverges from it). Later batches
    fill in the holes after the checks that concern those values: ints in range, sizes within
    ``limits``, and meta of plain JSON values, clearly within ``MAX_META_DEPTH`` (any other meta,
    e.g. with numpy scalars, goes through ``encode``). Buffers are views of the arrays, as with
    ``encode``: do not modify an array until its message is sent.

    A batch whose arrays hold fewer than ``pack_below`` bytes leaves as one packed frame
    (:func:`~zmqrl.wire.codec.pack`, a copy): for small batches every frame costs the receiver
    more than copying it would (CartPole's 3 KB batch: 5.5 us to receive as one frame, 12.4 us
    as seven).
    """

    def __init__(self, sender: str, incarnation: str, limits: Limits = DEFAULT_LIMITS, pack_below: int = 0) -> None:
        self.sender, self.incarnation, self.limits = sender, incarnation, limits
        self.pack_below = pack_below
        self._templates: dict[tuple[Any, ...], list[str] | None] = {}  # None: this layout always via encode
        self.fast = 0  # batches encoded from a template

    def encode(self, seq: int, version: int, arrays: Mapping[str, np.ndarray],
               meta: Mapping[str, Any]) -> list[bytes | memoryview]:
        """Frames of one BATCH: what ``encode`` returns, or that packed into one frame when small."""
        frames = self._frames(seq, version, arrays, meta)
        if self.pack_below and len(frames) > 1 and sum(memoryview(f).nbytes for f in frames[1:]) < self.pack_below:
            return [pack(frames)]
        return frames

    def _frames(self, seq: int, version: int, arrays: Mapping[str, np.ndarray],
                meta: Mapping[str, Any]) -> list[bytes | memoryview]:
        """Frames ``[header, buffer...]`` of one BATCH, equal to what ``encode`` returns."""
        values = [np.asarray(a) for a in arrays.values()]
        if not values or any(a.ndim == 0 or not a.flags.c_contiguous for a in values):
            return self._encode(seq, version, arrays, meta)
        layout = (*arrays, *((a.dtype, a.shape[1:]) for a in values))
        known = layout in self._templates
        template = self._templates.get(layout)
        meta_json = _meta_json(meta, MAX_META_DEPTH) if template is not None or not known else None
        lengths = [len(a) for a in values]
        if template is None or meta_json is None:
            frames = self._encode(seq, version, arrays, meta)
            if not known and meta_json is not None:
                self._templates[layout] = self._template(list(arrays), values, seq, version, lengths, meta_json,
                                                         bytes(frames[0]))
            return frames
        if not (type(seq) is int and 0 <= seq <= MAX_INT and type(version) is int
                and NO_VERSION <= version <= MAX_INT):
            raise WireError("header", f"seq must be an int in 0..2**63-1 and ver in -1..2**63-1, "
                                      f"got {seq!r} and {version!r}")
        if sum(a.nbytes for a in values) > self.limits.max_message_bytes:
            raise WireError("size", f"payload exceeds max_message_bytes={self.limits.max_message_bytes}")
        header = _fill(template, seq, version, lengths, meta_json)
        if len(header) > self.limits.max_header_bytes:
            raise WireError("size", f"header is {len(header)} bytes, limit {self.limits.max_header_bytes}")
        self.fast += 1
        return [header, *(a.reshape(-1).view(np.uint8).data for a in values)]

    def _encode(self, seq: int, version: int, arrays: Mapping[str, np.ndarray],
                meta: Mapping[str, Any]) -> list[bytes | memoryview]:
        return encode(BATCH, sender=self.sender, incarnation=self.incarnation, seq=seq, version=version,
                      arrays=arrays, meta=meta, limits=self.limits)

    def _template(self, names: list[str], values: list[np.ndarray], seq: int, version: int, lengths: list[int],
                  meta_json: str, expected: bytes) -> list[str] | None:
        """The header split around its holes (seq, ver, leading lengths, meta) if it reproduces ``expected``."""
        reference = json.loads(expected)
        entries = [[name, a.dtype.str, [_HOLE, *a.shape[1:]]] for name, a in zip(names, values, strict=True)]
        header = {"p": reference.get("p"), "v": reference.get("v"), "kind": BATCH, "sender": self.sender,
                  "inc": self.incarnation, "seq": _HOLE, "ver": _HOLE, "arrays": entries, "meta": _HOLE}
        parts = json.dumps(header, separators=(",", ":")).split(_HOLE_JSON)
        if len(parts) != len(entries) + 4 or _fill(parts, seq, version, lengths, meta_json) != expected:
            return None
        return parts


def _fill(parts: list[str], seq: int, version: int, lengths: list[int], meta_json: str) -> bytes:
    """A header template with its holes filled: seq, ver, one leading length per array, meta."""
    out = [parts[0], str(seq), parts[1], str(version), parts[2]]
    for length, part in zip(lengths, parts[3:-1], strict=True):
        out += (str(length), part)
    out += (meta_json, parts[-1])
    return "".join(out).encode("utf-8")
