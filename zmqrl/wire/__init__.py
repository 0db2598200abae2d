"""Wire layer: message format, codec, socket helpers and sequence/version tracking.

Depends on pyzmq, numpy and the standard library only.  Nothing received from
the network is ever unpickled.
"""

from .codec import (
    check_batch,
    decode,
    encode,
    encode_batch,
    encode_eval,
    encode_model,
    encode_stats,
    peek_header,
)
from .protocol import (
    ALLOWED_DTYPES,
    BATCH,
    DEFAULT_COPY_THRESHOLD,
    DEFAULT_LIMITS,
    EVAL,
    HELLO,
    KINDS,
    MODEL,
    NO_VERSION,
    PROTOCOL_NAME,
    PROTOCOL_VERSION,
    REASONS,
    STATS,
    Limits,
    Message,
    WireError,
)
from .sockets import (
    SocketOptions,
    SocketSetupError,
    bound_address,
    drain_latest_model,
    make_socket,
    new_incarnation,
    recv_message,
    send_frames,
)
from .tracking import RateLimitedLog, SequenceTracker, VersionTracker

__all__ = [
    "ALLOWED_DTYPES",
    "BATCH",
    "DEFAULT_COPY_THRESHOLD",
    "DEFAULT_LIMITS",
    "EVAL",
    "HELLO",
    "KINDS",
    "MODEL",
    "NO_VERSION",
    "PROTOCOL_NAME",
    "PROTOCOL_VERSION",
    "REASONS",
    "STATS",
    "Limits",
    "Message",
    "RateLimitedLog",
    "SequenceTracker",
    "SocketOptions",
    "SocketSetupError",
    "VersionTracker",
    "WireError",
    "bound_address",
    "check_batch",
    "decode",
    "drain_latest_model",
    "encode",
    "encode_batch",
    "encode_eval",
    "encode_model",
    "encode_stats",
    "make_socket",
    "new_incarnation",
    "peek_header",
    "recv_message",
    "send_frames",
]
