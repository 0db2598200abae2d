"""Name lookups for link diagnostics: a host's lookup in a daemon thread, so a slow resolver never holds a
role up, and the host and port of a ``tcp://`` address."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time


class Lookup:
    """One name lookup in a daemon thread: a slow resolver never holds the role up."""

    def __init__(self, host: str, port: str) -> None:
        self.error: str | None = None
        self.done = False
        self.started = time.monotonic()
        family = socket.AF_INET6 if host.startswith("[") else socket.AF_INET  # as libzmq looks names up
        threading.Thread(target=self._run, args=(host.strip("[]"), port, family), daemon=True,
                         name=f"lookup {host}").start()

    def _run(self, host: str, port: str, family: int) -> None:
        try:
            socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
        except OSError as exc:
            self.error = exc.strerror or str(exc)
        self.done = True


def new_lookup(address: str) -> Lookup | None:
    """A lookup of ``address``'s host in the background; None for an IP address (nothing to look up)."""
    host, port = host_port(address)
    return None if is_ip(host) else Lookup(host, port)


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def host_port(address: str) -> tuple[str, str]:
    """('host', 'port') of ``tcp://host:port`` (brackets kept around an IPv6 host)."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    return host, port
