"""Link monitoring: log when a connection drops and when it comes back.

ZeroMQ reconnects on its own and, on links with heartbeats, drops a silent peer after
``HEARTBEAT_TIMEOUT``. :class:`LinkMonitor` turns the socket's monitor events into log lines an
operator can act on ("link to learner tcp://10.0.0.1:5556 lost", "... restored after 10.2 s")
and counters for the run summary. Call :meth:`LinkMonitor.poll` from the socket's owning loop.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

log = logging.getLogger("zmqrl")

_UP = zmq.EVENT_HANDSHAKE_SUCCEEDED
_DOWN = zmq.EVENT_DISCONNECTED
_WATCHED = _UP | _DOWN | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL


class LinkMonitor:
    """Watches one socket; ``name`` says what the link is (e.g. "actor-0 → learner models")."""

    def __init__(self, sock: zmq.Socket, name: str, address: str) -> None:
        self.name, self.address = name, address
        self._mon = sock.get_monitor_socket(_WATCHED)
        self.up = 0
        self.drops = 0
        self.auth_failures = 0
        self.peers = 0
        self._down_since: float | None = None
        self.longest_outage_s = 0.0

    def poll(self) -> None:
        """Handle every pending event without blocking."""
        while self._mon.poll(0):
            try:
                event = recv_monitor_message(self._mon, zmq.NOBLOCK)
            except (zmq.Again, zmq.ZMQError):
                return
            self._handle(event)

    def _handle(self, event: Any) -> None:
        kind = event["event"]
        now = time.monotonic()
        if kind == _UP:
            self.up += 1
            self.peers += 1
            if self._down_since is not None:
                outage = now - self._down_since
                self.longest_outage_s = max(self.longest_outage_s, outage)
                log.warning("%s: link %s restored after %.1fs", self.name, self.address, outage)
                self._down_since = None
            elif self.up == 1:
                log.info("%s: link %s up", self.name, self.address)
        elif kind == _DOWN:
            self.drops += 1
            self.peers = max(0, self.peers - 1)
            if self.peers == 0 and self._down_since is None:
                self._down_since = now
                log.warning("%s: link %s lost (peer gone or silent past the heartbeat timeout); "
                            "reconnecting", self.name, self.address)
        else:
            self.auth_failures += 1
            log.warning("%s: a peer on %s failed the %s handshake", self.name, self.address,
                        "authentication" if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH else "protocol")

    @property
    def down(self) -> bool:
        """True while the link is lost (after it was up once)."""
        return self._down_since is not None

    def stats(self) -> dict[str, Any]:
        return {"drops": self.drops, "connects": self.up, "auth_failures": self.auth_failures,
                "longest_outage_s": round(self.longest_outage_s, 3), "down": self.down}

    def close(self) -> None:
        self._mon.close(linger=0)
