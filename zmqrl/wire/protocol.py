"""Wire protocol constants, limits and the decoded message type.

A message is a ZeroMQ multipart message ``[header, buffer0, buffer1, ...]``:

* ``header`` is a UTF-8 JSON object::

      {"p": "zmqrl", "v": 1, "kind": str, "sender": str, "inc": str,
       "seq": int, "ver": int, "arrays": [[name, dtype, [shape...]], ...],
       "meta": {...}}

* each following frame holds the raw C-contiguous bytes of one array, in the
  order of ``arrays``.

A message may also travel as one packed frame (magic, header length, header, arrays at 8-byte
offsets): small batches, and everything on the learner's stream, whose two topics are the
packed frame's first bytes: :data:`MODEL_TOPIC` (versioned parameters, sent with each new
version, to new subscribers and every ``net.republish_s``) and :data:`CONTROL_TOPIC` (a few
hundred bytes: the rate limiter's pause, allowance and grant, the start-up quota, ``done``).

A role that holds no model, or one older than control names, asks the stream's snapshot ROUTER
for it with a SNAPSHOT request (no arrays; ``meta["have"]`` the ``[incarnation, version]`` it
holds): the reply is the newest control and model as packed frames, to that role alone (the
ZeroMQ guide's Clone pattern), so a joiner never makes the publisher broadcast.

A BUNDLE is a proxy's join of several actors' BATCH messages of one array layout: each array
is theirs end to end, and ``meta`` is ``{"parts": [[sender, inc, seq, ver, n, meta], ...]}``,
one entry per batch in order (its header's fields and its ``n`` rows), which the learner splits
back into those batches (:func:`~zmqrl.wire.batches.unbundle`). A batch may carry its image
frames once (:mod:`~zmqrl.wire.compact`): a ``frames`` array (or ``frames_lz4`` / ``frames_zstd``)
whose leading length is its frame count, not its row count; a bundle's part then has a seventh
entry, ``{array name: length}``, saying how many of those leading entries are its own.

Nothing in this package ever unpickles data: arrays are rebuilt with
``numpy.frombuffer`` from an allow-list of plain little-endian numeric dtypes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PROTOCOL_NAME = "zmqrl"
PROTOCOL_VERSION = 2  # 2: control apart from models, topics on the learner's stream
SUPPORTED_VERSIONS: frozenset[int] = frozenset({PROTOCOL_VERSION})

# Message kinds.
BATCH = "batch"  # actor -> learner: transitions; meta["episodes"] holds episode stats
MODEL = "model"  # learner -> actors: named parameter arrays; ``version`` is the model version
STATS = "stats"  # any role: counters in meta, no arrays
EVAL = "eval"  # evaluator report: meta {"version", "returns", "lengths"}
HELLO = "hello"  # a peer announcing itself (role info in meta), no arrays
BUNDLE = "bundle"  # proxy -> learner: several actors' batches joined; meta["parts"] says whose rows are whose
CONTROL = "control"  # learner -> every role: pause, allowance, grant, quota, done (meta), no arrays
SNAPSHOT = "snapshot"  # a role -> its stream's snapshot ROUTER: send me the newest control and model (meta "have")
KINDS: frozenset[str] = frozenset({BATCH, MODEL, STATS, EVAL, HELLO, BUNDLE, CONTROL, SNAPSHOT})

# The learner's stream (its XPUB) carries two topics, each message one packed frame whose first bytes
# are its topic: a subscriber takes models, control or both, and each can be conflated on its own.
PACK_MAGIC = b"ZQP1"  # first bytes of a packed single-frame message (a JSON header starts with "{")
MODEL_TOPIC = b"ZQMD"  # a packed MODEL on the learner's stream
CONTROL_TOPIC = b"zqct"  # a packed CONTROL on the learner's stream
# What a model subscriber subscribes to: this version's models and packed frames of any other (the
# first version's models were plain packed frames), whose header then names their protocol version;
# never control. The topics stay the same from version to version for that reason.
MODEL_SUBSCRIPTION = b"ZQ"
TOPIC_KINDS = {MODEL_TOPIC: MODEL, CONTROL_TOPIC: CONTROL}  # what a topic's messages must be
PACKED_MAGICS = (PACK_MAGIC, MODEL_TOPIC, CONTROL_TOPIC)

# Allowed array dtypes, as ``numpy.dtype.str`` (little-endian or byte-order free).
ALLOWED_DTYPES: frozenset[str] = frozenset(
    np.dtype(name).newbyteorder("<").str
    for name in (
        "bool",
        "uint8",
        "int8",
        "int16",
        "uint16",
        "int32",
        "int64",
        "float16",
        "float32",
        "float64",
    )
)

NO_VERSION = -1  # ``version`` of messages that do not refer to a model
MAX_NAME_CHARS = 128  # array names
MAX_SENDER_CHARS = 256
MAX_INCARNATION_CHARS = 64
MAX_NDIM = 32
MAX_META_DEPTH = 16  # nesting depth of containers inside ``meta``
MAX_INT = 2**63 - 1  # seq / version must fit in an int64

DEFAULT_MAX_FRAMES = 64
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
DEFAULT_COPY_THRESHOLD = 64 * 1024  # frames at least this large are sent zero-copy

# Short codes carried by ``WireError.reason``.
REASONS: frozenset[str] = frozenset(
    {"frames", "header", "protocol", "version", "kind", "dtype", "shape", "size", "meta", "schema", "compact",
     "compress"}
)


class WireError(ValueError):
    """Invalid message (received or about to be sent).

    The only exception type the decoders raise for bad input.  ``reason`` is a
    short code from :data:`REASONS`:

    ``frames``   wrong number of frames or a frame that is not a byte buffer
    ``header``   header is not UTF-8 JSON or has missing/extra/mistyped fields
    ``protocol`` protocol name is not ``"zmqrl"``
    ``version``  unknown protocol version
    ``kind``     unknown or not allowed message kind
    ``dtype``    dtype not on the allow-list
    ``shape``    bad shape, or batch arrays with unequal leading lengths
    ``size``     a frame length that does not match its array, or a size limit
    ``meta``     meta is not a (shallow enough) JSON object
    ``schema``   a well-formed batch whose fields, dtypes or item shapes are not this run's
    ``compact``  a batch of frames sent once (:mod:`~zmqrl.wire.compact`) whose frames or indices
                 do not fit the run's images or each other
    ``compress`` compressed frames that do not decompress to exactly the size announced
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


