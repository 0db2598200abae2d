"""Addresses of roles: ``tcp://HOST:PORT`` from flags and config, checked and named in errors; free ports."""

from __future__ import annotations

import ipaddress
import logging
import random
import re
import socket
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

from zmqrl.config import ConfigError
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


def same_host(address: str, port: int | str) -> str:
    """``address`` (``tcp://HOST:PORT``) with another port: a second socket of a role on the same host."""
    host = address.split("://", 1)[-1].rsplit(":", 1)[0]
    return f"tcp://{host}:{port}"


def port_of(address: str) -> int:
    """The port of ``tcp://HOST:PORT`` (0 when it names none)."""
    port = address.rsplit(":", 1)[-1]
    return int(port) if port.isdigit() else 0


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
