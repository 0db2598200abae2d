"""Proxy: PULL batches from a host's actors, validate and count them, forward them to the learner.

Recipe: bind a PULL socket for actors, connect a PUSH socket to the learner (and subscribe to
its control, to hear when the run is over), then loop: receive what has arrived, check each
message's header and frame lengths (no arrays are built), count it per actor, forward it, and
hold ``net.proxy_hold_ms`` before reading again. The batches of one burst that share an array
layout go to the learner joined, up to ``net.proxy_merge`` in one BUNDLE message (their bytes
end to end, each one's header fields in its meta); a lone batch, and one of 64 KB or more (an
image batch), goes as the very frames it came in. Each message costs the learner a receive, a
header parse and checks whatever its size, so fewer, larger ones leave it more time to train.
Bad messages are dropped and counted; per-actor counters are kept for at most ``net.max_peers``
actors. When the learner is away the proxy stops reading, so actors block with bounded memory;
when the learner says it finished, the proxy forwards what actors already sent and exits 0.

With ``relay`` addresses the proxy also runs its host's relay (:mod:`~zmqrl.roles.relay`, a thread):
the learner's models and control, taken once for the host and served to its actors.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass
from typing import Any

import zmq

from zmqrl.config import Config
from zmqrl.roles.fit import learner_done
from zmqrl.roles.net import PROXY_QUEUE, auth_counts, limits, options, send_blocking
from zmqrl.roles.relay import Relay
from zmqrl.roles.skeleton import RoleProcess, serve
from zmqrl.roles.snapshots import SnapshotServer
from zmqrl.roles.stream import LearnerStream
from zmqrl.run.lifecycle import Every, StopFlag
from zmqrl.wire import (
    BATCH,
    BUNDLE_META_DEPTH,
    DEFAULT_COPY_THRESHOLD,
    HELLO,
    BoundedReader,
    KeyBinding,
    Message,
    PeerTable,
    SequenceTracker,
    SocketOptions,
    WireError,
    batch_layout,
    bound_address,
    encode_bundle,
    encode_stats,
    meta_depth_ok,
    peek,
    peer_key,
    send_frames,
)

log = logging.getLogger("zmqrl")


REPORTED_ACTORS = 64  # per-actor counters in a stats report: the most recently active (the rest as a count)
JOIN_BELOW = DEFAULT_COPY_THRESHOLD  # batches this large go as they came: joining copies, and saves them little
BUNDLE_BYTES = 1 << 20  # at most this many bytes of batches in one bundle


class _Either:
    """Set when ``stop`` is, or once the learner has said the run is over (nothing waits on it then)."""

    def __init__(self, stop: Any, proxy: Proxy) -> None:
        self.stop, self.proxy = stop, proxy

    @property
    def set(self) -> bool:
        return bool(self.stop.set or self.proxy.finished)


class _Until:
    """A stop flag that sets itself at a deadline."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    @property
    def set(self) -> bool:
        return time.monotonic() >= self.deadline


class _Hold:
    """When to read again after a burst: ``hold_s`` after it began, unless one actor's batches have
    come, over the last ``WINDOW_S`` or so, faster than half its receive queue (``queue`` batches)
    per hold; then at once (one actor's flood would fill its queue and wait on the hold; many slow
    actors together fill none)."""

    WINDOW_S = 0.1

    def __init__(self, hold_s: float, queue: int) -> None:
        self.hold_s, self.queue = hold_s, queue
        self.rate = 0.0  # batches/s of the busiest actor over the last window
        self.seen: collections.Counter[str] = collections.Counter()  # batches per actor this window
        self._since = time.monotonic()

    def after(self, woke: float) -> float:
        """The time to read again after a burst that began at ``woke``."""
        if woke - self._since >= self.WINDOW_S:
            self.rate = max(self.seen.values(), default=0) / max(woke - self._since, 1e-9)
            self.seen.clear()
            self._since = woke
        return woke + self.hold_s if self.rate * self.hold_s < self.queue / 2 else woke


@dataclass
class _Pending:
    """A batch read in this burst, waiting to go to the learner with others of its layout."""

    frames: list[Any]
    header: dict[str, Any]
    views: list[memoryview]
    n: int  # rows
    counts: collections.Counter[str]  # its actor's counters
    size: int  # bytes as received


