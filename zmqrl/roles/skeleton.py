"""What every role process is made of, so that a role's main file reads as a recipe.

:class:`RoleProcess` owns one ZeroMQ context (never shared, never forked), the sockets the role
makes through :meth:`RoleProcess.socket` (each with the peer it watches, if any, and the linger it
may flush for at close), the link monitors of those, the role's name, incarnation and rate-limited
log, and the close order: its stats file (``RUN_DIR/roles/NAME.json``), the link monitors, the
sockets in the order made, the context. :func:`serve` runs a role under the stop flag and closes
it however its loop ends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import zmq

from zmqrl.config import Config
from zmqrl.roles.net import new_context
from zmqrl.run.lifecycle import StopFlag
from zmqrl.run.rundir import write_role_stats
from zmqrl.wire import RateLimitedLog, SocketOptions, bound_address, make_socket, new_incarnation
from zmqrl.wire.monitor import LinkMonitor

log = logging.getLogger("zmqrl")


class RoleProcess:
    """One role process's context, sockets, link monitors and close order (module docstring)."""

    def __init__(self, cfg: Config, name: str, run_dir: str | Path | None = None) -> None:
        self.cfg, self.name, self.run_dir = cfg, name, run_dir
        self.incarnation = new_incarnation()  # a random id of this process's start: its sequences are new
        self.ctx = new_context(cfg.net)
        self.links: list[LinkMonitor] = []
        self.ratelog = RateLimitedLog(log, interval=10.0)
        self._sockets: list[tuple[zmq.Socket, int]] = []  # (socket, linger ms at close), in the order made

    def socket(self, kind: int, opts: SocketOptions, *, bind: str | None = None, connect: str | None = None,
               link: str | None = None, linger_ms: int = 0) -> zmq.Socket:
        """A socket of ``kind`` with ``opts``, bound or connected. ``link`` says what its peer is ("to learner
        models {address}", the address filled in: a bound one as bound) and has a :class:`LinkMonitor`
        watch it; ``linger_ms`` is how long the socket may go on sending at close (0 drops what is queued)."""
        sock = make_socket(self.ctx, kind, opts, bind=bind, connect=connect, watch=link is not None)
        self._sockets.append((sock, linger_ms))
        if link is not None:
            address = bound_address(sock) if bind is not None else str(connect)
            self.links.append(LinkMonitor(sock, self.name, link.format(address=address)))
        return sock

    def set_linger(self, sock: zmq.Socket, linger_ms: int) -> None:
        """Change how long ``sock`` may flush at close (e.g. to let a last message leave)."""
        self._sockets = [(s, linger_ms if s is sock else ms) for s, ms in self._sockets]

    def role_stats(self) -> dict[str, Any] | None:
        """What goes into ``RUN_DIR/roles/NAME.json`` at close (None: no file)."""
        return None

    def close(self) -> None:
        """Write the stats file, stop the link monitors, close the sockets in the order made (each with
        its linger) and end the context. Calling it again does nothing."""
        if self.ctx.closed:
            return
        try:
            stats = self.role_stats()
            if stats is not None:
                write_role_stats(self.run_dir, self.name, {**stats, "links": [link.stats() for link in self.links]})
        finally:
            for link in self.links:
                link.close()
            for sock, linger_ms in self._sockets:
                sock.close(linger=linger_ms)
            self.ctx.term()


class Runnable(Protocol):
    def run(self, stop: StopFlag) -> Any: ...

    def close(self) -> None: ...


R = TypeVar("R", bound=Runnable)


def serve(make: Callable[[], R]) -> R:
    """Make a role (under the stop flag, so a signal while it starts stops it at its first step), run it
    until it ends or is stopped, and close it however that happens; returns the role."""
    with StopFlag() as stop:
        role = make()
        try:
            role.run(stop)
        finally:
            role.close()
    return role
