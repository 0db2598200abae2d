"""The learner's publisher: models and control on its XPUB, in a thread beside the update loop.

The learner's stream has two topics (:mod:`zmqrl.wire.protocol`). A **model** (the whole network:
6.7 MB for the Nature CNN) goes out only with a new version and every ``net.republish_s`` since the
last one. **Control** is a few hundred bytes: the rate limiter's ``pause``, the allowance
(``allow``) with its ``grant`` number, the start-up ``quota``, ``done`` with the stop reason, the
newest version and a digest of the task signature. It goes out when the loop changes it or asks
for a new one (with each new model version, and while it waits for data), and every
:data:`CONTROL_REPUBLISH_S`. While the rate limiter's allowance is in force each control message
made is a new grant; one sent again carries the same grant, which counts once.

A subscriber that joins (a relay, or a role that subscribes to the learner itself) sends nothing
out: it asks the snapshot ROUTER (:mod:`~zmqrl.roles.snapshots`) for the newest control and model,
which go to it alone. Subscriptions are only counted, so a storm of them costs the learner nothing.

The loop hands over an encoded model (:meth:`Publisher.post_model`: the loop encodes it, since the
parameters it reads go on changing with the next update) and the control state
(:meth:`Publisher.post_control`); it never touches the socket and never waits for it. Grants are
numbered here, where control is encoded (:class:`~zmqrl.roles.ratelimit.Allowances`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

import zmq

from zmqrl import __version__
from zmqrl.roles.addresses import port_of
from zmqrl.roles.beside import Beside
from zmqrl.roles.ratelimit import Allowances
from zmqrl.roles.snapshots import SnapshotServer
from zmqrl.run.rewards import CONTROL_KEY as REWARD_SCALE_KEY
from zmqrl.wire import CONTROL_TOPIC, MODEL_TOPIC, bound_address, encode_control, send_frames

log = logging.getLogger("zmqrl")

CONTROL_REPUBLISH_S = 1.0  # control goes out again this often (a lost one costs at most this long)
MAX_EVENTS = 256  # subscription events read per wake-up (a flood of them must not hold the thread)


@dataclass(frozen=True)
class ControlState:
    """What the loop asks of every role (:mod:`zmqrl.roles.fit` reads it on their side)."""

    paused: bool = False  # the rate limiter asks actors to stop stepping
    allowance: int | None = None  # while the learner trains with the limiter on: transitions per grant
    quota: int | None = None  # while the agent is still being built: transitions each actor may make
    done: str = ""  # the run is over, with this stop reason
    reward_scale: float = 1.0  # the learner's factor on stored rewards (zmqrl.run.rewards), for actors' priorities


class Publisher(Beside):
    """Sends models and control on the learner's XPUB (module docstring); stats for the summary."""

    def __init__(self, sock: zmq.Socket, incarnation: str, task_digest: str, allowances: Allowances,
                 republish_s: float, snapshots: SnapshotServer | None = None) -> None:
        super().__init__("publisher")
        self.sock, self.incarnation, self.task_digest = sock, incarnation, task_digest
        self.snapshots = snapshots
        self.snapshot_port = 0 if snapshots is None else port_of(bound_address(snapshots.sock))
        self.allowances, self.republish_s = allowances, republish_s
        self._lock = threading.Lock()
        self._posted: tuple[int, bytes] | None = None  # a model the loop handed over, not sent yet
        self._state: ControlState | None = None  # none posted yet: no control goes out
        self._control_due = False
        self._version = -1
        self._model: bytes | None = None  # the newest model's frame, sent again to republish and in snapshots
        self._model_version = -1  # its version
        self._control: bytes | None = None  # the newest control's frame, sent again likewise
        self._control_seq = 0
        self._model_at = self._control_at = -math.inf  # monotonic time each last went out
        self._done_sent = threading.Event()
        self.models_sent = self.model_bytes = self.versions_sent = 0
        self.controls_sent = self.control_bytes = self.grants = 0
        self.model_joins = self.control_joins = 0
        self.dropped = 0  # sends the XPUB refused (a subscriber's queue full: PUB drops by design)

    # --- what the loop calls -----------------------------------------------------------------
    @property
    def version(self) -> int:
        """The newest model version handed over (the versions this learner has published reach it)."""
        return self._version

    def post_model(self, version: int, frame: bytes) -> None:
        """Hand over the encoded model of ``version`` (:func:`~zmqrl.wire.encode_model`): it goes out next."""
        with self._lock:
            self._posted = (version, frame)
            self._version = max(self._version, version)
        self.waker.wake()

    def post_control(self, state: ControlState, grant: bool = False) -> None:
        """The control state as the loop sees it; control goes out when it changed or ``grant`` asks
        for a new grant (a new model version; the learner waiting for data)."""
        with self._lock:
            if state == self._state and not grant:
                return
            self._state = state
            self._control_due = True
        self.waker.wake()

    @property
    def state(self) -> ControlState:
        return self._state or ControlState()

    def finish(self, reason: str, timeout: float = 2.0) -> bool:
        """Tell every role the run is over (``done``), waiting up to ``timeout`` for it to leave;
        whether it left."""
        self.post_control(replace(self.state, done=reason or "finished"))
        return self._done_sent.wait(timeout) if self.alive else False

    # --- the thread --------------------------------------------------------------------------
    def work(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.waker.fd, zmq.POLLIN)
        if self.snapshots is not None:
            poller.register(self.snapshots.sock, zmq.POLLIN)
        while not self.stopping:
            wait = min(max(0.0, self._due() - time.monotonic()), 1.0)
            events = dict(poller.poll(int(math.ceil(wait * 1000))))
            if self.waker.fd in events:
                self.waker.clear()
            if self.sock in events:
                self._read_subscriptions()
            self._send_due()
            if self.snapshots is not None and self.snapshots.sock in events:
                key = None if self._model is None else (self.incarnation, self._model_version)
                self.snapshots.serve(self._control, self._model, key)

    def _due(self) -> float:
        """When a model or control next goes out unasked (republishing)."""
        due = math.inf
        if self._model is not None:
            due = self._model_at + self.republish_s
        if self._control is not None:
            due = min(due, self._control_at + CONTROL_REPUBLISH_S)
        return due

    def _read_subscriptions(self) -> None:
        """Subscriptions (XPUB_VERBOSE: each join, even to a topic already subscribed), counted: a joiner
        asks for a snapshot, so nothing goes out for a join."""
        for _ in range(MAX_EVENTS):
            try:
                event = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if event[:1] != b"\x01":
                continue
            topic = event[1:]
            if MODEL_TOPIC.startswith(topic):  # (b"": every topic; b"ZQ": models of any protocol version)
                self.model_joins += 1
            if CONTROL_TOPIC.startswith(topic):
                self.control_joins += 1

    def _send_due(self) -> None:
        with self._lock:
            posted, self._posted = self._posted, None
            state, control_due = self._state, self._control_due
            self._control_due = False
        now = time.monotonic()
        if posted is not None:
            self._model_version, self._model = posted
            self.versions_sent += 1
            self._send_model(now)
        elif self._model is not None and now >= self._model_at + self.republish_s:
            self._send_model(now)
        if control_due and state is not None:
            self._control = self._encode_control(state)
        if self._control is not None and (control_due or now >= self._control_at + CONTROL_REPUBLISH_S):
            self._control_at = now
            if self._send(self._control):
                self.controls_sent += 1
                self.control_bytes += len(self._control)
            if state is not None and state.done and control_due:
                self._done_sent.set()

    def _send_model(self, now: float) -> None:
        assert self._model is not None
        self._model_at = now
        if self._send(self._model):
            self.models_sent += 1
            self.model_bytes += len(self._model)

    def _send(self, frame: bytes) -> bool:
        try:
            send_frames(self.sock, [frame], flags=zmq.NOBLOCK)
            return True
        except zmq.Again:
            self.dropped += 1  # PUB drops by design; the next one supersedes this one
            return False

    def _encode_control(self, state: ControlState) -> bytes:
        """A control message of ``state``: while an allowance is in force, each one made is a new grant
        (sent again, the same bytes grant nothing more)."""
        meta: dict[str, Any] = {"pause": state.paused, "task": self.task_digest, "zmqrl": __version__}
        if self.snapshot_port:
            meta["snap"] = self.snapshot_port  # where joiners ask for snapshots (a port on this learner's host)
        if state.quota is not None:
            meta["quota"] = state.quota
            self.allowances.grant(None)
        elif state.allowance is not None:
            meta["allow"] = state.allowance
            meta["grant"] = self.allowances.grant(state.allowance, paused=state.paused)
            self.grants += 1
        else:
            self.allowances.grant(None)
        if state.done:
            meta["done"] = state.done
        if state.reward_scale != 1.0:
            meta[REWARD_SCALE_KEY] = state.reward_scale
        self._control_seq += 1
        return bytes(encode_control("learner", self.incarnation, self._control_seq, max(self._version, 0), meta)[0])

    def stats(self) -> dict[str, Any]:
        return {"models_published": self.models_sent, "model_versions_sent": self.versions_sent,
                "model_bytes": self.model_bytes, "controls_sent": self.controls_sent,
                "control_bytes": self.control_bytes, "grants": self.grants, "model_subscriptions": self.model_joins,
                "control_subscriptions": self.control_joins, "sends_dropped": self.dropped,
                **(self.snapshots.stats() if self.snapshots is not None else {}),
                "bytes_sent": self.bytes_sent}

    def _snapshot_bytes(self) -> int:
        s = self.snapshots
        return 0 if s is None else s.model_bytes + s.control_bytes

    @property
    def bytes_sent(self) -> int:
        """Bytes of models and control sent, on the stream and in snapshots."""
        return self.model_bytes + self.control_bytes + self._snapshot_bytes()

