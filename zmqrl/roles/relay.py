"""A host's relay: the learner's stream, taken once per host and served to that host's roles.

The relay runs beside the host's proxy (a thread of the proxy process). It subscribes to the
learner's models and control once, keeps the newest of each (the ZeroMQ guide's last-value cache)
and publishes them on a host-local XPUB, the very frames that came (control naming the relay's
snapshot port instead of the learner's); it answers the host's
snapshot requests (:mod:`~zmqrl.roles.snapshots`) from what it keeps. So the learner sends each
model version once per host, not once per actor, and a role that joins or restarts on the host is
served by its relay: the learner sends nothing for it.

It checks what it passes on as a role does: each message decodes within the run's limits (sizes,
dtypes: nothing is ever unpickled), models go forward in version order within a learner line and a
new line (a restarted learner) is taken, control is taken from the line in use
(:class:`~zmqrl.roles.stream.LearnerStream`), and a model whose task signature does not hash to the
digest its line's control names is held back and counted. Every guarantee of the stream holds
through it: pauses, grants and ``done`` go on at once, the learner's republishes go on as they
come, a model it missed it asks the learner for again. Should the relay restart, its roles keep
the model they hold, ask again, and catch up; should the learner restart, the new line goes on.
"""

from __future__ import annotations

import logging
from typing import Any

import zmq

from zmqrl.roles.addresses import port_of
from zmqrl.roles.beside import Beside
from zmqrl.roles.fit import learner_done, signature_digest
from zmqrl.roles.snapshots import SnapshotServer
from zmqrl.roles.stream import LearnerStream
from zmqrl.wire import DEFAULT_COPY_THRESHOLD, Message, RateLimitedLog, bound_address, encode_control

log = logging.getLogger("zmqrl")

WAKE_S = 0.1  # the relay looks at its upstream link and staleness at least this often
MAX_EVENTS = 256  # subscription events read per wake-up


class Relay(Beside):
    """Takes ``upstream`` (the learner's stream, with models and snapshots) and serves it on ``pub``
    (an XPUB) and ``snapshots`` (a ROUTER's server); :attr:`finished` is set once the learner's
    control says the run is over."""

    def __init__(self, upstream: LearnerStream, pub: zmq.Socket, snapshots: SnapshotServer, name: str) -> None:
        super().__init__(f"{name}-relay")
        self.upstream, self.pub, self.snapshots = upstream, pub, snapshots
        self.snapshot_port = port_of(bound_address(snapshots.sock))
        self.ratelog = RateLimitedLog(log, 10.0)
        self.finished = ""  # the learner's stop reason once control said the run is over
        self._model: bytes | None = None
        self._model_key: tuple[str, int] | None = None
        self._control: bytes | None = None
        self._digests: dict[str, str] = {}  # learner incarnation -> the task digest its control names
        self.models = self.model_bytes = self.controls = self.control_bytes = 0
        self.models_refused = 0  # models held back: their task signature is not the one their control names
        self.joins = 0
        self.dropped = 0
        self.republished = 0  # the learner's republishes of the newest model, passed on

    def work(self) -> None:
        stream = self.upstream
        poller = zmq.Poller()
        for sock in (stream.control_sub, stream.model_sub, stream.snap, self.pub, self.snapshots.sock):
            if sock is not None:
                poller.register(sock, zmq.POLLIN)
        poller.register(self.waker.fd, zmq.POLLIN)
        while not self.stopping:
            events = dict(poller.poll(int(WAKE_S * 1000)))
            if self.waker.fd in events:
                self.waker.clear()
            self.pass_on()
            if self.pub in events:
                self._read_subscriptions()
            if self.snapshots.sock in events:
                self.snapshots.serve(self._control, self._model, self._model_key)

    def pass_on(self) -> None:
        """Take what came from the learner and publish it: control of the line in use, then the newest
        model (and control of a new line, which waited for its model); the learner's republishes of
        control and of the newest model are passed on too (the stream's backstop)."""
        stream = self.upstream
        stream.take_control(self._take_control)
        heard: list[Message] = []
        msg, _ = stream.newest_model(observe=heard.append)
        if msg is not None:
            self._take_model(msg, stream.model_frame)
            stream.take_control(self._take_control)
        elif self._model is not None and any((m.incarnation, m.version) == self._model_key for m in heard):
            self.republished += 1  # the learner's republish of the model kept here: passed on as it came
            self._publish(self._model)

    def _take_control(self, msg: Message) -> None:
        task = msg.meta.get("task")
        if isinstance(task, str):
            if len(self._digests) >= 4 and msg.incarnation not in self._digests:
                self._digests.pop(next(iter(self._digests)))
            self._digests[msg.incarnation] = task
        # the very control that came, but naming this relay's snapshot port: a role behind it that was told
        # no snapshot address asks here, not at the learner's port on this host
        frame = bytes(encode_control(msg.sender, msg.incarnation, msg.seq, msg.version,
                                     {**msg.meta, "snap": self.snapshot_port})[0])
        self._control = frame
        self.controls += 1
        self.control_bytes += len(frame)
        self._publish(frame)
        done = learner_done(msg)
        if done and not self.finished:
            self.finished = done

    def _take_model(self, msg: Message, frame: Any) -> None:
        named = self._digests.get(msg.incarnation)
        task = msg.meta.get("task")
        if named is not None and isinstance(task, dict) and signature_digest(task) != named:
            self.models_refused += 1
            self.ratelog.warn("task", f"{self.name}: held back model version {msg.version}: its task signature "
                                      f"does not hash to the digest {named} its learner's control names")
            return
        data = _bytes(frame)
        self._model, self._model_key = data, (msg.incarnation, msg.version)
        self.models += 1
        self.model_bytes += len(data)
        self._publish(data)

    def _publish(self, frame: bytes) -> None:
        try:
            self.pub.send(frame, zmq.NOBLOCK, copy=len(frame) < DEFAULT_COPY_THRESHOLD)
        except zmq.Again:
            self.dropped += 1  # PUB drops by design; the next one supersedes this one

    def _read_subscriptions(self) -> None:
        for _ in range(MAX_EVENTS):
            try:
                event = self.pub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if event[:1] == b"\x01":
                self.joins += 1

    @property
    def version(self) -> int:
        """The version of the newest model relayed (-1: none yet)."""
        return -1 if self._model_key is None else self._model_key[1]

    def stats(self) -> dict[str, Any]:
        up = self.upstream
        return {"models_relayed": self.models, "model_bytes_relayed": self.model_bytes,
                "controls_relayed": self.controls, "control_bytes_relayed": self.control_bytes,
                "models_refused": self.models_refused, "models_republished": self.republished,
                "subscriptions": self.joins, "sends_dropped": self.dropped,
                "version": self.version, "upstream_asked": up.asked, "upstream_snapshot_models": up.snapshot_models,
                "upstream_bad": up.bad, "cpu_s": round(self.cpu_s(), 3),
                **self.snapshots.stats()}


def _bytes(frame: Any) -> bytes:
    """A received frame's bytes (kept: the frame's buffer belongs to the receive)."""
    return frame.bytes if isinstance(frame, zmq.Frame) else bytes(frame)