class Proxy(RoleProcess):
    """One proxy process: actors' PULL in, learner's PUSH out."""

    def __init__(self, cfg: Config, bind_addr: str, learner_addr: str, name: str = "proxy",
                 run_dir: str | None = None, model_addr: str | None = None, *, snapshot_addr: str | None = None,
                 relay: tuple[str, str] | None = None) -> None:
        super().__init__(cfg, name, run_dir)
        self.limits = limits(cfg.net, BATCH, HELLO)
        self.learner_addr = learner_addr
        push_opts = options(cfg.net, SocketOptions.push(sndhwm=PROXY_QUEUE), data_path=True)
        self.push = self.socket(zmq.PUSH, push_opts, connect=learner_addr, link="to learner {address}",
                                linger_ms=2000)
        self.pull = self.socket(zmq.PULL, options(cfg.net, SocketOptions.pull(self.limits), data_path=True),
                                bind=bind_addr, link="from actors on {address}")
        self.bind_addr = bound_address(self.pull)
        self.hold = _Hold(cfg.net.proxy_hold_ms / 1000.0, int(self.pull.getsockopt(zmq.RCVHWM)))
        self.relay: Relay | None = None
        self.relay_addrs: dict[str, str] = {}
        if relay is not None and model_addr is not None:
            upstream = LearnerStream(self, cfg.net, model_addr, snapshot=snapshot_addr)
            pub = self.socket(zmq.XPUB, options(cfg.net, SocketOptions.pub(), data_path=True), bind=relay[0],
                              link="host's roles on {address}")
            pub.setsockopt(zmq.XPUB_VERBOSE, 1)
            router = self.socket(zmq.ROUTER, options(cfg.net, SocketOptions.snapshot_server(), data_path=True),
                                 bind=relay[1])
            snapshots = SnapshotServer(router, f"{name}-relay", cfg.net.republish_s, burst=cfg.net.max_peers)
            self.relay = Relay(upstream, pub, snapshots, name)
            self.relay_addrs = {"model": bound_address(pub), "snapshot": bound_address(router)}
            self.stream = None  # the relay hears the learner's control; its ``finished`` says the run is over
        else:
            self.stream = None if model_addr is None else LearnerStream(self, cfg.net, model_addr, models=False)
        self.finished = ""  # the learner's stop reason once it said the run is over
        self.sequences = SequenceTracker(cfg.net.max_peers, cfg.net.peer_idle_s)
        self.per_actor: PeerTable[collections.Counter[str]] = PeerTable(collections.Counter, cfg.net.max_peers,
                                                                         cfg.net.peer_idle_s)
        self.rejected: collections.Counter[str] = collections.Counter()
        self.keys = KeyBinding(cfg.net.max_peers, cfg.net.peer_idle_s)
        self.reader = BoundedReader(self.pull, self.limits.max_frames)
        self.forwarded = 0
        self.bundles = 0  # messages to the learner that joined two or more batches
        self.pending: list[_Pending] = []  # batches of this burst not yet sent, all of one layout
        self.pending_layout: tuple[Any, ...] = ()
        self.pending_bytes = self.pending_header_bytes = 0
        self.bundle_seq = 0
        self.bursts = 0  # reads that found batches (at most one per net.proxy_hold_ms)
        self.bytes = 0
        self.blocked_s = 0.0
        self.stats_seq = 0
        self.start = time.monotonic()

    def stats(self, actors: int | None = REPORTED_ACTORS) -> dict[str, Any]:
        """Counters, with per-actor ones for the ``actors`` most recently active (None: all of them):
        a report of every actor's would outgrow a message's header with a thousand actors."""
        wall = time.monotonic() - self.start
        known = self.per_actor.items()  # least recently active first
        shown = known if actors is None else known[len(known) - actors:] if actors else []
        return {"forwarded": self.forwarded, "bundles": self.bundles, "bursts": self.bursts, "bytes": self.bytes,
                "bytes_per_s": self.bytes / max(wall, 1e-9),
                "rejected": dict(self.rejected), "rejected_total": sum(self.rejected.values()),
                "blocked_s": round(self.blocked_s, 3), "bind": self.bind_addr,
                "actors": {k: dict(v) for k, v in shown}, "actors_total": len(known), "wall_s": round(wall, 3),
                "peers_refused": self.sequences.refused, "refused_keys": self.keys.refused,
                "auth": auth_counts(self.ctx), **({"relay": self.relay.stats()} if self.relay is not None else {})}

    def _forward(self, frames: list[Any], stop: StopFlag | _Until) -> bool:
        """Send ``frames`` to the learner, waiting while it does not take them (reading its models the
        while), until ``stop`` or the learner says the run is over; whether they went."""
        sent, blocked_s = send_blocking(
            self.push, frames, _Either(stop, self),
            on_block=lambda: self.ratelog.warn("blocked", f"{self.name}: learner {self.learner_addr} is not "
                                                          "taking batches; holding actors back"),
            while_blocked=self._watch_control)
        self.blocked_s += blocked_s
        return sent is not None

    def handle(self, frames: list[Any], stop: StopFlag | _Until) -> None:
        """Validate one received message and forward it (a batch waits for :meth:`flush` while
        others of its layout may join it); drop and count it if bad."""
        try:
            header, views, specs = peek(frames, self.limits)
        except WireError as exc:
            self.rejected[exc.reason] += 1
            self.ratelog.warn(f"bad-{exc.reason}", f"{self.name}: dropped a bad message on {self.bind_addr}: {exc}")
            return
        sender = header["sender"]
        if not self.keys.allows(sender, peer_key(frames)):
            self.rejected["key"] += 1
            self.ratelog.warn("key", f"{self.name}: dropped a batch from {sender}: that name was first used by "
                                     "another CURVE key")
            return
        self.hold.seen[sender] += 1
        accept, lost = self.sequences.observe(sender, header["inc"], header["seq"])
        counts = self.per_actor.admit(sender)
        if counts is None:  # more actors than net.max_peers: refused (counted by the sequence tracker)
            self.ratelog.warn("refused", f"{self.name}: refusing {sender}: already counting net.max_peers="
                                         f"{self.cfg.net.max_peers} actors")
            return
        counts["lost"] += lost
        if not accept:
            counts["dropped_old"] += 1
            return
        size = sum(len(f) for f in frames)
        joinable = header["kind"] == BATCH and self.cfg.net.proxy_merge > 1 and size < JOIN_BELOW
        layout = batch_layout(specs) if joinable else None
        if layout is None or not meta_depth_ok(header["meta"], BUNDLE_META_DEPTH):
            self.flush(stop)
            self._send([_Pending(frames, header, views, 0, counts, size)], frames, stop)
            return
        key, n = layout
        header_bytes = views[0].nbytes
        if self.pending and (key != self.pending_layout or len(self.pending) >= self.cfg.net.proxy_merge
                             or self.pending_bytes + size > BUNDLE_BYTES
                             or self.pending_header_bytes + header_bytes > self.limits.max_header_bytes // 2):
            self.flush(stop)
        self.pending.append(_Pending(frames, header, views, n, counts, size))
        self.pending_layout = key
        self.pending_bytes += size
        self.pending_header_bytes += header_bytes

    def flush(self, stop: StopFlag | _Until) -> None:
        """Send the batches waiting: one as it came, two or more joined into one bundle."""
        pending, self.pending, self.pending_bytes, self.pending_header_bytes = self.pending, [], 0, 0
        if len(pending) == 1:
            self._send(pending, pending[0].frames, stop)
        elif pending:
            try:
                frames = encode_bundle(self.name, self.incarnation, self.bundle_seq,
                                       [(p.header, p.views, p.n) for p in pending], self.limits)
            except WireError as exc:  # (not expected: layouts and header sizes were checked) each as it came
                self.ratelog.warn("bundle", f"{self.name}: could not join {len(pending)} batches: {exc}")
                for batch in pending:
                    self._send([batch], batch.frames, stop)
                return
            self.bundle_seq += 1
            if self._send(pending, frames, stop):
                self.bundles += 1

    def _send(self, batches: list[_Pending], frames: list[Any], stop: StopFlag | _Until) -> bool:
        """Forward ``frames`` (which carry ``batches``) and count each batch as forwarded or lost."""
        sent = self._forward(frames, stop)
        for batch in batches:
            if sent:
                batch.counts["batches"] += 1
                batch.counts["bytes"] += batch.size
                self.forwarded += 1
                self.bytes += batch.size
            else:
                batch.counts["dropped_at_exit"] += 1
        return sent

    def send_stats(self) -> None:
        try:
            frames = encode_stats(self.name, self.incarnation, self.stats_seq, {"role": "proxy", **self.stats()})
        except WireError:  # (long actor names) the report without per-actor counters still fits
            frames = encode_stats(self.name, self.incarnation, self.stats_seq, {"role": "proxy", **self.stats(0)})
        try:
            send_frames(self.push, frames, flags=zmq.NOBLOCK)
            self.stats_seq += 1
        except zmq.Again:
            pass  # the learner is away; the next report supersedes this one

    def _control(self, msg: Message) -> None:
        """``done`` in the learner's control: the run is over."""
        done = learner_done(msg)
        if done and not self.finished:
            self.finished = done
            log.info("%s: the learner finished (%s); forwarding what is left, then stopping", self.name, done)

    def _watch_control(self) -> None:
        if self.stream is not None:
            self.stream.take_control(self._control)
        elif self.relay is not None:
            self.relay.check()
            if self.relay.finished and not self.finished:
                self.finished = self.relay.finished
                log.info("%s: the learner finished (%s); forwarding what is left, then stopping", self.name,
                         self.finished)

    def run(self, stop: StopFlag) -> None:
        """Forward until stopped or the learner says it finished. After each burst it reads, the proxy
        holds ``net.proxy_hold_ms`` before reading again: waking costs it more than handling a batch
        (one actor at 400 batches/s: 172 us of the process's CPU per batch read one at a time, 102 us
        with the default 10 ms hold; bench row ``transport_proxy_cpu_paced``), and the learner reads
        its data socket only every 50 ms anyway. The first batch after a quiet spell is read at once,
        and there is no hold while one actor's batches come faster than half its receive queue per
        hold: it never caps throughput. On the way out it forwards what actors already sent (a second)."""
        log.info("%s: actors connect to %s; forwarding to learner %s", self.name, self.bind_addr, self.learner_addr)
        if self.relay is not None:
            self.relay.start()
            log.info("%s: relaying the learner's stream to this host's roles on %s (snapshots on %s)", self.name,
                     self.relay_addrs["model"], self.relay_addrs["snapshot"])
        report, watch = Every(self.cfg.net.stats_interval_s), Every(0.1)
        while not stop.set and not self.finished:
            if watch():
                self._watch_control()
            if self.pull.poll(100, zmq.POLLIN):
                woke = time.monotonic()
                self.bursts += 1
                # Drain what is queued before looking at the clock again.
                for _ in range(1000):
                    frames = self._read()
                    if frames is None:
                        break
                    self.handle(frames, stop)
                    if stop.set:
                        break
                self.flush(stop)
                rest = self.hold.after(woke) - time.monotonic()
                if rest > 0 and not stop.set:
                    time.sleep(rest)
            if report():
                self.send_stats()
        self.drain(seconds=1.0)

    def _read(self) -> list[Any] | None:
        """The next message from actors, or None when none is waiting (one of too many frames is
        dropped and counted as it is read)."""
        while True:
            try:
                return self.reader.read()
            except WireError as exc:
                self.rejected[exc.reason] += 1
                self.ratelog.warn(f"bad-{exc.reason}", f"{self.name}: dropped a bad message on {self.bind_addr}: {exc}")

    def drain(self, seconds: float) -> None:
        """On the way out: forward what actors already sent, for at most ``seconds``."""
        until = _Until(time.monotonic() + seconds)
        while not until.set:
            frames = self._read()
            if frames is None:
                break
            self.handle(frames, until)
        self.flush(until)

    def role_stats(self) -> dict[str, Any]:
        return self.stats(None)

    def close(self) -> None:
        """Stop the relay (it uses sockets of this process), then close as every role does."""
        if self.relay is not None:
            self.relay.stop()
        super().close()


def run_proxy(cfg: Config, bind_addr: str, learner_addr: str, name: str = "proxy", run_dir: str | None = None,
              model_addr: str | None = None, *, snapshot_addr: str | None = None,
              relay: tuple[str, str] | None = None) -> int:
    """The ``zmqrl proxy`` entry point (with ``relay``: the host's relay binds its stream and snapshots there)."""
    proxy = serve(lambda: Proxy(cfg, bind_addr, learner_addr, name, run_dir, model_addr,
                                snapshot_addr=snapshot_addr, relay=relay))
    s = proxy.stats()
    log.info("%s: forwarded %d batches (%d bytes), rejected %d", proxy.name, s["forwarded"], s["bytes"],
             s["rejected_total"])
    return 0
