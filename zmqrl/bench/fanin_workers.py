"""The fanin group's helper processes (see :mod:`zmqrl.bench.fanin`): a prefilled learner, the learner's intake
timed alone, and sender processes that offer the rate the bench asks for over a control socket."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from zmqrl.bench.data import TRANSITION_KEYS
from zmqrl.bench.feeders import Control, actor_meta
from zmqrl.bench.harness import (
    HOST,
    BenchError,
    child_config,
    load_arrays,
)
from zmqrl.bench.learner import learner_config, prefilled_learner
from zmqrl.roles.net import limits, options
from zmqrl.run.lifecycle import Every, StopFlag
from zmqrl.wire import (
    BATCH,
    CONTROL,
    DEFAULT_COPY_THRESHOLD,
    MODEL,
    BatchEncoder,
    SocketOptions,
    VersionTracker,
    drain_latest_model,
    encode,
    encode_bundle,
    make_socket,
    new_incarnation,
    pack,
    peek,
    send_frames,
)

GOAL_RATE = 100_000.0  # transitions/s from 64 senders (the goal)
SEQ = b'"seq":0,'  # where a pre-encoded header's sequence number goes
TICK_S = 0.01  # a sender process sends what is due this often (a few batches per wake-up, not one)
INTAKE_PASSES = 5



def _pool_batch(pool: dict[str, np.ndarray], slot: int, n_buffer: int) -> dict[str, np.ndarray]:
    """``n_buffer`` consecutive transitions (with priorities) of ``pool``, from a place ``slot`` picks."""
    lo = (slot * n_buffer) % (len(pool["reward"]) - n_buffer)
    return {k: pool[k][lo:lo + n_buffer] for k in (*TRANSITION_KEYS, "priority")}


def learn(p: dict[str, Any], stop: StopFlag) -> dict[str, Any]:
    """Helper process: the real Learner, replay prefilled, bound at ``p``'s addresses, until stopped."""
    cfg = learner_config(Path(p["config"]), *p["overrides"])
    learner = prefilled_learner(cfg, Path(p["run_dir"]), load_arrays(p["pool"]), (p["data"], p["model"], p["eval"]))
    summary = learner.run(stop)
    return {k: summary.get(k) for k in ("opt_steps", "transitions_inserted", "wall_s")}


def intake(p: dict[str, Any], stop: StopFlag) -> dict[str, Any]:
    """Helper process: the learner's intake alone, timed on its thread. The real Learner (replay
    prefilled, not training) takes ``p["batches"]`` queued batches from ``p["senders"]`` senders (each
    its own name, incarnation, sequence and actor meta) off its data socket into replay, ``INTAKE_PASSES``
    times; returns its thread's CPU per batch in each pass. With ``p["bundle"]`` > 1 they come joined
    that many to a message, as a proxy joins them (:func:`~zmqrl.wire.encode_bundle`)."""
    cfg = learner_config(Path(p["config"]), *p["overrides"])
    pool = load_arrays(p["pool"])
    anywhere = f"tcp://{HOST}:*"
    learner = prefilled_learner(cfg, Path(p["run_dir"]), pool, (anywhere, anywhere, anywhere))
    n_buffer, batches, senders, bundle = cfg.actor.n_buffer, int(p["batches"]), int(p["senders"]), int(p["bundle"])
    # as actors send them: packed when small, all their stats on one batch per stats interval at the goal's rate
    encoders = [BatchEncoder(f"fanin-{i}", new_incarnation(), pack_below=DEFAULT_COPY_THRESHOLD)
                for i in range(senders)]
    full_every = max(1, round(GOAL_RATE / n_buffer / senders * cfg.net.stats_interval_s))
    ctx = zmq.Context(io_threads=1)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 0)  # queue a whole pass before it is timed
    push.connect(learner.endpoints["data"])
    per_batch: list[float] = []
    joined: list[tuple[dict[str, Any], list[memoryview], int]] = []
    try:
        for n in range(INTAKE_PASSES):
            for k in range(n * batches, (n + 1) * batches):
                i, seq = k % senders, k // senders
                version = learner.book.version
                frames: Sequence[Any] = encoders[i].encode(
                    seq, version, _pool_batch(pool, i * 997 + seq * 61, n_buffer),
                    actor_meta(i, seq, n_buffer, version, learner.incarnation, 1.0 + seq, full=seq % full_every == 0))
                if bundle > 1:
                    header, views, _ = peek([bytes(f) for f in frames])
                    joined.append((header, views, n_buffer))
                    if len(joined) < bundle and k + 1 < (n + 1) * batches:
                        continue
                    frames, joined = encode_bundle("proxy-0", "bench", k, joined), []
                push.send_multipart(frames)
            target, cpu, deadline = learner.batches + batches, 0.0, time.monotonic() + 60.0
            while learner.batches < target and not stop.set:
                if time.monotonic() > deadline:
                    raise BenchError(f"the learner took in {learner.batches - target + batches} of {batches} "
                                     f"batches within 60s")
                started = time.thread_time()
                learner.ingest(timeout=0.05)  # (waiting in poll costs the thread no CPU)
                cpu += time.thread_time() - started
            per_batch.append(cpu / batches)
    finally:
        push.close(linger=0)
        ctx.term()
        learner.close()
    return {"per_batch_s": per_batch, "batches": learner.batches, "rejected": learner.rejected_total(),
            "actors": len(learner.peers.actors)}


