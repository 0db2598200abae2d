"""ZeroMQ socket setup, sending and receiving of wire messages.

Choices other code relies on:

* Every option is set explicitly before bind/connect (see :class:`SocketOptions`).
* Heartbeats and back-pressure do not mix: a receiver that stops reading to push
  back stops reading heartbeats too, and the sender's heartbeat timeout then drops
  the connection with what was queued on it. Links that push back should turn
  heartbeats off and use ``tcp_keepalive_s`` with ``immediate=False``.
* PUSH sockets (:meth:`SocketOptions.push`) use ``IMMEDIATE=1``: messages are
  only queued to peers whose connection is up, so a sender never round-robins
  batches into the queue of a dead or not-yet-connected peer; when no peer is
  up a blocking send waits (up to ``sndtimeo_ms``) and a ``NOBLOCK`` send
  raises ``zmq.Again`` -- count it as dropped and keep going.  Their linger is
  1000 ms so a clean shutdown can flush a little; other sockets use 0.
* Receiving sockets set ``MAXMSGSIZE`` from :class:`Limits`: libzmq disconnects
  a peer that sends a larger frame, before anything reaches Python.
* Frames of at least ``copy_threshold`` bytes (64 KiB) are sent zero-copy: do
  not modify an array after passing it to ``send_frames``.
* With ``SocketOptions.security`` set (see :mod:`zmqrl.wire.security`), a socket
  that binds is a CURVE server and one that connects a CURVE client.  Server
  sockets need a :class:`~zmqrl.wire.security.SecureContext`, which runs the
  ZAP authenticator that checks client keys against the allow-list.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import zmq

from .codec import Frame, decode
from .monitor import watch_from_start
from .protocol import (
    CONTROL,
    CONTROL_TOPIC,
    DEFAULT_COPY_THRESHOLD,
    DEFAULT_LIMITS,
    MODEL,
    MODEL_SUBSCRIPTION,
    Limits,
    Message,
    WireError,
)
from .security import SecureContext, Security, SecurityError, apply_curve
from .tracking import VersionTracker


class SocketSetupError(RuntimeError):
    """A socket could not be bound or connected; the message names the address."""

    @property
    def address_in_use(self) -> bool:
        """True when a bind failed because another socket holds the address (a launcher may retry)."""
        cause = self.__cause__
        return isinstance(cause, zmq.ZMQError) and cause.errno == zmq.EADDRINUSE


def new_incarnation() -> str:
    """A random incarnation id (16 hex chars), chosen once per process start."""
    return secrets.token_hex(8)


@dataclass(frozen=True)
class SocketOptions:
    """Options applied by :func:`make_socket`.  Times in ms; HWMs in messages."""

    linger_ms: int = 0
    sndhwm: int = 100
    rcvhwm: int = 100
    heartbeat_ivl_ms: int = 1000
    heartbeat_timeout_ms: int = 3000
    heartbeat_ttl_ms: int = 3000
    reconnect_ivl_ms: int = 100
    reconnect_ivl_max_ms: int = 500  # peers started before the learner find it within half a second
    maxmsgsize: int = -1  # bytes per frame; -1: no limit
    rcvtimeo_ms: int = -1  # -1: block forever
    sndtimeo_ms: int = -1
    immediate: bool = False  # queue only to completed connections (connect side)
    conflate: bool = False  # SUB: keep only the newest single-frame message (models)
    tcp_keepalive_s: int = 0  # >0: kernel keepalive drops a dead peer after about this many seconds
    subscribe: tuple[bytes, ...] = (b"",)  # SUB sockets only: topic prefixes
    security: Security | None = None  # CURVE keys; None: plaintext, no authentication

    @staticmethod
    def receive_limit(limits: Limits) -> int:
        """MAXMSGSIZE that admits every frame valid under ``limits``."""
        return max(limits.max_message_bytes, limits.max_header_bytes)

    @classmethod
    def push(cls, **overrides: Any) -> SocketOptions:
        """Actor -> proxy (or proxy -> learner) sender: IMMEDIATE, linger 1000 ms."""
        return replace(cls(linger_ms=1000, immediate=True, sndhwm=16), **overrides)

    @classmethod
    def pull(cls, limits: Limits = DEFAULT_LIMITS, **overrides: Any) -> SocketOptions:
        """Batch receiver: MAXMSGSIZE from ``limits``."""
        return replace(cls(rcvhwm=16, maxmsgsize=cls.receive_limit(limits)), **overrides)

    @classmethod
    def pub(cls, **overrides: Any) -> SocketOptions:
        """Model publisher: small HWM (only the newest models matter)."""
        return replace(cls(sndhwm=4), **overrides)

    @classmethod
    def sub(cls, limits: Limits = DEFAULT_LIMITS, **overrides: Any) -> SocketOptions:
        """Subscriber to one topic of the learner's stream: CONFLATE (only the newest packed message is
        kept), MAXMSGSIZE from ``limits``; every topic unless ``subscribe`` is given.

        With CONFLATE the receive queue never fills, so a subscriber busy for a long time (an
        evaluator mid-episode, an actor blocked on send) never stalls its connection.
        """
        return replace(cls(rcvhwm=4, conflate=True, maxmsgsize=cls.receive_limit(limits)), **overrides)

    @classmethod
    def models(cls, limits: Limits = DEFAULT_LIMITS, **overrides: Any) -> SocketOptions:
        """Model subscriber (conflated), to :data:`~zmqrl.wire.protocol.MODEL_SUBSCRIPTION`: models of
        this protocol version and packed frames of others, so a learner of another version is named as
        one. One subscription per conflated socket: libzmq conflates the subscriptions it sends upstream
        too, so only the last of several would reach the publisher."""
        return cls.sub(limits, **{"subscribe": (MODEL_SUBSCRIPTION,), **overrides})

    @classmethod
    def snapshots(cls, limits: Limits = DEFAULT_LIMITS, **overrides: Any) -> SocketOptions:
        """A role's DEALER to its stream's snapshot ROUTER: a request or two queued, a reply or two
        kept (each may hold a model), MAXMSGSIZE from ``limits``."""
        return replace(cls(sndhwm=2, rcvhwm=2, maxmsgsize=cls.receive_limit(limits)), **overrides)

    @classmethod
    def snapshot_server(cls, **overrides: Any) -> SocketOptions:
        """A stream's snapshot ROUTER: requests are one small frame each; replies a few per peer."""
        return replace(cls(sndhwm=4, rcvhwm=256, maxmsgsize=4096), **overrides)

    @classmethod
    def control(cls, limits: Limits = DEFAULT_LIMITS, **overrides: Any) -> SocketOptions:
        """Control subscriber (conflated: each control message says the whole state)."""
        return cls.sub(limits, **{"subscribe": (CONTROL_TOPIC,), **overrides})


