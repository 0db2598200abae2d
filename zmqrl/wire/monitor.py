"""Link monitoring: log when a connection cannot be made, when it drops and when it comes back.

ZeroMQ connects in the background: ``connect`` returns at once, and the name lookup and the TCP
connect happen in its I/O thread, retried forever without a word. :class:`LinkMonitor` turns the
socket's monitor events into log lines an operator can act on and counters for the run summary:

* a link not up within ``GRACE_S`` of its connect: why, from the events of the attempts so far
  ("cannot resolve host 'nohost' ...", "nothing answers at tcp://10.0.0.1:5557 ..."), with where
  the address came from (:func:`note_origin`); repeated every ``REPEAT_S`` while it lasts;
* a link lost and restored ("link to learner tcp://10.0.0.1:5556 lost", "... restored after 10.2 s");
  on links with heartbeats ZeroMQ drops a silent peer after ``HEARTBEAT_TIMEOUT``;
* handshakes that fail (CURVE keys, not a ZeroMQ peer), counted each and logged a few times a minute
  however many come (:class:`~zmqrl.wire.tracking.RateLimitedLog`, saying how many it left out).

Make the socket with ``make_socket(..., watch=True)``: its monitor then starts before it connects, so
the first attempt's events are seen (a connect nobody answers may make no other for minutes).

A monitor is a queue of about 2,000 events that ZeroMQ's one I/O thread waits on when it is full, and
with it every link of the process: a few thousand connections coming and going on a bound port fill
it in seconds. So no role loop reads them: one daemon thread per process (:class:`_LinkThread`) reads
every LinkMonitor's events as they come and says when a link is not up in time, whatever the role is
doing (blocked on a send, in a long update, importing torch). Each monitor socket is used by that
thread alone, from :class:`LinkMonitor`'s construction until :meth:`LinkMonitor.close`, which hands
the closing to it. Close a LinkMonitor before its context: a context terminated first gets its
monitor sockets closed by the thread too, but one destroyed (``Context.destroy``) would close them
under it.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time
import weakref
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from .lookup import Lookup, host_port, is_ip, new_lookup
from .tracking import RateLimitedLog

log = logging.getLogger("zmqrl")

GRACE_S = 0.5  # a connect not up after this long is reported (roles started together find each other sooner)
REPEAT_S = 10.0  # while a link stays down, the report repeats this often

HANDSHAKE_LOG_S = 30.0  # failed handshakes: at most one line per cause per link this often
_TICK_S = 0.1  # while a link is not up, the link thread looks at the clock this often (is its report due?)
_BURST = 512  # events read from one monitor before the others get a turn
_CLOSE_WAIT_S = 5.0  # LinkMonitor.close waits this long for the link thread to close the monitor
_LAST_READS = 64  # bursts read at most when a LinkMonitor closes

_UP = zmq.EVENT_HANDSHAKE_SUCCEEDED
_DOWN = zmq.EVENT_DISCONNECTED
_FAILED = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
# A connection closed or timed out before its handshake was done (a port probe, bytes that are not ZMTP).
_ABORTED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
# A TCP connect was tried, so the name resolved (CLOSED: a connect refused at once, or refused later).
_ATTEMPT = zmq.EVENT_CONNECT_DELAYED | zmq.EVENT_CONNECTED | zmq.EVENT_CLOSED
# MONITOR_STOPPED: the watched socket is closed, so is the monitor (a LinkMonitor left open lets go).
_WATCHED = _UP | _DOWN | _FAILED | _ABORTED | _ATTEMPT | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_MONITOR_STOPPED

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


class LinkMonitor:
    """Watches one socket; ``name`` says whose link it is (e.g. "actor-0") and ``address`` what it is
    (e.g. "to learner models tcp://10.0.0.1:5556").

    A socket that connects must be made with ``make_socket(..., watch=True)``: events from before its
    monitor started are gone, the first connect attempt's among them, and that may be the only one.
    (Connecting again once the monitor listens is no way out: libzmq 4.3 can leave the first
    connection up beside the new one, and a subscriber then receives every model twice.)

    Its events are read by the process's link thread from construction on: the counters and
    :attr:`down` are kept up to date without any call. :meth:`close` it before closing the socket's
    context.
    """

    def __init__(self, sock: zmq.Socket, name: str, address: str) -> None:
        self.name, self.address = name, address
        last = _text(sock.getsockopt(zmq.LAST_ENDPOINT))
        if last and sock not in _WATCHED_FROM_START:
            raise ValueError(f"{name}: the socket for the link {address} is bound or connected already and was "
                             "not made with make_socket(..., watch=True): its first events are lost")
        self._mon = sock.get_monitor_socket(_WATCHED)  # from now on used by the link thread only
        self.retry_s = int(sock.getsockopt(zmq.RECONNECT_IVL_MAX) or sock.getsockopt(zmq.RECONNECT_IVL)) / 1000
        self._lock = threading.Lock()  # the link thread updates what role loops read
        self._closed = threading.Event()  # set once the monitor socket is closed
        self.up = 0
        self.drops = 0
        self.auth_failures = 0  # handshakes refused: CURVE keys (ZAP)
        self.protocol_failures = 0  # handshakes failed: not ZMTP, another mechanism, plaintext to CURVE
        self.aborted_handshakes = 0  # connections closed or timed out before a handshake (port probes)
        self.connect_failures = 0
        self.peers = 0
        self._unshaken = 0  # connections whose handshake failed, their DISCONNECTED event still to come
        self._handshake_log = RateLimitedLog(log, interval=HANDSHAKE_LOG_S)
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
        self._lookup: Lookup | None = None
        if last in _ORIGINS:  # it connects to an address from a flag or config
            self._endpoint = last
            self._lookup = new_lookup(last)  # look its host up now, in the background
        _links().add(self)

    # --- in the link thread -----------------------------------------------------------------------
    def _read(self) -> bool:
        """Handle up to ``_BURST`` pending events; False once the monitor has stopped (its socket closed
        or its context terminated): the thread then closes the monitor socket."""
        for _ in range(_BURST):
            try:
                event = recv_monitor_message(self._mon, zmq.NOBLOCK)
            except zmq.Again:
                return True
            except zmq.ZMQError as exc:
                if exc.errno in (zmq.ETERM, zmq.ENOTSOCK):
                    return False
                raise
            if event["event"] == zmq.EVENT_MONITOR_STOPPED:
                return False
            with self._lock:
                self._handle(event)
        return True

    def _tick(self, now: float) -> None:
        """Report a link that is not up in time."""
        if self.peers == 0 and self._endpoint and now >= self._report_at:
            with self._lock:
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
        elif kind & (_FAILED | _ABORTED):
            self._handshake_failed(kind)
        elif kind == _DOWN and self._connected_since is not None:
            self._connected_since = None  # a connection without a handshake ended: no link was up to lose
            self._unshaken = max(0, self._unshaken - 1)
        elif kind == _DOWN and self._unshaken:
            self._unshaken -= 1  # the end of a connection whose handshake failed: no link was up either
        elif kind == _DOWN:
            self.drops += 1
            self.peers = max(0, self.peers - 1)
            if self.peers == 0 and self._down_since is None:
                self._down_since = self._waiting_since = now
                self._failures_before = self.connect_failures
                self._report_at = now + REPEAT_S  # the loss is logged now; why it stays down, later
                log.warning("%s: link %s lost (peer gone or silent past the heartbeat timeout); "
                            "reconnecting", self.name, self.address)

    def _handshake_failed(self, kind: int) -> None:
        """Count a failed handshake; log it, at most once per cause every ``HANDSHAKE_LOG_S``. libzmq
        reports each such connection's end (DISCONNECTED) right after: that is no lost link."""
        self._unshaken += 1
        if kind == _ABORTED:  # a plain TCP connect and close: a port probe, a health check
            self.aborted_handshakes += 1
            return
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            self.auth_failures += 1
            cause, count = "authentication", self.auth_failures
        else:
            self.protocol_failures += 1
            cause, count = "protocol", self.protocol_failures
        self._handshake_log.warn(cause, f"{self.name}: a connection on the link {self.address} failed the {cause} "
                                        f"handshake ({count} so far)")

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
            self._failure = "refused" if self._attempt or is_ip(host_port(self._endpoint)[0]) else "unresolved"
            if self._failure == "unresolved" and self._lookup is None:
                self._lookup = new_lookup(self._endpoint)
        self._attempt = 0

    def _report_waiting(self, now: float) -> None:
        """Say why the link is not up (when the attempts so far tell), and when it will say it again."""
        endpoint, origin, lookup = self._endpoint, _ORIGINS.get(self._endpoint), self._lookup
        host = host_port(endpoint)[0]
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
                self._lookup = new_lookup(endpoint)  # a fresh answer for the next line (DNS may come up)
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
        with self._lock:
            return {"drops": self.drops, "connects": self.up, "auth_failures": self.auth_failures,
                    "protocol_failures": self.protocol_failures, "aborted_handshakes": self.aborted_handshakes,
                    "connect_failures": self.connect_failures,
                    "longest_outage_s": round(self.longest_outage_s, 3), "down": self.down}

    def close(self) -> None:
        """Stop watching: the link thread reads the events still queued and closes the monitor socket.
        Call it before the socket's context is closed; a second call does nothing."""
        if self._closed.is_set():
            return
        if not _links().remove(self, _CLOSE_WAIT_S):
            log.error("%s: the link thread did not let go of the monitor of %s within %.0fs", self.name,
                      self.address, _CLOSE_WAIT_S)
            return
        with self._lock:
            for cause, count in (("authentication", self.auth_failures), ("protocol", self.protocol_failures)):
                left_out = self._handshake_log.suppressed(cause)
                if left_out:
                    log.warning("%s: %d more connections on the link %s failed the %s handshake since the last "
                                "line (%d in all)", self.name, left_out, self.address, cause, count)

    def _release(self) -> None:
        """Close the monitor socket (by the thread that uses it) and say so."""
        self._mon.close(linger=0)
        self._closed.set()