@dataclass(frozen=True)
class Limits:
    """Bounds enforced when decoding (and encoding) messages."""

    max_frames: int = DEFAULT_MAX_FRAMES
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # total array payload
    allowed_kinds: frozenset[str] | None = None  # None: every kind in KINDS

    def __post_init__(self) -> None:
        if self.max_frames < 1:
            raise ValueError("max_frames must be >= 1")
        if self.max_header_bytes < 64:
            raise ValueError("max_header_bytes must be >= 64")
        if self.max_message_bytes < 0:
            raise ValueError("max_message_bytes must be >= 0")
        if self.allowed_kinds is not None:
            kinds = frozenset(self.allowed_kinds)
            unknown = kinds - KINDS
            if unknown:
                raise ValueError(f"unknown kinds in allowed_kinds: {sorted(unknown)}")
            object.__setattr__(self, "allowed_kinds", kinds)

    @classmethod
    def only(cls, kinds: Iterable[str], **kwargs: Any) -> Limits:
        """Limits that accept just ``kinds``."""
        return cls(allowed_kinds=frozenset(kinds), **kwargs)

    def allows(self, kind: str) -> bool:
        """Whether ``kind`` is known and allowed."""
        return kind in KINDS and (self.allowed_kinds is None or kind in self.allowed_kinds)


DEFAULT_LIMITS = Limits()


@dataclass
class Message:
    """A decoded message.

    ``arrays`` are read-only views of the received frames (no copy): call
    ``np.array(a)`` / ``a.copy()`` if you need to write to them or keep them
    after the frames are released.
    """

    kind: str
    sender: str
    incarnation: str
    seq: int
    version: int = NO_VERSION
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    nbytes: int = 0  # total array payload bytes