def _socket_name(kind: int) -> str:
    try:
        return zmq.SocketType(kind).name
    except ValueError:
        return str(kind)


def make_socket(
    ctx: zmq.Context,
    kind: int,
    opts: SocketOptions = SocketOptions(),
    *,
    bind: str | None = None,
    connect: str | None = None,
    watch: bool = False,
) -> zmq.Socket:
    """Create a socket of ``kind`` with all ``opts`` set, then bind and/or connect it.

    ``watch``: start its monitor first, for the :class:`~zmqrl.wire.monitor.LinkMonitor` made next.

    Raises :class:`SocketSetupError` naming the address if bind/connect fails
    (address in use, malformed address...).  Bind to ``tcp://127.0.0.1:*`` (or
    port 0) for a random port and read it back with :func:`bound_address`.

    With ``opts.security`` a binding socket is a CURVE server (``ctx`` must be a
    :class:`SecureContext`; its authenticator starts here) and a connecting one
    a CURVE client; it must do exactly one of the two.
    """
    security = opts.security
    if security is not None:
        if (bind is None) == (connect is None):
            raise SocketSetupError(f"a CURVE {_socket_name(kind)} socket either binds (server) or connects "
                                   f"(client), exactly one of them: bind={bind!r}, connect={connect!r}")
        if bind is not None:
            if not isinstance(ctx, SecureContext):
                raise SocketSetupError(f"cannot bind CURVE {_socket_name(kind)} socket to {bind!r}: its context "
                                       "runs no ZAP authenticator (make it with SecureContext.create)")
            why = security.missing_server_secret()
            if why:
                raise SocketSetupError(f"cannot bind CURVE {_socket_name(kind)} socket to {bind!r}: {why}")
            try:
                ctx.ensure_authenticator(security)
            except SecurityError as exc:
                raise SocketSetupError(f"cannot bind CURVE {_socket_name(kind)} socket to {bind!r}: {exc}") from exc
    sock = ctx.socket(kind)
    try:
        sock.setsockopt(zmq.LINGER, opts.linger_ms)
        sock.setsockopt(zmq.SNDHWM, opts.sndhwm)
        sock.setsockopt(zmq.RCVHWM, opts.rcvhwm)
        sock.setsockopt(zmq.HEARTBEAT_IVL, opts.heartbeat_ivl_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, opts.heartbeat_timeout_ms)
        sock.setsockopt(zmq.HEARTBEAT_TTL, opts.heartbeat_ttl_ms)
        sock.setsockopt(zmq.RECONNECT_IVL, opts.reconnect_ivl_ms)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, opts.reconnect_ivl_max_ms)
        sock.setsockopt(zmq.MAXMSGSIZE, opts.maxmsgsize)
        sock.setsockopt(zmq.RCVTIMEO, opts.rcvtimeo_ms)
        sock.setsockopt(zmq.SNDTIMEO, opts.sndtimeo_ms)
        sock.setsockopt(zmq.IMMEDIATE, int(opts.immediate))
        if opts.conflate:
            sock.setsockopt(zmq.CONFLATE, 1)
        if opts.tcp_keepalive_s > 0:  # half the time idle, then 5 probes over the other half
            sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
            sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, max(1, opts.tcp_keepalive_s // 2))
            sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, max(1, opts.tcp_keepalive_s // 10))
            sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, 5)
        if any(addr is not None and "://[" in addr for addr in (bind, connect)):
            sock.setsockopt(zmq.IPV6, 1)  # a bracketed IPv6 host: libzmq speaks IPv4 only without it
        if kind == zmq.SUB:
            for topic in opts.subscribe:
                sock.setsockopt(zmq.SUBSCRIBE, topic)
        if security is not None:
            apply_curve(sock, security, server=bind is not None)
    except BaseException:
        sock.close(linger=0)
        raise
    if watch:
        watch_from_start(sock)
    action, address = "bind", bind
    try:
        if bind is not None:
            sock.bind(bind)
        if connect is not None:
            action, address = "connect", connect
            sock.connect(connect)
    except zmq.ZMQError as exc:
        if watch:
            sock.get_monitor_socket().close(linger=0)
        sock.close(linger=0)
        raise SocketSetupError(f"cannot {action} {_socket_name(kind)} socket to {address!r}: {exc}") from exc
    return sock


_WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]"}


