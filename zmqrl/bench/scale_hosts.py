"""The scale group's simulated hosts, and its probe on the learner's stream.

A simulated host (:func:`sim_host`, a helper process) is K light actors in one
:class:`~zmqrl.roles.skeleton.RoleProcess`, one event loop over their sockets. Each simulated
actor is what an actor is to the rest of the system, less its envs and forward pass:

- its own PUSH to its host's proxy, sending recorded real batches at the rate the bench sets, each
  stamped as an actor stamps it (a name unique over every host, its incarnation, its sequence, the
  version of the model it holds, the grants it applied: :class:`~zmqrl.roles.fit.Allowance`), and
  holding while the learner's control says pause or its allowance is made;
- its own :class:`~zmqrl.roles.stream.LearnerStream` (models and control, each a conflated SUB, and a
  DEALER for snapshots) on its host's relay, or on the learner itself with the relay off;
- each model it takes applied: the arrays copied into buffers allocated once.

Each records, in wall-clock time (``time.time``: one clock for every process of a machine), when it
took each model version and when its pause state changed, and when it got its first model after its
stream was made; the bench reads these from the helper's result. The bench tells every host the
rate each of its actors offers on a PUB (``{"rate": transitions/s}``); a host reports once every
actor of it holds a model, and (asked ``{"want": version}``) once every actor of it holds that version.

:class:`Probe` subscribes to the learner's own XPUB, unconflated, and notes when each model version
and each change of the pause went out: the start of every reach the bench measures.
"""

from __future__ import annotations

import heapq
import json
import os
import threading
import time
from typing import Any

import numpy as np
import zmq

from zmqrl.bench.feeders import actor_meta, load_messages
from zmqrl.bench.harness import child_config
from zmqrl.roles.fit import Allowance
from zmqrl.roles.net import limits, options
from zmqrl.roles.skeleton import RoleProcess
from zmqrl.roles.stream import LearnerStream
from zmqrl.run.lifecycle import Every, StopFlag
from zmqrl.wire import (
    CONTROL,
    DEFAULT_COPY_THRESHOLD,
    MODEL,
    BatchEncoder,
    Message,
    SocketOptions,
    WireError,
    decode,
    make_socket,
    new_incarnation,
    send_frames,
)

SWEEP_S = 0.25  # every actor's stream is looked at this often even without an event (its snapshot timers)
WAIT_MS = 50  # the loop wakes at least this often
FULL_STATS_EVERY = 32  # batches between two that carry an actor's full counters (as actors send them)


class SimActor:
    """One simulated actor (module docstring)."""

    def __init__(self, role: RoleProcess, p: dict[str, Any], index: int, name: str) -> None:
        net = role.cfg.net
        self.index, self.name = index, name
        self.stream = LearnerStream(role, net, p["stream"], snapshot=p.get("snapshot") or None)
        self.push = role.socket(zmq.PUSH, options(net, SocketOptions.push(sndhwm=int(p["sndhwm"])), data_path=True),
                                connect=p["proxy"])
        self.encoder = BatchEncoder(name, new_incarnation(), pack_below=DEFAULT_COPY_THRESHOLD)  # its own sequence line
        self.allowance = Allowance()
        self.version = -1
        self.made = self.sent = self.blocked = self.held = 0
        self.buffers: dict[str, np.ndarray] = {}  # the model's arrays, allocated at the first model
        self.copied = 0  # model bytes copied into them
        self.versions: list[tuple[int, float]] = []  # (version taken, time.time())
        self.pauses: list[tuple[int, bool, float]] = []  # (control seq, paused, time.time()): each paused, each resume
        self.paused = False
        self.done = False
        self.created = time.monotonic()
        self.first_model_s: float | None = None  # from its stream's making to its first model
        self.offset = index * 7  # actors start at different batches

    def service(self) -> None:
        """Take the stream's control, then its newest model (and the control that waited for it)."""
        self.stream.take_control(self._control)
        msg, _ = self.stream.newest_model()
        if msg is None:
            return
        for key, array in msg.arrays.items():
            buf = self.buffers.get(key)
            if buf is None or buf.shape != array.shape or buf.dtype != array.dtype:
                buf = self.buffers[key] = np.empty_like(array)
            np.copyto(buf, array)
            self.copied += array.nbytes
        self.version = msg.version
        self.versions.append((msg.version, time.time()))
        if self.first_model_s is None:
            self.first_model_s = time.monotonic() - self.created
        self.stream.take_control(self._control)

    def _control(self, msg: Message) -> None:
        self.allowance.observe(msg, self.made)
        paused = msg.meta.get("pause") is True
        if paused or paused != self.paused:  # every paused control (a pause it missed the end of goes on)
            self.pauses.append((msg.seq, paused, time.time()))
        self.paused = paused
        self.done = self.done or bool(msg.meta.get("done"))

    def send(self, messages: list[dict[str, np.ndarray]], started: float) -> bool:
        """Send its next batch unless it must hold; whether one went."""
        if self.version < 0 or self.allowance.reached(self.made):
            self.held += 1
            return False
        arrays = messages[(self.offset + self.sent) % len(messages)]
        rows = len(arrays["reward"])
        meta = actor_meta(self.index, self.sent, rows, self.version, self.stream.versions.incarnation,
                          time.monotonic() - started, full=self.sent % FULL_STATS_EVERY == 0)
        meta["grants"] = self.allowance.stamp()
        frames = self.encoder.encode(self.sent, self.version, arrays, meta)
        try:
            send_frames(self.push, frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            self.blocked += 1  # its proxy holds it back: the batch is made again later
            return False
        self.sent += 1
        self.made += rows
        return True

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "versions": self.versions, "pauses": self.pauses, "sent": self.sent,
                "made": self.made, "blocked": self.blocked, "held": self.held, "copied": self.copied,
                "first_model_s": self.first_model_s, "asked": self.stream.asked,
                "snapshot_models": self.stream.snapshot_models, "bad": self.stream.bad}


