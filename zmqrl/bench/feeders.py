"""Feeders: helper processes that behave like actors towards a real learner, for the learner rows.

A feeder subscribes to the learner's models and control, sends nothing before the first model
and the first control message (which the learner sends from its start), holds while the rate
limiter's ``pause`` is on or once a grant's ``allow`` is made, and PUSHes pre-made batches (with
an actor's meta) at up to a fixed rate, each batch as an actor sends it: CartPole's as plain
arrays, Pong's with each image frame once (:mod:`zmqrl.wire.compact`). The batches come from a
message file (:func:`save_messages`) the bench writes once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from zmqrl.bench.harness import child_config
from zmqrl.roles.fit import Allowance
from zmqrl.roles.net import limits, options
from zmqrl.run.lifecycle import StopFlag
from zmqrl.wire import (
    CONTROL,
    DEFAULT_COPY_THRESHOLD,
    MODEL,
    BatchEncoder,
    SocketOptions,
    VersionTracker,
    drain_control,
    drain_latest_model,
    make_socket,
    new_incarnation,
    send_frames,
)


class Control:
    """The learner's requests as an actor reads them from its control: pause and allowance
    (:class:`~zmqrl.roles.fit.Allowance`; ``made`` counts what was made) and ``done`` (the run is over)."""

    def __init__(self, made: Callable[[], int] = lambda: 0) -> None:
        self.made, self.done = made, False
        self.allowance = Allowance()
        self.messages = 0

    def read(self, sock: zmq.Socket, lim: Any) -> None:
        """Take what control came on ``sock`` (a control subscriber)."""
        for msg in drain_control(sock, lim)[0]:
            self.messages += 1
            self.allowance.observe(msg, self.made())
            self.done = self.done or bool(msg.meta.get("done"))

    def hold(self) -> bool:
        """Whether an actor would hold now: paused, or its allowance made."""
        return self.allowance.reached(self.made())


def actor_meta(index: int, sent: int, n_buffer: int, version: int, model_inc: str | None, wall: float,
               blocked_s: float = 0.0, paused_s: float = 0.0, full: bool = True) -> dict[str, Any]:
    """The meta an actor puts on its ``sent``-th batch: three finished episodes and its counters
    (all of them when ``full``, else ``env_steps`` alone: :meth:`~zmqrl.roles.actor.ActorStats.for_batch`)."""
    stats: dict[str, Any] = {"env_steps": (sent + 1) * n_buffer}
    if full:
        stats.update({"host": "bench-host", "episodes": 3 * (sent + 1), "batches": sent,
                      "transitions": sent * n_buffer, "bytes_sent": 0, "blocked_s": round(blocked_s, 3),
                      "paused_s": round(paused_s, 3), "model_updates": 1, "bad_models": 0, "wall_s": round(wall, 3),
                      "env_steps_per_s": (sent + 1) * n_buffer / max(wall, 1e-9)})
    return {"episodes": {"returns": [21.0, 17.0, 30.0], "lengths": [21, 17, 30]}, "actor": index,
            "max_version": version, "model_inc": model_inc, "explore": 0.4, "stats": stats}


def save_messages(path: Path, messages: list[dict[str, np.ndarray]]) -> Path:
    """Batches (each a dict of arrays, as an actor sends it) as one ``.npz`` :func:`load_messages` reads."""
    arrays: dict[str, Any] = {f"{i}/{name}": a for i, batch in enumerate(messages) for name, a in batch.items()}
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path


def load_messages(path: str | Path) -> list[dict[str, np.ndarray]]:
    out: dict[int, dict[str, np.ndarray]] = {}
    with np.load(path, allow_pickle=False) as npz:
        for key in npz.files:
            index, _, name = key.partition("/")
            out.setdefault(int(index), {})[name] = npz[key]
    return [out[i] for i in sorted(out)]


def feed(p: dict[str, Any], stop: StopFlag) -> dict[str, Any]:
    """Helper process: PUSH the batches of ``p["messages"]`` in turn (each with an actor's meta) at up to
    ``p["rate"]`` transitions/s once the first model and control have arrived, holding while the learner
    asks actors to pause (or once a grant's allowance is made) and stopping when it says the run is over."""
    net = child_config(p).net
    messages = load_messages(p["messages"])
    interval_per_row = 1.0 / float(p["rate"])
    ctx = zmq.Context(io_threads=1)
    push = make_socket(ctx, zmq.PUSH, options(net, SocketOptions.push(sndhwm=int(p["sndhwm"])), data_path=True),
                       connect=p["connect"])
    model_limits, control_limits = limits(net, MODEL), limits(net, CONTROL)
    sub = make_socket(ctx, zmq.SUB, options(net, SocketOptions.models(model_limits)), connect=p["models"])
    csub = make_socket(ctx, zmq.SUB, options(net, SocketOptions.control(control_limits)), connect=p["models"])
    tracker = VersionTracker()
    inc, name, index = new_incarnation(), f"actor-{p['index']}", int(p["index"])
    encoder = BatchEncoder(name, inc, pack_below=DEFAULT_COPY_THRESHOLD)  # as an actor sends batches
    sent = made = 0
    blocked_s, paused_s, version = 0.0, 0.0, -1
    control = Control(made=lambda: made)
    offset = index * 7  # feeders start at different batches
    start = time.monotonic()
    deadline = start + p["timeout_s"]
    first_model_s: float | None = None
    try:
        # no batch before the first model and the first control (which the learner sends from its start)
        while not stop.set and time.monotonic() < deadline and (version < 0 or not control.messages):
            control.read(csub, control_limits)
            if sub.poll(100, zmq.POLLIN):
                msg, _ = drain_latest_model(sub, tracker, model_limits)
                version = msg.version if msg is not None else version
        first_model_s = time.monotonic() - start
        next_t = time.monotonic()
        while not stop.set and not control.done and time.monotonic() < deadline:
            control.read(csub, control_limits)
            msg, _ = drain_latest_model(sub, tracker, model_limits)
            version = msg.version if msg is not None else version
            now = time.monotonic()
            if control.hold():
                csub.poll(50, zmq.POLLIN)
                paused_s += time.monotonic() - now
                next_t = time.monotonic()  # an actor steps on from where it stopped, with no backlog to make up
                continue
            if now < next_t:
                csub.poll(max(1, int(min(next_t - now, 0.05) * 1000)), zmq.POLLIN)
                continue
            arrays = messages[(offset + sent) % len(messages)]
            rows = len(arrays["reward"])
            next_t = max(next_t + rows * interval_per_row, now - 1.0)  # never burst more than 1 s of backlog
            meta = actor_meta(index, sent, rows, version, tracker.incarnation, now - start, blocked_s, paused_s)
            meta["grants"] = control.allowance.stamp()
            frames = encoder.encode(sent, version, arrays, meta)
            t0 = time.monotonic()
            while not stop.set:
                try:
                    send_frames(push, frames, flags=zmq.NOBLOCK)
                    sent += 1
                    made += rows
                    break
                except zmq.Again:
                    push.poll(100, zmq.POLLOUT)
            blocked_s += time.monotonic() - t0
    finally:
        push.close(linger=0)
        sub.close(linger=0)
        csub.close(linger=0)
        ctx.term()
    return {"sent": sent, "controls": control.messages, "transitions": made, "blocked_s": blocked_s,
            "paused_s": paused_s, "first_model_s": first_model_s, "wall_s": time.monotonic() - start}