def bound_address(sock: zmq.Socket, *, loopback_for_wildcard: bool = True) -> str:
    """The endpoint ``sock`` was last bound to, e.g. ``tcp://127.0.0.1:45123``.

    A wildcard host (``0.0.0.0`` / ``[::]``) is replaced by loopback so the
    result can be connected to from this machine, unless told otherwise.
    """
    endpoint = sock.getsockopt(zmq.LAST_ENDPOINT)
    address = endpoint.decode() if isinstance(endpoint, bytes) else str(endpoint)
    if not address:
        raise SocketSetupError("socket has not been bound")
    if loopback_for_wildcard and address.startswith("tcp://"):
        host, sep, port = address[len("tcp://") :].rpartition(":")
        if sep and host in _WILDCARD_HOSTS:
            address = f"tcp://{_WILDCARD_HOSTS[host]}:{port}"
    return address


_SNDMORE = int(zmq.SNDMORE)


def send_frames(
    sock: zmq.Socket,
    frames: Sequence[Frame],
    *,
    copy_threshold: int = DEFAULT_COPY_THRESHOLD,
    flags: int = 0,
) -> int:
    """Send ``frames`` as one multipart message; return the number of bytes sent.

    Frames of at least ``copy_threshold`` bytes go zero-copy (``copy=False``).
    With ``flags=zmq.NOBLOCK`` this raises ``zmq.Again`` (sending nothing)
    when the message cannot be queued.
    """
    if not frames:
        raise ValueError("send_frames needs at least one frame")
    total = 0
    flags = int(flags)  # plain ints: IntFlag arithmetic costs more than the send itself for small frames
    more = flags | _SNDMORE
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        size = len(frame.buffer) if isinstance(frame, zmq.Frame) else memoryview(frame).nbytes
        sock.send(frame, more if i < last else flags, copy=size < copy_threshold)
        total += size
    return total


