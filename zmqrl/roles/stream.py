"""A role's side of the learner's stream: its models and its control, each on a subscription of its own.

Both subscriptions conflate (only the newest message waits), so a role busy for a long time
finds the newest model and the newest control, and control never pushes a model out of the
queue. Control is taken from the learner line in use: the learner incarnation of the model the
role took last (any, before its first model); control from a newer line waits until its model
has been taken, then counts, unless it says the run is over (``done``): that needs no model, and a
learner stopped just after it restarted may never send one.

A role gets its first model and control by itself: it asks the stream's snapshot ROUTER
(:mod:`~zmqrl.roles.snapshots`) at start, again every :data:`STALE_S` while it holds no model, and
whenever its model stays older than the newest version control names for :data:`STALE_S` (the
model was dropped on the way: a publisher drops what a slow subscriber's queue cannot take). The
reply comes to this role alone; nothing a role does makes the publisher send to everyone, so the
publisher sends a model only with a new version and every ``net.republish_s``.

The stream is the learner's own or its host's relay (:mod:`~zmqrl.roles.relay`): both speak alike.
A role told no snapshot address takes its stream's from control (``meta["snap"]``, a port on the
host the role subscribed to), so a role started by hand needs no more flags: a relay names its own
snapshot port in the control it passes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import zmq

from zmqrl.config import NetConfig
from zmqrl.roles.addresses import same_host
from zmqrl.roles.fit import learner_done
from zmqrl.roles.net import limits, options
from zmqrl.roles.skeleton import RoleProcess
from zmqrl.wire import (
    CONTROL,
    MODEL,
    Message,
    SocketOptions,
    VersionTracker,
    WireError,
    decode,
    drain_control_frames,
    drain_latest_model_frame,
    encode_snapshot_request,
    send_frames,
)
from zmqrl.wire.monitor import LinkMonitor

STALE_S = 1.0  # a model older than the one control names for this long is asked for again
MAX_REPLIES = 16  # snapshot replies read per call
SILENT_S = 5.0  # no control for this long (the learner sends it every second): the learner is out of reach


class LearnerStream:
    """What a role hears from the learner's stream at ``address`` (an XPUB: the learner's, or its host's
    relay): with ``models``, the newest model (:meth:`newest_model`), and always control
    (:meth:`take_control`). With ``snapshot`` (the stream's snapshot ROUTER) the role asks for the newest
    model and control itself (module docstring). ``digest`` is the role's own task digest
    (:func:`~zmqrl.roles.fit.signature_digest`): control from a learner whose digest differs sets
    :attr:`foreign` (the role must not act for it; its model says how it differs).

    :attr:`model_frame` and :attr:`control_frame` are the packed frames of the model last returned and
    the control last applied, as they came (a relay passes them on unchanged)."""

    def __init__(self, role: RoleProcess, net: NetConfig, address: str, *, models: bool = True,
                 snapshot: str | None = None, digest: str | None = None,
                 on_error: Callable[[WireError], None] | None = None) -> None:
        self.address, self.digest, self.on_error = address, digest, on_error
        self.sender, self.incarnation = role.name, role.incarnation
        self.model_limits, self.control_limits = limits(net, MODEL), limits(net, CONTROL)
        self.control_sub = role.socket(zmq.SUB, options(net, SocketOptions.control(self.control_limits)),
                                       connect=address, link="to learner control {address}")
        self.control_link: LinkMonitor = role.links[-1]
        self.model_sub = None
        if models:
            self.model_sub = role.socket(zmq.SUB, options(net, SocketOptions.models(self.model_limits)),
                                         connect=address, link="to learner models {address}")
        self._role, self._net = role, net
        self.snapshot_address: str | None = None
        self.snap_limits = limits(net, MODEL, CONTROL)
        self.snap: zmq.Socket | None = None
        self._discovering = snapshot is None and models  # the learner's control names its snapshot port
        if snapshot is not None and models:
            self._connect_snapshots(snapshot)
        self.versions = VersionTracker()
        self.bad = 0  # messages on the stream that did not decode (or came on the wrong topic)
        self.foreign = False  # the newest control came from a learner of another task
        self.asked = 0  # snapshot requests sent (at start, while no model came, for a model older than control's)
        self.snapshot_models = 0  # models that came in snapshot replies
        self.model_frame: Any = None
        self.control_frame: Any = None
        self._waiting: tuple[Message, Any] | None = None  # control, waiting until its line's model is taken
        self._applied: tuple[str, int] = ("", -1)  # (incarnation, seq) of the control applied last
        self._announced = -1  # the newest model version control of the line in use named
        self._stale_since: float | None = None
        self._asked_at = -float("inf")
        self._snap_models: list[tuple[Message, Any]] = []
        self._snap_controls: list[tuple[Message, Any]] = []
        self._snap_seq = 0
        self._heard_at: float | None = None  # when control last came (any, repeats included), or the first model
        if self.model_sub is not None:
            self.ask()

    @property
    def down(self) -> bool:
        """Whether the learner is out of reach: the link to the stream is down, or no control came for
        :data:`SILENT_S` after some had, or after the first model (the learner sends control every second;
        through a relay whose own link to the learner is down, the host's link stays up and only the silence
        tells; a learner stopped between its first model and its first control is silent from that model)."""
        if self.control_link.down:
            return True
        return self._heard_at is not None and time.monotonic() - self._heard_at > SILENT_S

    def take_control(self, apply: Callable[[Message], None]) -> int:
        """``apply`` each control message that came since the last call from the line in use (in order,
        the newest last); returns how many bad messages were read."""
        bad = self._read_snapshots()
        messages, bad_sub = drain_control_frames(self.control_sub, self.control_limits, on_error=self.on_error)
        bad += bad_sub
        self.bad += bad_sub
        if messages or self._snap_controls:
            self._heard_at = time.monotonic()
        for heard in [*self._snap_controls, *messages]:
            msg = heard[0]
            self._discover(msg)
            if msg.incarnation == self._applied[0] and msg.seq < self._applied[1]:
                continue  # older than the control applied (a snapshot's and the stream's may cross)
            if self._waiting is None or msg.incarnation != self._waiting[0].incarnation \
                    or msg.seq > self._waiting[0].seq:
                self._waiting = heard
        self._snap_controls = []
        if self._waiting is not None and (self._current(self._waiting[0]) or learner_done(self._waiting[0])):
            (msg, frame), self._waiting = self._waiting, None
            task = msg.meta.get("task")
            self.foreign = self.digest is not None and isinstance(task, str) and task != self.digest
            self._announced = msg.version
            self._applied = (msg.incarnation, msg.seq)
            self.control_frame = frame
            apply(msg)
        self._ask_if_stale()
        return bad

    def _connect_snapshots(self, address: str) -> None:
        if self.snap is not None:
            self.snap.close(linger=0)
        self.snapshot_address = address
        self.snap = self._role.socket(zmq.DEALER, options(self._net, SocketOptions.snapshots(self.snap_limits)),
                                      connect=address)

    def _discover(self, msg: Message) -> None:
        """Take the learner's snapshot port from its control when no snapshot address was given (again when
        a restarted learner names another)."""
        port = msg.meta.get("snap")
        if not self._discovering or not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            return
        address = same_host(self.address, port)
        if address != self.snapshot_address:
            self._connect_snapshots(address)
            self._asked_at = -float("inf")

    def ask(self) -> None:
        """Ask the stream's snapshot ROUTER for its newest control and model (naming the model held)."""
        if self.snap is None:
            return
        have = None if self.versions.incarnation is None else (self.versions.incarnation, self.versions.version)
        try:
            send_frames(self.snap, encode_snapshot_request(self.sender, self.incarnation, self._snap_seq, have),
                        flags=zmq.NOBLOCK)
        except zmq.Again:
            return  # its queue is full of requests already
        self._snap_seq += 1
        self.asked += 1
        self._asked_at = time.monotonic()

    def _ask_if_stale(self) -> None:
        """Ask for a snapshot while no model came, and when the model in use has stayed older than
        control's for STALE_S, or control of a new learner line (a restarted learner) has waited that
        long for its model."""
        if self.model_sub is None or self.snap is None:
            return
        now = time.monotonic()
        if self.versions.incarnation is None:
            if now - self._asked_at >= STALE_S:
                self.ask()
            return
        if self._announced <= self.versions.version and self._waiting is None:
            self._stale_since = None  # (control of a new learner line waiting for its model: a restart)
            return
        if self._stale_since is None:
            self._stale_since = now
        elif now - self._stale_since >= STALE_S and now - self._asked_at >= STALE_S:
            self.ask()
            self._stale_since = now

    def _read_snapshots(self) -> int:
        """Read the snapshot replies that came: their control and model wait for take_control and
        newest_model. Returns how many frames were bad."""
        if self.snap is None:
            return 0
        bad = 0
        for _ in range(MAX_REPLIES):
            try:
                frames = self.snap.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            for frame in frames[:2]:
                try:
                    msg = decode([frame], self.snap_limits)
                except WireError as exc:
                    bad += 1
                    if self.on_error is not None:
                        self.on_error(exc)
                    continue
                if msg.kind == CONTROL:
                    self._snap_controls.append((msg, frame))
                elif msg.kind == MODEL and self.model_sub is not None:
                    self._snap_models.append((msg, frame))
                else:
                    bad += 1
            bad += max(0, len(frames) - 2)
        self.bad += bad
        return bad

    def _current(self, msg: Message) -> bool:
        return self.versions.incarnation is None or msg.incarnation == self.versions.incarnation

    def newest_model(self, observe: Callable[[Message], None] | None = None) -> tuple[Message | None, int]:
        """The newest model newer than the last one taken (None when none came), and how many bad
        messages were read; ``observe`` sees every model decoded."""
        if self.model_sub is None:
            return None, 0
        bad = self._read_snapshots()
        latest: tuple[Message, Any] | None = None
        for msg, frame in self._snap_models:
            if observe is not None:
                observe(msg)
            if self.versions.offer(msg.incarnation, msg.version):
                latest = (msg, frame)
                self.snapshot_models += 1
        self._snap_models = []
        heard, bad_sub = drain_latest_model_frame(self.model_sub, self.versions, self.model_limits,
                                                  observe=observe, on_error=self.on_error)
        self.bad += bad_sub
        if heard is not None:
            latest = heard
        if latest is None:
            return None, bad + bad_sub
        if self._heard_at is None:  # a model and no control yet: the silence counts from here
            self._heard_at = time.monotonic()
        self.model_frame = latest[1]
        return latest[0], bad + bad_sub

    def wait(self, timeout_ms: int) -> bool:
        """Wait up to ``timeout_ms`` for anything on the stream; whether something came."""
        poller = zmq.Poller()
        poller.register(self.control_sub, zmq.POLLIN)
        if self.model_sub is not None:
            poller.register(self.model_sub, zmq.POLLIN)
        if self.snap is not None:
            poller.register(self.snap, zmq.POLLIN)
        return bool(poller.poll(timeout_ms))