def sim_host(p: dict[str, Any], stop: StopFlag) -> dict[str, Any]:
    """Helper process: ``p["count"]`` simulated actors of one host (module docstring)."""
    if p.get("idle"):  # another machine in a real run: only the CPU the learner leaves (before any thread starts)
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except (OSError, AttributeError):
            pass
    cfg = child_config(p)
    messages = load_messages(p["messages"])
    role = RoleProcess(cfg, f"simhost-{p['host']}")
    started = time.monotonic()
    deadline = started + float(p["timeout_s"])
    first, count, prefix = int(p["first"]), int(p["count"]), str(p.get("prefix", "sim"))
    actors: list[SimActor] = []
    try:
        actors = [SimActor(role, p, first + k, f"{prefix}-{first + k}") for k in range(count)]
        bench = role.socket(zmq.SUB, SocketOptions(subscribe=(b"",), rcvhwm=100), connect=p["control"])
        report = role.socket(zmq.PUSH, SocketOptions(sndhwm=100), connect=p["report"], linger_ms=1000)
        poller = zmq.Poller()
        owner: dict[Any, SimActor] = {}
        for actor in actors:
            for sock in (actor.stream.control_sub, actor.stream.model_sub, actor.stream.snap):
                if sock is not None:
                    poller.register(sock, zmq.POLLIN)
                    owner[sock] = actor
        poller.register(bench, zmq.POLLIN)
        rate, ready = 0.0, False
        want: int | None = None  # a version the bench waits for every actor to hold
        interval = 0.0  # seconds between one actor's batches; 0: silent
        due: list[tuple[float, int]] = []
        sweep = Every(SWEEP_S)
        rng = np.random.default_rng(first)
        while not stop.set and time.monotonic() < deadline:
            wait = WAIT_MS
            if due:
                wait = max(0, min(wait, int((due[0][0] - time.monotonic()) * 1000)))
            events = dict(poller.poll(wait))
            touched = actors if sweep() else {owner[s] for s in events if s in owner}
            for actor in touched:
                actor.service()
            if bench in events:
                while True:
                    try:
                        command = json.loads(bench.recv(zmq.NOBLOCK))
                    except zmq.Again:
                        break
                    if "want" in command:  # report once every actor holds this version (or a newer one)
                        want = int(command["want"])
                        continue
                    if float(command.get("rate", 0.0)) != rate:
                        rate = float(command["rate"])
                        rows = int(p["n_buffer"])
                        interval = rows / rate if rate > 0 else 0.0
                        now = time.monotonic()  # each actor starts at a random point of its interval
                        due = [(now + float(rng.uniform(0, interval)), i) for i in range(len(actors))] \
                            if interval > 0 else []
                        heapq.heapify(due)
            if not ready and all(a.version >= 0 for a in actors):
                ready = True
                report.send_json({"ready": int(p["host"]), "first_model_s": [a.first_model_s for a in actors]})
            if want is not None and all(a.version >= want for a in actors):
                report.send_json({"holding": int(p["host"]), "version": want})
                want = None
            now = time.monotonic()
            while due and due[0][0] <= now:
                t, i = heapq.heappop(due)
                actors[i].send(messages, started)
                # a held or blocked actor steps on from now (no backlog to make up), as an actor does
                heapq.heappush(due, (max(t + interval, now - interval), i))
            if actors and all(a.done for a in actors):
                break
    finally:
        result = {"host": p["host"], "actors": [a.record() for a in actors], "wall_s": time.monotonic() - started}
        role.close()
    return result


class Probe(threading.Thread):
    """A subscriber on the learner's own XPUB, unconflated: when each model version and each change
    of the pause went out (``time.time``), and the model's size as it is sent."""

    def __init__(self, net: Any, address: str) -> None:
        super().__init__(name="scale-probe", daemon=True)
        self.ctx = zmq.Context(io_threads=1)
        self.model_limits, self.control_limits = limits(net, MODEL), limits(net, CONTROL)
        self.models = make_socket(self.ctx, zmq.SUB, SocketOptions.models(self.model_limits, conflate=False,
                                                                         rcvhwm=64), connect=address)
        self.control = make_socket(self.ctx, zmq.SUB, SocketOptions.control(self.control_limits, conflate=False,
                                                                           rcvhwm=10_000), connect=address)
        self.published: dict[int, float] = {}  # version -> when it first went out
        self.model_bytes = 0  # the newest model's frame, bytes
        self.pauses: list[tuple[int, bool, float]] = []  # (seq, paused, time.time()) at each change
        self.controls = 0
        self._paused: bool | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.models, zmq.POLLIN)
        poller.register(self.control, zmq.POLLIN)
        while not self._halt.is_set():
            events = dict(poller.poll(50))
            now = time.time()
            if self.control in events:
                while True:
                    try:
                        frame = self.control.recv(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    try:
                        msg = decode([frame], self.control_limits)
                    except WireError:
                        continue
                    self.controls += 1
                    paused = msg.meta.get("pause") is True
                    if paused != self._paused:
                        self.pauses.append((msg.seq, paused, now))
                        self._paused = paused
            if self.models in events:
                while True:
                    try:
                        frame = self.models.recv(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    try:
                        msg = decode([frame], self.model_limits)
                    except WireError:
                        continue
                    self.published.setdefault(msg.version, now)
                    self.model_bytes = len(frame.buffer)

    def close(self) -> None:
        self._halt.set()
        self.join(5.0)
        self.models.close(linger=0)
        self.control.close(linger=0)
        self.ctx.term()