class BoundedReader:
    """Reads whole messages from one socket without blocking, keeping at most ``max_frames`` frames of each.

    libzmq hands a multipart message over whole, whatever its frame count, and ``recv_multipart``
    builds one Python object per frame before anything can check it: one message of four million
    two-byte frames took a receiver from 243 to 703 MB (libzmq itself holds ~250 MB of it until it
    is read). This reads frame by frame and drops the frames of a message past ``max_frames`` as
    they are read, at most :attr:`DROP_PER_CALL` per call (the rest at the next calls: a few us
    each), so such a message costs the receiver no memory of its own and CPU only in slices.

    With ``copy`` False frames are ``zmq.Frame`` objects (whose ``User-Id`` property carries a
    CURVE peer's key); with ``copy`` True, ``bytes``.
    """

    DROP_PER_CALL = 1 << 14

    def __init__(self, sock: zmq.Socket, max_frames: int, copy: bool = False) -> None:
        self.sock, self.max_frames, self.copy = sock, max_frames, copy
        self.oversized = 0  # messages dropped for holding more than max_frames frames
        self._dropping = False  # the rest of an oversized message is still to be read and dropped

    def read(self) -> list[Any] | None:
        """The next whole message's frames, or None when none is ready (or an oversized one is
        still being dropped). Raises WireError("frames") once for each oversized message."""
        if self._dropping and not self._drop_rest():
            return None
        try:
            frames = [self.sock.recv(zmq.NOBLOCK, copy=self.copy)]
        except zmq.Again:
            return None
        while self.sock.get(zmq.RCVMORE):
            if len(frames) >= self.max_frames:
                self.oversized += 1
                self._dropping = True
                self._drop_rest()
                raise WireError("frames", f"a message of more than {self.max_frames} frames (dropped unread)")
            frames.append(self.sock.recv(copy=self.copy))
        return frames

    def _drop_rest(self) -> bool:
        """Read and drop up to DROP_PER_CALL more frames of an oversized message; True once it is gone."""
        for _ in range(self.DROP_PER_CALL):
            if not self.sock.get(zmq.RCVMORE):
                self._dropping = False
                return True
            self.sock.recv(zmq.NOBLOCK)
        return False


