"""Link monitoring: log when a connection cannot be made, when it drops and when it comes back.

ZeroMQ connects in the background: ``connect`` returns at once, and the name lookup and the TCP
connect happen in its I/O thread, retried forever without a word. :class:`LinkMonitor` turns the
socket's monitor events into log lines an operator can act on and counters for the run summary:

* a link not up within ``GRACE_S`` of its connect: why, from the events of the attempts so far
  ("cannot resolve host 'nohost' ...", "nothing answers at tcp://10.0.0.1:5557 ..."), with where
  the address came from (:func:`note_origin`); repeated every ``REPEAT_S`` while it lasts;
* a link lost and restored ("link to learner tcp://10.0.0.1:5556 lost", "... restored after 10.2 s");
  on links with heartbeats ZeroMQ drops a silent peer after ``HEARTBEAT_TIMEOUT``;
* handshakes that fail (CURVE keys, not a ZeroMQ peer).

Make the socket with ``make_socket(..., watch=True)``: its monitor then starts before it connects, so
the first attempt's events are seen (a connect nobody answers may make no other for minutes).

Call :meth:`LinkMonitor.poll` from the socket's owning loop, a few times a second (and at least every
few minutes: ZeroMQ's I/O thread waits when a monitor's queue is full).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
import weakref
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

log = logging.getLogger("zmqrl")

GRACE_S = 0.5  # a connect not up after this long is reported (roles started together find each other sooner)
REPEAT_S = 10.0  # while a link stays down, the report repeats this often

_UP = zmq.EVENT_HANDSHAKE_SUCCEEDED
_DOWN = zmq.EVENT_DISCONNECTED
_FAILED = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
# A TCP connect was tried, so the name resolved (CLOSED: a connect refused at once, or refused later).
_ATTEMPT = zmq.EVENT_CONNECT_DELAYED | zmq.EVENT_CONNECTED | zmq.EVENT_CLOSED
# Three events per connect attempt while a peer is away, six a second at most: a monitor is a queue
# that ZeroMQ's I/O thread blocks on when full (about 2000 events), so poll at least every few minutes.
_WATCHED = _UP | _DOWN | _FAILED | _ATTEMPT | zmq.EVENT_CONNECT_RETRIED

_ORIGINS: dict[str, str] = {}
_WATCHED_FROM_START: weakref.WeakSet[zmq.Socket] = weakref.WeakSet()


def watch_from_start(sock: zmq.Socket) -> None:
    """Start ``sock``'s monitor now, before it binds or connects (``make_socket(..., watch=True)`` does):
    the :class:`LinkMonitor` made for it later reads every event from the first."""
    sock.get_monitor_socket(_WATCHED)  # pyzmq keeps it and gives the same one to LinkMonitor
    _WATCHED_FROM_START.add(sock)


def note_origin(address: str, origin: str) -> None:
    """Remember where a connect address came from (a flag, config keys), for the lines about its link."""
    _ORIGINS[address] = origin


class _Lookup:
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


def _new_lookup(address: str) -> _Lookup | None:
    """A lookup of ``address``'s host in the background; None for an IP address (nothing to look up)."""
    host, port = _host_port(address)
    return None if _is_ip(host) else _Lookup(host, port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def _host_port(address: str) -> tuple[str, str]:
    """('host', 'port') of ``tcp://host:port`` (brackets kept around an IPv6 host)."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    return host, port


class LinkMonitor:
    """Watches one socket; ``name`` says whose link it is (e.g. "actor-0") and ``address`` what it is
    (e.g. "to learner models tcp://10.0.0.1:5556").

    A socket that connects must be made with ``make_socket(..., watch=True)``: events from before its
    monitor started are gone, the first connect attempt's among them, and that may be the only one.
    (Connecting again once the monitor listens is no way out: libzmq 4.3 can leave the first
    connection up beside the new one, and a subscriber then receives every model twice.)
    """

    def __init__(self, sock: zmq.Socket, name: str, address: str) -> None:
        self.name, self.address = name, address
        last = _text(sock.getsockopt(zmq.LAST_ENDPOINT))
        if last and sock not in _WATCHED_FROM_START:
            raise ValueError(f"{name}: the socket for the link {address} is bound or connected already and was "
                             "not made with make_socket(..., watch=True): its first events are lost")
        self._mon = sock.get_monitor_socket(_WATCHED)
        self.retry_s = int(sock.getsockopt(zmq.RECONNECT_IVL_MAX) or sock.getsockopt(zmq.RECONNECT_IVL)) / 1000
        self.up = 0
        self.drops = 0
        self.auth_failures = 0
        self.connect_failures = 0
        self.peers = 0
        self._down_since: float | None = None
        self.longest_outage_s = 0.0
        # Connecting: the endpoint (from the events), what the current attempt got to, why the last failed.
        self._endpoint = ""
        self._attempt = 0  # events of the current attempt (_ATTEMPT bits); none before a retry: no TCP connect
        self._pending_since: float | None = None  # a TCP connect without an answer yet, since then
        self._connected_since: float | None = None  # TCP connected, no ZeroMQ handshake yet, since then
        self._failure: str | None = None  # "unresolved" or "refused": how the last attempt ended
        self._waiting_since = time.monotonic()  # not up since then (before the first connection, or lost)
        self._failures_before = 0  # connect_failures when the wait began
        self._report_at = self._waiting_since + GRACE_S
        self._reported = False  # a waiting line went out since the link was last up
        self._lookup: _Lookup | None = None
        if last in _ORIGINS:  # it connects to an address from a flag or config
            self._endpoint = last
            self._lookup = _new_lookup(last)  # look its host up now, in the background

    def poll(self) -> None:
        """Handle every pending event without blocking; report a link that is not up in time."""
        while self._mon.poll(0):
            try:
                event = recv_monitor_message(self._mon, zmq.NOBLOCK)
            except (zmq.Again, zmq.ZMQError):
                break
            self._handle(event)
        if self.peers == 0 and self._endpoint:
            now = time.monotonic()
            if now >= self._report_at:
                self._report_waiting(now)

    def _handle(self, event: Any) -> None:
        kind = event["event"]
        now = time.monotonic()
        if kind & (_ATTEMPT | zmq.EVENT_CONNECT_RETRIED):
            self._attempt_event(kind, event, now)
        elif kind == _UP:
            self.up += 1
            self.peers += 1
            waited = now - self._waiting_since
            if self._down_since is not None:
                outage = now - self._down_since
                self.longest_outage_s = max(self.longest_outage_s, outage)
                log.warning("%s: link %s restored after %.1fs", self.name, self.address, outage)
                self._down_since = None
            elif self.up == 1 and self._reported:
                log.warning("%s: link %s up after %.1fs", self.name, self.address, waited)
            elif self.up == 1:
                log.info("%s: link %s up", self.name, self.address)
            self._reported, self._failure, self._lookup, self._connected_since = False, None, None, None
        elif kind == _DOWN and self._connected_since is not None:
            self._connected_since = None  # a connection without a handshake ended: no link was up to lose
        elif kind == _DOWN:
            self.drops += 1
            self.peers = max(0, self.peers - 1)
            if self.peers == 0 and self._down_since is None:
                self._down_since = self._waiting_since = now
                self._failures_before = self.connect_failures
                self._report_at = now + REPEAT_S  # the loss is logged now; why it stays down, later
                log.warning("%s: link %s lost (peer gone or silent past the heartbeat timeout); "
                            "reconnecting", self.name, self.address)
        else:
            self.auth_failures += 1
            log.warning("%s: a peer on %s failed the %s handshake", self.name, self.address,
                        "authentication" if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH else "protocol")

    def _attempt_event(self, kind: int, event: Any, now: float) -> None:
        """The events of connecting: each attempt ends in a retry, which tells how far it got."""
        if kind != zmq.EVENT_CLOSED:  # (a bound socket says CLOSED too, when its listener closes)
            self._endpoint = self._endpoint or _endpoint(event)
        if kind == zmq.EVENT_CONNECT_DELAYED:
            self._pending_since = now
        elif kind == zmq.EVENT_CONNECTED:
            self._pending_since, self._connected_since = None, now
        if kind != zmq.EVENT_CONNECT_RETRIED:
            self._attempt |= kind
            return
        self._pending_since = self._connected_since = None
        if self._attempt & zmq.EVENT_CONNECTED:
            self._failure = None  # it was connected: the loss is _DOWN's to log
        else:
            self.connect_failures += 1
            # Without any TCP connect in the attempt, libzmq could not look the host up.
            self._failure = "refused" if self._attempt or _is_ip(_host_port(self._endpoint)[0]) else "unresolved"
            if self._failure == "unresolved" and self._lookup is None:
                self._lookup = _new_lookup(self._endpoint)
        self._attempt = 0

    def _report_waiting(self, now: float) -> None:
        """Say why the link is not up (when the attempts so far tell), and when it will say it again."""
        endpoint, origin, lookup = self._endpoint, _ORIGINS.get(self._endpoint), self._lookup
        host = _host_port(endpoint)[0]
        peer = self.address.replace(endpoint, "").replace("  ", " ").strip() if endpoint in self.address \
            else self.address
        whose = f" for the link {peer}" + (f" ({origin})" if origin else "")
        failed = self.connect_failures - self._failures_before
        again = f" (not up for {now - self._waiting_since:.0f}s, {failed} failed attempts)" \
            if self._reported or self._down_since is not None else ""
        if self._connected_since is not None and now - self._connected_since >= GRACE_S:
            why = (f"{endpoint} accepts the TCP connection but no ZeroMQ handshake follows "
                   f"({now - self._connected_since:.1f}s; is a zmqrl role listening there?)")
            log.warning("%s: %s%s; still waiting%s", self.name, why, whose, again)
        elif self._pending_since is not None and now - self._pending_since >= GRACE_S:
            why = f"nothing answers at {endpoint} (no reply to the TCP connect for {now - self._pending_since:.1f}s)"
            log.warning("%s: %s%s; still waiting%s", self.name, why, whose, again)
        elif self._failure == "refused":
            why = f"nothing answers at {endpoint} (connection refused or unreachable)"
            log.warning("%s: %s%s; still trying every %gs%s", self.name, why, whose, self.retry_s, again)
        elif self._failure == "unresolved" or lookup is not None and lookup.error:
            reason = f" ({lookup.error})" if lookup is not None and lookup.error else ""
            log.warning("%s: cannot resolve host %r%s for the link %s%s; still trying every %gs%s", self.name,
                        host, reason, self.address, f" ({origin})" if origin else "", self.retry_s, again)
            if lookup is not None and lookup.done:
                self._lookup = _new_lookup(endpoint)  # a fresh answer for the next line (DNS may come up)
        elif lookup is not None and not lookup.done and now - lookup.started >= GRACE_S:
            log.warning("%s: still looking up host %r for the link %s%s (no answer from the resolver for "
                        "%.1fs)%s", self.name, host, self.address, f" ({origin})" if origin else "",
                        now - lookup.started, again)
        else:
            return  # no attempt has failed yet: look again at the next poll
        self._reported = True
        self._report_at = now + REPEAT_S

    @property
    def down(self) -> bool:
        """True while the link is lost (after it was up once)."""
        return self._down_since is not None

    def stats(self) -> dict[str, Any]:
        return {"drops": self.drops, "connects": self.up, "auth_failures": self.auth_failures,
                "connect_failures": self.connect_failures, "longest_outage_s": round(self.longest_outage_s, 3),
                "down": self.down}

    def close(self) -> None:
        self._mon.close(linger=0)


def _endpoint(event: Any) -> str:
    return _text(event.get("endpoint", b""))


def _text(raw: object) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
