"""What every role shares: addresses, limits, socket options and security from config, role stats files."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import random
import re
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import zmq

from zmqrl.config import ConfigError, NetConfig
from zmqrl.run.rundir import write_json_atomic
from zmqrl.wire import Limits, SecureContext, Security, SecurityError, SocketOptions, send_frames
from zmqrl.wire.monitor import note_origin

log = logging.getLogger("zmqrl")

EXIT_ADDRESS_IN_USE = 98  # a role's bind found its address taken (EADDRINUSE); `zmqrl local` retries


SCHEMES = ("tcp",)  # transports an address may name: roles talk across hosts, so TCP only
ANY_HOSTS = ("*", "0.0.0.0", "[::]")  # "every interface": only a bind can use these
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")  # RFC 1123, plus '_' as DNS allows
_IPV4_LIKE = re.compile(r"[0-9.]+")


def endpoint(addr: str | None, default_host: str, default_port: int, what: str, *, bind: bool = False,
             host_key: str = "the default host", port_key: str = "the default port") -> str:
    """A checked ZeroMQ endpoint ``tcp://HOST:PORT`` from ``tcp://HOST:PORT``, ``HOST:PORT``, ``HOST`` or
    nothing (``default_host`` and ``default_port``, the config's ``host_key`` and ``port_key``).

    ``what`` is the flag the address came from. Accepted: scheme tcp; HOST a host name (RFC 1123
    labels, '_' allowed), a dotted-quad IPv4 address or a bracketed IPv6 one (``[::1]``); PORT
    1..65535. A ``bind`` also takes ``*``, ``0.0.0.0`` or ``[::]`` (every interface) and port 0 or
    ``*`` (a free port). Anything else raises :class:`ConfigError` naming the flag (or config key)
    and the value. The origin is noted for :class:`~zmqrl.wire.monitor.LinkMonitor`'s lines.
    """
    default_port_where = f"{port_key}={default_port}"
    if not addr:
        host = _check_host(default_host, f"{host_key}={default_host!r}", bind)
        port = _check_port(str(default_port), default_port_where, bind)
        origin = f"{host_key} and {port_key}"
    else:
        text = addr.strip()
        where = f"{what} {text!r}"
        host_text, port_text = _split(text, where)
        host = _check_host(host_text, where, bind)
        if port_text is None:
            port = _check_port(str(default_port), default_port_where, bind,
                               f" ({where} names no port, so it comes from {port_key})")
            origin = f"{what}, port from {port_key}"
        else:
            port = _check_port(port_text, where, bind)
            origin = what
    address = f"tcp://{host}:{port}"
    if not bind:
        note_origin(address, origin)
    return address


def _split(text: str, where: str) -> tuple[str, str | None]:
    """(host, port or None) of ``[tcp://]HOST[:PORT]``; the scheme and the brackets are checked here."""
    rest = text
    if "://" in text:
        scheme, rest = text.split("://", 1)
        if scheme.lower() not in SCHEMES:
            raise ConfigError(f"{where}: unsupported scheme {scheme!r}; zmqrl speaks {', '.join(SCHEMES)} only "
                              "(tcp://HOST:PORT, HOST:PORT or HOST)")
    elif "/" in text:
        raise ConfigError(f"{where}: expected tcp://HOST:PORT, HOST:PORT or HOST")
    if rest.startswith("["):
        close = rest.find("]")
        if close < 0:
            raise ConfigError(f"{where}: an IPv6 address needs its closing ']', e.g. tcp://[::1]:5557")
        host, after = rest[:close + 1], rest[close + 1:]
        if after and not after.startswith(":"):
            raise ConfigError(f"{where}: unexpected {after!r} after the IPv6 address; expected :PORT")
        return host, after[1:] if after else None
    if rest.count(":") > 1:
        raise ConfigError(f"{where}: an IPv6 address goes in brackets, e.g. tcp://[::1]:5557")
    host, sep, port = rest.partition(":")
    return host, port if sep else None


def _check_host(host: str, where: str, bind: bool) -> str:
    """``host`` if it is valid for a bind (``bind``) or a connect; a ConfigError starting with ``where`` if not."""
    if not host:
        raise ConfigError(f"{where}: no host; expected tcp://HOST:PORT, e.g. tcp://127.0.0.1:5557")
    if host in ANY_HOSTS:
        if bind:
            return host
        raise ConfigError(f"{where}: {host!r} means every interface and only works for a bind; "
                              "give the peer's host name or address")
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ConfigError(f"{where}: {host} is not an IPv6 address") from None
        return host
    if _IPV4_LIKE.fullmatch(host):
        if host.isdigit():
            raise ConfigError(f"{where}: {host!r} is not a host (a port alone?); expected HOST:PORT, "
                              f"e.g. 127.0.0.1:{host}")
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ConfigError(f"{where}: {host!r} is not an IPv4 address (four numbers 0..255)") from None
        return host
    name = host[:-1] if host.endswith(".") else host  # a fully qualified name may end in a dot
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(".")):
        raise ConfigError(f"{where}: {host!r} is not a valid host name (letters, digits, '-' and '_' in "
                          "dot-separated labels of 1..63), IPv4 address or bracketed IPv6 address")
    return host


def _check_port(port: str, where: str, bind: bool, note: str = "") -> str:
    """``port`` if it is valid for a bind (0 or * pick a free one) or a connect (1..65535); ``note`` ends the error."""
    if bind and port == "*":
        return port
    if not port.isdigit() or not port.isascii():
        problem = f"port {port!r} is not a port number (1..65535)" if port else "no port after ':'"
        raise ConfigError(f"{where}: {problem}{note}")
    number = int(port)
    if number > 65535:
        raise ConfigError(f"{where}: port {number} is out of range; ports are 1..65535"
                          + (" (0 or * picks a free one)" if bind else "") + note)
    if number == 0 and not bind:
        raise ConfigError(f"{where}: port 0 only means 'pick a free port' where a role binds; "
                          "a connect needs the peer's port, 1..65535" + note)
    return str(number)


_HANDED_OUT: set[tuple[str, int]] = set()
_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_PICKED = 10000  # below this, well-known and registered services


@lru_cache(maxsize=1)
def ephemeral_ports() -> range | None:
    """The ports the kernel gives outgoing connections (Linux), or None where it does not say."""
    try:
        low, high = map(int, _EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return None
    return range(low, high + 1)


def _candidates() -> Iterator[int]:
    """Ports to ask for: random ones between 10000 and the ephemeral range where that is known and
    room enough, then (or otherwise) 0, whatever the kernel hands out."""
    ephemeral = ephemeral_ports()
    if ephemeral is not None and ephemeral.start - _LOWEST_PICKED >= 1000:
        picker = random.Random()
        for _ in range(1000):
            yield picker.randrange(_LOWEST_PICKED, ephemeral.start)
    yield from (0 for _ in range(1000))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host`` (for launchers that hand ports to children).

    Never the same port twice in one process: the kernel may give a just-closed port out again,
    and two roles told to bind one port would race for it. On Linux the port lies below the
    ephemeral range, so no outgoing connection can take it before its role binds: not another
    process's, and not a connection to it made early, which would otherwise connect to itself
    once its source port happened to equal it (TCP's self-connect), leaving the port taken.
    """
    for wanted in _candidates():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, wanted))
            except OSError:  # in use (or in TIME_WAIT) now
                continue
            port = int(s.getsockname()[1])
        if (host, port) not in _HANDED_OUT:
            _HANDED_OUT.add((host, port))
            return port
    raise OSError(f"no free TCP port on {host} that this process has not handed out already")


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


def close_context(ctx: zmq.Context) -> None:
    """Terminate ``ctx`` (its sockets must be closed), stopping a ZAP authenticator first."""
    ctx.term()


def auth_counts(ctx: zmq.Context) -> dict[str, int]:
    """CURVE handshakes admitted and refused by ``ctx``'s servers (empty without security)."""
    return ctx.auth_counts() if isinstance(ctx, SecureContext) else {}


def write_role_stats(run_dir: str | None, name: str, stats: dict[str, Any]) -> None:
    """``RUN_DIR/roles/NAME.json``: what a role did, for the launcher, tests and humans."""
    if not run_dir:
        return
    path = Path(run_dir) / "roles"
    path.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path / f"{name}.json", {"pid": os.getpid(), "time": time.time(), **stats})


def read_json(path: str | Path) -> dict[str, Any] | None:
    """A JSON file, or None while it does not exist (or is being replaced)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


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


class Every:
    """True once per ``interval_s``: for periodic work inside a loop."""

    def __init__(self, interval_s: float, now: bool = False) -> None:
        self.interval_s = interval_s
        self._next = time.monotonic() + (0.0 if now else interval_s)

    def __call__(self) -> bool:
        t = time.monotonic()
        if t >= self._next:
            self._next = t + self.interval_s
            return True
        return False
