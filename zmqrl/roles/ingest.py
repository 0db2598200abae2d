"""The learner's intake: read what has arrived, validate it, and move batches into replay.

:class:`Receiver` runs on the optimisation thread, between steps, a burst of messages at a time.
ZeroMQ's own I/O thread already receives in the background without the GIL; a Python receiver
thread took the GIL at every message and stalled the optimiser's many short torch calls (on two
busy cores the learner kept ~0.7 of its idle step rate while ingesting 4 actors' batches with
one, ~0.95 without; ``zmqrl bench --only learner``). Back-pressure is as before: while the
learner is not reading, ZeroMQ's bounded queues (``rcvhwm``) fill and the senders block, so
memory stays bounded everywhere.

Every batch is checked against the run's batch spec (fields, dtypes, item shapes follow from the
config's env spaces and algorithm) before it reaches replay, so no batch — whoever sends it and
whenever — can fix or break what replay stores.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

import numpy as np
import zmq

from zmqrl.config import Config
from zmqrl.roles.common import limits
from zmqrl.wire import (
    BATCH,
    BUNDLE,
    DEFAULT_COPY_THRESHOLD,
    EVAL,
    HELLO,
    STATS,
    BatchSpec,
    Message,
    RateLimitedLog,
    WireError,
    check_batch_spec,
    decode,
    unbundle,
)

log = logging.getLogger("zmqrl")

GROUP_BYTES = 1 << 20  # join batches into one replay.add up to this size (beyond it the copy costs more)
# data messages expected smaller than this are received as bytes (actors pack them into one frame):
# zero-copy frames cost more
COPY_BELOW = DEFAULT_COPY_THRESHOLD
HINTS = {"version": " (the sender runs a zmqrl that speaks another protocol version: run one version everywhere)",
         "schema": " (the sender's config does not match this run's: env.id, env wrappers or agent.algo)"}


class Receiver:
    """Reads, decodes and validates what has arrived on the data and evaluation sockets."""

    def __init__(self, data: zmq.Socket, evals: zmq.Socket, cfg: Config, spec: BatchSpec) -> None:
        self.data, self.evals = data, evals
        self.spec = spec
        self.data_limits = limits(cfg.net, BATCH, BUNDLE, STATS, HELLO)
        item_bytes = sum(np.dtype(dtype).itemsize * int(np.prod(shape)) for dtype, shape in spec.values())
        self.copy_data = item_bytes * cfg.actor.n_buffer < COPY_BELOW  # CartPole: 8 us less per batch
        self.eval_limits = limits(cfg.net, EVAL)
        self.poller = zmq.Poller()
        self.poller.register(data, zmq.POLLIN)
        self.poller.register(evals, zmq.POLLIN)
        self.rejected: collections.Counter[str] = collections.Counter()
        self.bytes = 0
        self.bundles = 0  # proxies' bundles taken apart (their batches are counted as batches)
        self.ratelog = RateLimitedLog(log, interval=10.0)

    def receive(self, timeout: float = 0.0, max_messages: int = 256) -> list[Message]:
        """Valid messages that have arrived (at most ``max_messages`` read), waiting up to ``timeout`` s."""
        ready = dict(self.poller.poll(int(timeout * 1000)))
        messages: list[Message] = []
        if self.evals in ready:
            messages += self._read(self.evals, self.eval_limits, "eval", max_messages)
        if self.data in ready:
            messages += self._read(self.data, self.data_limits, "data", max_messages, self.copy_data)
        return messages

    def drain(self, seconds: float) -> list[Message]:
        """At shutdown: what is still queued on the data socket, read for at most ``seconds``."""
        messages: list[Message] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            burst = self._read(self.data, self.data_limits, "data", 256, self.copy_data)
            if not burst and not self.data.poll(0, zmq.POLLIN):
                break
            messages += burst
        return messages

    def _read(self, sock: zmq.Socket, lim: Any, where: str, max_messages: int, copy: bool = False) -> list[Message]:
        messages = []
        for _ in range(max_messages):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=copy)
            except zmq.Again:
                break
            messages += self._decode(frames, lim, where)
        return messages

    def _decode(self, frames: list[Any], lim: Any, where: str) -> list[Message]:
        """The message ``frames`` hold (a bundle's batches, taken apart), or none if it is bad."""
        sender = "?"
        try:
            msg = decode(frames, lim)
            sender = msg.sender
            rows = check_batch_spec(msg, self.spec) if msg.kind in (BATCH, BUNDLE) else 0
            parts = unbundle(msg, rows) if msg.kind == BUNDLE else [msg]
        except WireError as exc:
            self.rejected[exc.reason] += 1
            self.ratelog.warn(f"bad-{where}-{exc.reason}", f"learner: dropped a bad message from {sender} on the "
                                                           f"{where} socket: {exc}{HINTS.get(exc.reason, '')}")
            return []
        self.bundles += msg.kind == BUNDLE
        self.bytes += msg.nbytes
        return parts


def _groups(batches: list[Message]) -> list[list[Message]]:
    """Runs of consecutive batches that can be joined: with or without priorities alike, small."""
    groups: list[list[Message]] = []
    last: tuple[str, ...] | None = None
    size = 0
    for msg in batches:
        sig = tuple(msg.arrays)
        if groups and sig == last and size + msg.nbytes <= GROUP_BYTES:
            groups[-1].append(msg)
            size += msg.nbytes
        else:
            groups.append([msg])
            last, size = sig, msg.nbytes
    return groups


class ReplayWriter:
    """Inserts checked batches into replay, in order, in as few ``add`` calls as it can (each
    call has a fixed cost several times that of copying a small batch)."""

    def __init__(self, replay: Any) -> None:
        self.replay = replay
        self.rejected = 0  # batches replay refused (e.g. bad priorities)
        self.ratelog = RateLimitedLog(log, interval=10.0)

    def insert(self, batches: list[Message]) -> list[Message]:
        """Insert ``batches``; returns those that went in. Consecutive ones are joined into one
        ``add``; where that fails, each goes in on its own, so only a batch that does not fit is
        rejected."""
        added: list[Message] = []
        for group in _groups(batches):
            if len(group) > 1:
                arrays = {k: np.concatenate([m.arrays[k] for m in group]) for k in group[0].arrays}
                counted = getattr(self.replay, "priorities_rejected", None)
                if self._add(arrays, None):
                    added += group
                    continue
                if counted is not None:  # the batches are tried again one by one: count them once
                    self.replay.priorities_rejected = counted
            added += [m for m in group if self._add(m.arrays, m.sender)]
        return added

    def _add(self, arrays: dict[str, np.ndarray], sender: str | None) -> bool:
        """One ``replay.add``; a batch (``sender`` given) that does not fit is counted and logged."""
        arrays = dict(arrays)
        priorities = arrays.pop("priority", None)
        try:
            self.replay.add(arrays, priorities=priorities)
        except (ValueError, IndexError) as exc:
            if sender is not None:
                self.rejected += 1
                self.ratelog.warn(f"replay-{sender}", f"learner: batch from {sender} does not fit replay: {exc}")
            return False
        return True