def peer_key(frames: Sequence[Any]) -> bytes | None:
    """The CURVE public key (z85) of the peer that sent ``frames`` (received with ``copy=False``), or
    None without CURVE (or for frames received as bytes)."""
    first = frames[0] if frames else None
    if not isinstance(first, zmq.Frame):
        return None
    try:
        user = first.get("User-Id")
    except zmq.ZMQError:
        return None
    return user.encode() if isinstance(user, str) and user else None


def _drain(sock: zmq.Socket, kind: str, limits: Limits, max_messages: int,
           on_error: Callable[[WireError], None] | None) -> tuple[list[tuple[Message, Any]], int]:
    """Every queued message of ``kind`` (at most ``max_messages`` read, without blocking), in arrival
    order, each with its first frame as received (a packed message's only one), and how many were bad
    (undecodable, or of another kind); ``on_error`` sees each decode error."""
    out: list[tuple[Message, Any]] = []
    bad = 0
    if not sock.poll(0, zmq.POLLIN):  # the common case, without raising zmq.Again
        return out, 0
    for _ in range(max_messages):
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            break
        try:
            msg = decode(frames, limits)
        except WireError as exc:
            bad += 1
            if on_error is not None:
                on_error(exc)
            continue
        if msg.kind != kind:
            bad += 1
            continue
        out.append((msg, frames[0]))
    return out, bad


def drain_latest_model(
    sock: zmq.Socket,
    tracker: VersionTracker,
    limits: Limits = DEFAULT_LIMITS,
    *,
    max_messages: int = 10_000,
    observe: Callable[[Message], None] | None = None,
    on_error: Callable[[WireError], None] | None = None,
) -> tuple[Message | None, int]:
    """Read every queued message without blocking; keep the newest acceptable model.

    Each MODEL message is offered to ``tracker`` in arrival order, so the
    result is the last one it accepted (None if none).  Messages that fail to
    decode or are not MODEL count as bad.  Returns ``(message, bad_count)``.
    Reads at most ``max_messages`` so a flood cannot stall the caller.
    ``observe`` sees every decoded MODEL message, accepted or not;
    ``on_error`` sees why each undecodable message was refused.
    """
    heard, bad = drain_latest_model_frame(sock, tracker, limits, max_messages=max_messages, observe=observe,
                                          on_error=on_error)
    return (None if heard is None else heard[0]), bad


def drain_latest_model_frame(
    sock: zmq.Socket,
    tracker: VersionTracker,
    limits: Limits = DEFAULT_LIMITS,
    *,
    max_messages: int = 10_000,
    observe: Callable[[Message], None] | None = None,
    on_error: Callable[[WireError], None] | None = None,
) -> tuple[tuple[Message, Any] | None, int]:
    """:func:`drain_latest_model`, the model with its packed frame as received (a relay passes it on)."""
    latest: tuple[Message, Any] | None = None
    models, bad = _drain(sock, MODEL, limits, max_messages, on_error)
    for msg, frame in models:
        if observe is not None:
            observe(msg)
        if tracker.offer(msg.incarnation, msg.version):
            latest = (msg, frame)
    return latest, bad


def drain_control(
    sock: zmq.Socket,
    limits: Limits = DEFAULT_LIMITS,
    *,
    max_messages: int = 1000,
    on_error: Callable[[WireError], None] | None = None,
) -> tuple[list[Message], int]:
    """Read every queued CONTROL message without blocking (with CONFLATE: the newest one); returns
    them in arrival order and how many messages were bad (undecodable or not CONTROL)."""
    heard, bad = drain_control_frames(sock, limits, max_messages=max_messages, on_error=on_error)
    return [msg for msg, _ in heard], bad


def drain_control_frames(
    sock: zmq.Socket,
    limits: Limits = DEFAULT_LIMITS,
    *,
    max_messages: int = 1000,
    on_error: Callable[[WireError], None] | None = None,
) -> tuple[list[tuple[Message, Any]], int]:
    """:func:`drain_control`, each message with its packed frame as received."""
    return _drain(sock, CONTROL, limits, max_messages, on_error)