class _LinkThread:
    """The daemon thread that reads every LinkMonitor's events in this process as they come.

    LinkMonitors are handed to it (:meth:`add`) and back (:meth:`remove`) through lists under a lock,
    with a byte on a socket pair to wake it; from ``add`` until it closes the monitor socket, the thread
    alone uses that socket. It also closes the monitor of a socket that was closed (MONITOR_STOPPED) or
    whose context is terminating (ETERM), so a context never waits on it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._adds: list[LinkMonitor] = []
        self._removes: list[LinkMonitor] = []
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._errors = RateLimitedLog(log, interval=60.0)

    def add(self, link: LinkMonitor) -> None:
        with self._lock:
            self._adds.append(link)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="zmqrl-links", daemon=True)
                self._thread.start()
        self._wake()

    def remove(self, link: LinkMonitor, timeout: float) -> bool:
        """Have the thread close ``link``'s monitor; False if it has not within ``timeout`` seconds."""
        with self._lock:
            if link in self._adds:  # not taken up yet: still this thread's to close
                self._adds.remove(link)
                link._release()
                return True
            self._removes.append(link)
        self._wake()
        return link._closed.wait(timeout)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # its buffer is full: the thread is woken already

    def _run(self) -> None:
        links: dict[zmq.Socket, LinkMonitor] = {}
        poller = zmq.Poller()
        poller.register(self._wake_r.fileno(), zmq.POLLIN)
        while True:
            try:
                self._changes(links, poller)
                ready = self._wait(links, poller)
                for sock in ready:
                    link = links.get(sock)
                    if link is not None and not link._read():
                        self._drop(links, poller, link)
                now = time.monotonic()
                for link in links.values():
                    link._tick(now)
            except Exception as exc:  # the thread must go on, whatever one event did
                self._errors.warn(type(exc).__name__, f"link thread: {exc!r}")
                time.sleep(_TICK_S)  # (not a spin, should it recur)

    def _changes(self, links: dict[zmq.Socket, LinkMonitor], poller: zmq.Poller) -> None:
        """Take up the LinkMonitors added, and close the monitors of those removed (after a last read)."""
        with self._lock:
            adds, removes, self._adds, self._removes = self._adds, self._removes, [], []
        for link in adds:
            links[link._mon] = link
            poller.register(link._mon, zmq.POLLIN)
        for link in removes:
            if link._mon in links:
                try:  # what came before the close (a flood going on is not waited out)
                    for _ in range(_LAST_READS):
                        if not (link._read() and link._mon.poll(0)):
                            break
                except zmq.ZMQError:
                    pass
                self._drop(links, poller, link)
            else:  # (its monitor closed already, or its context went)
                link._closed.set()

    def _wait(self, links: dict[zmq.Socket, LinkMonitor], poller: zmq.Poller) -> list[Any]:
        """The monitor sockets with events; while a link is not up, waiting at most ``_TICK_S`` (its report
        may be due), else until an event comes."""
        waiting = any(link.peers == 0 and link._endpoint for link in links.values())
        try:
            ready = poller.poll(int(_TICK_S * 1000) if waiting else None)
        except zmq.ZMQError as exc:
            if exc.errno not in (zmq.ETERM, zmq.ENOTSOCK, errno.EINTR):
                raise
            for sock, link in list(links.items()):  # close the monitors of contexts that are terminating
                if sock.closed:
                    self._drop(links, poller, link)
                    continue
                try:
                    sock.getsockopt(zmq.EVENTS)
                except zmq.ZMQError:
                    self._drop(links, poller, link)
            return []
        found = []
        for sock, _ in ready:
            if sock == self._wake_r.fileno():
                try:
                    while self._wake_r.recv(4096):
                        pass
                except (BlockingIOError, OSError):
                    pass
            else:
                found.append(sock)
        return found

    @staticmethod
    def _drop(links: dict[zmq.Socket, LinkMonitor], poller: zmq.Poller, link: LinkMonitor) -> None:
        links.pop(link._mon, None)
        try:
            poller.unregister(link._mon)
        except KeyError:
            pass
        link._release()


_LINKS: _LinkThread | None = None
_LINKS_LOCK = threading.Lock()


def _links() -> _LinkThread:
    """This process's link thread (a fresh one in a forked child: the parent's is not there)."""
    global _LINKS
    with _LINKS_LOCK:
        if _LINKS is None:
            _LINKS = _LinkThread()
        return _LINKS


def _forget_links() -> None:
    global _LINKS, _LINKS_LOCK
    _LINKS, _LINKS_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_links)


def _endpoint(event: Any) -> str:
    return _text(event.get("endpoint", b""))


def _text(raw: object) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
