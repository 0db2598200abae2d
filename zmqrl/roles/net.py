"""A role's ZeroMQ setup from config: receive limits, socket options and security, one context per process,
and sending with back-pressure."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from typing import Any

import zmq

from zmqrl.config import ConfigError, NetConfig
from zmqrl.wire import Limits, SecureContext, Security, SecurityError, SocketOptions, send_frames

log = logging.getLogger("zmqrl")

PROXY_QUEUE = 64  # batches (or bundles) a proxy queues towards the learner before it stops reading


def limits(net: NetConfig, *kinds: str) -> Limits:
    """Receive limits for the kinds a socket may carry."""
    return Limits.only(kinds, max_message_bytes=int(net.max_message_mb * 2**20))


def options(net: NetConfig, base: SocketOptions, data_path: bool = False) -> SocketOptions:
    """Apply the config's heartbeat settings to a socket preset.

    ``data_path`` sockets (the back-pressured PUSH/PULL batch links) get no ZMTP heartbeats:
    a receiver that stops reading to push back also stops reading heartbeats, the peer's
    heartbeat timeout then drops the connection and the batches queued on it. Those links
    queue across reconnects instead (IMMEDIATE off) and rely on TCP keepalive; dead peers
    are still noticed in seconds on the model and evaluation links, which never push back.

    The config's security (``net.security``) is carried along: see :func:`security_from_net`.
    """
    security = security_from_net(net)
    if data_path:
        return replace(base, heartbeat_ivl_ms=0, heartbeat_timeout_ms=0, heartbeat_ttl_ms=0, immediate=False,
                       tcp_keepalive_s=net.data_keepalive_s, security=security)
    return replace(base, heartbeat_ivl_ms=net.heartbeat_ms, heartbeat_timeout_ms=net.heartbeat_timeout_ms,
                   heartbeat_ttl_ms=net.heartbeat_timeout_ms, security=security)


def security_from_net(net: NetConfig) -> Security | None:
    """The process's CURVE keys for ``net`` (None when ``net.security`` is none), read from disk once.

    Raises :class:`ConfigError` naming the missing or bad key file and the ``net.*`` setting.
    """
    if net.security == "none":
        return None
    if net.security != "curve":
        raise ConfigError(f"net.security must be one of none, curve, got {net.security!r}")
    return _load_curve(net.keys_dir, net.server_key, net.client_key, net.allowed_clients_dir)


@lru_cache(maxsize=8)
def _load_curve(keys_dir: str, server_key: str, client_key: str, allowed_clients_dir: str) -> Security:
    try:
        return Security.curve(keys_dir, server_key, client_key, allowed_clients_dir, label="net.")
    except SecurityError as exc:
        raise ConfigError(f"net.security=curve: {exc}") from None


def new_context(net: NetConfig | None = None) -> zmq.Context:
    """One context per process (never shared across fork).

    With ``net.security: curve`` the keys are loaded now (a bad key setup fails here, before any
    socket) and the context is a :class:`SecureContext`: the first socket that binds starts its ZAP
    authenticator, and ``ctx.term()`` stops it first, so closing never hangs on it.
    """
    security = security_from_net(net) if net is not None else None
    if security is None:
        return zmq.Context(io_threads=1)
    return SecureContext.create(security, io_threads=1)


def auth_counts(ctx: zmq.Context) -> dict[str, int]:
    """CURVE handshakes admitted and refused by ``ctx``'s servers (empty without security)."""
    return ctx.auth_counts() if isinstance(ctx, SecureContext) else {}


def send_blocking(sock: zmq.Socket, frames: list[Any], stop: Any, on_block: Callable[[], object],
                  while_blocked: Callable[[], object]) -> tuple[int | None, float]:
    """Send with back-pressure: wait while the peer is not taking messages, never past ``stop.set``.

    ``on_block`` runs once when the wait starts (log it), ``while_blocked`` every 100 ms of
    waiting (keep other sockets read). Returns (bytes sent or None if stopped, seconds blocked).
    """
    blocked_since = None
    while True:
        try:
            sent = send_frames(sock, frames, flags=zmq.NOBLOCK)
            break
        except zmq.Again:
            if blocked_since is None:
                blocked_since = time.monotonic()
                on_block()
            if stop.set:
                return None, time.monotonic() - blocked_since
            sock.poll(100, zmq.POLLOUT)
            while_blocked()
    return sent, (time.monotonic() - blocked_since if blocked_since is not None else 0.0)