class _Sender:
    """One simulated actor: a PUSH socket to a proxy, a SUB socket on the models, a header template."""

    def __init__(self, ctx: zmq.Context, p: dict[str, Any], index: int, net: Any) -> None:
        self.index, self.name, self.inc, self.seq = index, f"fanin-{index}", new_incarnation(), 0
        proxies = p["proxies"]
        self.push = make_socket(ctx, zmq.PUSH, options(net, SocketOptions.push(sndhwm=int(p["sndhwm"])),
                                                       data_path=True), connect=proxies[index % len(proxies)])
        self.sub = make_socket(ctx, zmq.SUB, options(net, SocketOptions.models(limits(net, MODEL))),
                               connect=p["models"])
        self.tracker = VersionTracker()
        self.version = -1
        self.prefix, self.suffix = b"", b""
        self.arrays: list[Any] = []

    def prepare(self, pool: dict[str, np.ndarray], n_buffer: int) -> None:
        """Encode this sender's batch once (after its first model); only ``seq`` changes per message."""
        batch = _pool_batch(pool, self.index * 997, n_buffer)
        meta = actor_meta(self.index, 0, n_buffer, self.version, self.tracker.incarnation, 1.0)
        frames = encode(BATCH, sender=self.name, incarnation=self.inc, seq=0, version=self.version, arrays=batch,
                        meta=meta)
        head = bytes(frames[0])
        if head.count(SEQ) != 1:
            raise BenchError(f"cannot find the sequence number in header {head[:80]!r}")
        before, after = head.split(SEQ)
        self.prefix, self.suffix, self.arrays = before + b'"seq":', b"," + after, frames[1:]

    def frames(self) -> list[Any]:
        """This sender's next message, packed into one frame as an actor sends small batches."""
        return [pack([self.prefix + str(self.seq).encode() + self.suffix, *self.arrays])]

    def close(self) -> None:
        self.push.close(linger=0)
        self.sub.close(linger=0)


def send_many(p: dict[str, Any], stop: StopFlag) -> dict[str, Any]:
    """Helper process: ``p["count"]`` senders; once each has the learner's first model, report ready and
    send round-robin over them at ``share`` x the total rate the bench last broadcast (0: silent)."""
    net = child_config(p).net
    pool = load_arrays(p["pool"])
    n_buffer, share = int(p["n_buffer"]), float(p["share"])
    ctx = zmq.Context(io_threads=1)
    senders = [_Sender(ctx, p, int(p["first"]) + k, net) for k in range(int(p["count"]))]
    control_sub = ctx.socket(zmq.SUB)
    control_sub.setsockopt(zmq.SUBSCRIBE, b"")
    control_sub.connect(p["control"])
    report = ctx.socket(zmq.PUSH)
    report.connect(p["report"])
    model_limits, control_limits = limits(net, MODEL), limits(net, CONTROL)
    learner_control = make_socket(ctx, zmq.SUB, options(net, SocketOptions.control(control_limits)),
                                  connect=p["models"])
    control = Control()
    sent = blocked = skipped = 0
    start = time.monotonic()
    deadline = start + float(p["timeout_s"])
    try:
        waiting = list(senders)
        while waiting and not stop.set and time.monotonic() < deadline:  # no batch before the first model
            for sender in [s for s in waiting if s.sub.poll(0, zmq.POLLIN)]:
                msg, _ = drain_latest_model(sender.sub, sender.tracker, model_limits)
                if msg is not None:
                    sender.version = msg.version
                    sender.prepare(pool, n_buffer)
                    waiting.remove(sender)
            if waiting:
                waiting[0].sub.poll(20, zmq.POLLIN)
        if waiting:
            raise BenchError(f"{len(waiting)} of {len(senders)} senders got no model")
        report.send_json({"ready": int(p["first"]), "after_s": time.monotonic() - start})
        per_msg = 0.0  # seconds between messages; 0: silent
        base_t, base_n, turn = time.monotonic(), 0, 0
        drain = Every(0.2)
        while not stop.set and not control.done and time.monotonic() < deadline:
            while control_sub.poll(0, zmq.POLLIN):
                rate = float(json.loads(control_sub.recv())["rate"]) * share
                new = n_buffer / rate if rate > 0 else 0.0
                if new != per_msg:
                    per_msg, base_t, base_n = new, time.monotonic(), 0
            if drain():  # the learner's control (``done``); models: each sender only empties its queue
                control.read(learner_control, control_limits)
                for sender in senders:
                    while sender.sub.poll(0, zmq.POLLIN):
                        sender.sub.recv(zmq.NOBLOCK)
            if per_msg <= 0:
                control_sub.poll(50, zmq.POLLIN)
                continue
            due = int((time.monotonic() - base_t) / per_msg) - base_n
            cap = max(1, int(0.25 / per_msg))  # never more than 0.25 s of backlog in one burst
            if due > cap:
                skipped += due - cap
                base_n += due - cap
                due = cap
            if due <= 0:  # what is due goes out every TICK_S (stand-ins for actors elsewhere: few wake-ups)
                control_sub.poll(int(TICK_S * 1000), zmq.POLLIN)
                continue
            for _ in range(due):
                for _ in range(len(senders)):  # the next sender whose queue has room
                    sender = senders[turn]
                    turn = (turn + 1) % len(senders)
                    try:
                        send_frames(sender.push, sender.frames(), flags=zmq.NOBLOCK)
                    except zmq.Again:
                        continue
                    sender.seq += 1
                    sent += 1
                    base_n += 1
                    break
                else:
                    blocked += 1  # every queue full: the proxies hold the senders back
                    control_sub.poll(1, zmq.POLLIN)
                    break
    finally:
        for sender in senders:
            sender.close()
        control_sub.close(linger=0)
        learner_control.close(linger=0)
        report.close(linger=0)
        ctx.term()
    return {"senders": len(senders), "sent": sent, "transitions": sent * n_buffer, "blocked": blocked,
            "skipped": skipped, "wall_s": time.monotonic() - start}
