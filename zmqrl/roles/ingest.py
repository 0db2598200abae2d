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
whenever — can fix or break what replay stores. A batch whose image frames came once
(:mod:`zmqrl.wire.compact`: ``frames`` and per-field indices, maybe compressed) has its stacks
rebuilt here, every size bounded first (a decompression bomb or an index past its frames is
refused as ``compress`` or ``compact``), and is then checked like any other.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

import numpy as np
import zmq

from zmqrl.config import Config
from zmqrl.core import ReplayBuffer
from zmqrl.replay.uniform import UniformReplay
from zmqrl.roles.net import limits
from zmqrl.roles.peers import meta_problem
from zmqrl.wire import (
    BATCH,
    BUNDLE,
    DEFAULT_COPY_THRESHOLD,
    EVAL,
    HELLO,
    STATS,
    BatchSpec,
    BoundedReader,
    KeyBinding,
    Message,
    PeerTable,
    RateLimitedLog,
    WireError,
    check_batch_spec,
    decode,
    peer_key,
    unbundle,
)
from zmqrl.wire.compact import FRAMES_META, expand, is_compact

log = logging.getLogger("zmqrl")

GROUP_BYTES = 1 << 20  # join batches into one replay.add up to this size (beyond it the copy costs more)
# data messages expected smaller than this are received as bytes (actors pack them into one frame):
# zero-copy frames cost more
COPY_BELOW = DEFAULT_COPY_THRESHOLD
HINTS = {"version": " (the sender runs a zmqrl that speaks another protocol version: run one version everywhere)",
         "schema": " (the sender's config does not match this run's: env.id, env wrappers or agent.algo)"}


class ValueCheck:
    """Whether a batch's values mean something: every field listed in ``limits`` (the algorithm's
    :meth:`~zmqrl.agents.base.Algorithm.value_limits`) inside its bounds, NaN and infinities never.

    Fields whose dtype cannot leave their bounds (uint8 frames, say) are not looked at; a field
    that need only be finite costs one float64 sum (NaN or an infinity makes it non-finite), a
    bounded one its minimum and maximum.
    """

    def __init__(self, spec: BatchSpec, limits: dict[str, tuple[float, float]]) -> None:
        self.finite: list[str] = []
        self.bounded: list[tuple[str, float, float]] = []
        for key, (lo, hi) in limits.items():
            if key not in spec:
                continue
            dtype = np.dtype(spec[key][0])
            if dtype.kind in "iu" and lo <= np.iinfo(dtype).min and np.iinfo(dtype).max <= hi:
                continue
            if dtype.kind == "b" and lo <= 0 and hi >= 1:
                continue
            if lo == -np.inf and hi == np.inf:
                if dtype.kind == "f":
                    self.finite.append(key)
            else:
                self.bounded.append((key, lo, hi))

    def problem(self, arrays: dict[str, np.ndarray]) -> str | None:
        """What is out of bounds in ``arrays`` (naming the field), or None. Initial priorities, where a
        batch has them, must be finite and not negative."""
        priority = arrays.get("priority")
        if priority is not None and priority.size:
            low = priority.min()
            if not (low >= 0 and np.isfinite(np.add.reduce(priority, axis=None, dtype=np.float64))):
                return f"priority holds {low if not low >= 0 else 'a non-finite value'}, not a priority"
        for key in self.finite:
            a = arrays[key]
            if a.size and not np.isfinite(np.add.reduce(a, axis=None, dtype=np.float64)):
                return f"{key} holds a non-finite value"
        for key, lo, hi in self.bounded:
            a = arrays[key]
            if a.size:
                low, high = a.min(), a.max()
                if not (lo <= low and high <= hi):
                    return f"{key} holds values outside [{lo:g}, {hi:g}] (from {low} to {high})"
        return None


class Receiver:
    """Reads, decodes and validates what has arrived on the data and evaluation sockets.

    A message is checked for form (:mod:`zmqrl.wire`), against the run's batch spec, and for
    meaning: values inside the algorithm's bounds (:class:`ValueCheck`), meta numbers finite and in
    range (:func:`~zmqrl.roles.peers.meta_problem`), and under CURVE the sender's name bound to the
    key that first used it. A bundle's batches are checked together and, where that fails, one by
    one, so one actor's bad batch never costs the others theirs. Every refusal is counted by reason.
    """

    def __init__(self, data: zmq.Socket, evals: zmq.Socket, cfg: Config, spec: BatchSpec,
                 value_limits: dict[str, tuple[float, float]] | None = None) -> None:
        self.data, self.evals = data, evals
        self.spec = spec
        self.data_limits = limits(cfg.net, BATCH, BUNDLE, STATS, HELLO)
        item_bytes = sum(np.dtype(dtype).itemsize * int(np.prod(shape)) for dtype, shape in spec.values())
        keyed = cfg.net.security == "curve"  # a frame's User-Id (the sender's key) needs zmq.Frame objects
        copy_data = item_bytes * cfg.actor.n_buffer < COPY_BELOW and not keyed  # CartPole: 8 us less per batch
        self.eval_limits = limits(cfg.net, EVAL)
        self.data_reader = BoundedReader(data, self.data_limits.max_frames, copy=copy_data)
        self.eval_reader = BoundedReader(evals, self.eval_limits.max_frames, copy=not keyed)
        self.values = ValueCheck(spec, value_limits or {})
        self.keys = KeyBinding(cfg.net.max_peers, cfg.net.peer_idle_s)
        self.poller = zmq.Poller()
        self.poller.register(data, zmq.POLLIN)
        self.poller.register(evals, zmq.POLLIN)
        self.rejected: collections.Counter[str] = collections.Counter()
        self.bytes = 0
        self.bundles = 0  # proxies' bundles taken apart (their batches are counted as batches)
        self.rows = 0  # transitions of the batches received (``bytes / rows``: bytes per transition on the wire)
        self.compact_batches = 0  # batches that came with image frames once (and their frames)
        self.frames = 0
        self.waited_s = 0.0  # how long the last receive waited for a first message
        self.ratelog = RateLimitedLog(log, interval=10.0)

    def receive(self, timeout: float = 0.0, max_messages: int = 256) -> list[Message]:
        """Valid messages that have arrived (at most ``max_messages`` read), waiting up to ``timeout`` s
        (the time spent waiting is left in :attr:`waited_s`)."""
        started = time.perf_counter()
        ready = dict(self.poller.poll(int(timeout * 1000)))
        self.waited_s = time.perf_counter() - started if timeout > 0 else 0.0
        messages: list[Message] = []
        if self.evals in ready:
            messages += self._read(self.eval_reader, self.eval_limits, "eval", max_messages)
        if self.data in ready:
            messages += self._read(self.data_reader, self.data_limits, "data", max_messages)
        return messages

    def drain(self, seconds: float) -> list[Message]:
        """At shutdown: what is still queued on the data socket, read for at most ``seconds``."""
        messages: list[Message] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            burst = self._read(self.data_reader, self.data_limits, "data", 256)
            if not burst and not self.data.poll(0, zmq.POLLIN):
                break
            messages += burst
        return messages

    def _read(self, reader: BoundedReader, lim: Any, where: str, max_messages: int) -> list[Message]:
        messages = []
        for _ in range(max_messages):
            try:
                frames = reader.read()
            except WireError as exc:
                self.refuse(exc.reason, where, "?", str(exc))
                continue
            if frames is None:
                break
            messages += self._decode(frames, lim, where)
        return messages

    def refuse(self, reason: str, where: str, sender: str, why: str) -> None:
        """Count a refused message (or batch) under ``reason`` and log it, rate-limited per reason and sender."""
        self.rejected[reason] += 1
        self.ratelog.warn(f"bad-{where}-{reason}-{sender}", f"learner: dropped a bad message from {sender} on the "
                                                            f"{where} socket: {why}{HINTS.get(reason, '')}")

    def _decode(self, frames: list[Any], lim: Any, where: str) -> list[Message]:
        """The message ``frames`` hold (a bundle's batches, taken apart), less what is refused."""
        sender = "?"
        compact = False
        try:
            msg = decode(frames, lim)
            sender = msg.sender
            compact = msg.kind in (BATCH, BUNDLE) and is_compact(msg.arrays)
            if compact:  # frames once: each batch taken apart and its stacks rebuilt on its own, below
                parts = unbundle(msg) if msg.kind == BUNDLE else [msg]
            else:
                rows = check_batch_spec(msg, self.spec) if msg.kind in (BATCH, BUNDLE) else 0
                parts = unbundle(msg, rows) if msg.kind == BUNDLE else [msg]
        except WireError as exc:
            self.refuse(exc.reason, where, sender, str(exc))
            return []
        key = peer_key(frames)
        if not self.keys.allows(msg.sender, key):
            self.refuse("key", where, sender, "its name was first used by another CURVE key")
            return []
        self.bundles += msg.kind == BUNDLE
        self.bytes += msg.nbytes
        if msg.kind not in (BATCH, BUNDLE):
            return parts
        if compact:
            parts = self._expand(parts, where)
        self.rows += sum(len(part.arrays["reward"]) if "reward" in part.arrays else 0 for part in parts)
        # one pass over a bundle; part by part only if it fails (compact ones: part by part)
        whole = self.values.problem(msg.arrays) if not compact else ""
        kept = []
        for part in parts:
            problem = None if whole is None else self.values.problem(part.arrays)
            if problem is not None:
                self.refuse("values", where, part.sender, f"batch {part.seq}: {problem}")
            elif (problem := meta_problem(part.meta)) is not None:
                self.refuse("meta", where, part.sender, f"batch {part.seq}: meta {problem}")
            elif part is not msg and not self.keys.allows(part.sender, key):
                self.refuse("key", where, part.sender, "its name was first used by another CURVE key")
            else:
                kept.append(part)
        return kept

    def wire_stats(self) -> dict[str, Any]:
        """What batches cost on the wire: bytes per transition received, and the batches that brought
        their image frames once (with frames per transition among them)."""
        return {"transitions": self.rows, "bytes_per_transition": round(self.bytes / max(self.rows, 1), 1),
                "compact_batches": self.compact_batches, "frames": self.frames}

    def _expand(self, parts: list[Message], where: str) -> list[Message]:
        """Compact batches (image frames once, :mod:`zmqrl.wire.compact`) with their stacks rebuilt
        and checked against the run's batch spec; each one that does not fit is refused on its own."""
        out = []
        for part in parts:
            try:
                full = expand(part, self.spec, self.data_limits)
                check_batch_spec(full, self.spec)
            except WireError as exc:
                self.refuse(exc.reason, where, part.sender, f"batch {part.seq}: {exc}")
                continue
            self.compact_batches += 1
            raw = part.arrays.get("frames")
            self.frames += len(raw) if raw is not None else _frame_count(part)
            out.append(full)
        return out


def _frame_count(part: Message) -> int:
    """Frames a compact batch brought (a compressed one says how many in its meta)."""
    count = part.meta.get(FRAMES_META)
    return count if type(count) is int else 0


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


FRAMES_PER_ITEM = 2  # new image frames a sender's transitions may take in replay, on average (honest: ~1)
FRAME_SLACK = 512  # ... plus this many (a sender's first batches bring whole stacks: frame_stack per env)


class ReplayWriter:
    """Inserts checked batches into replay, in order, in as few ``add`` calls as it can (each
    call has a fixed cost several times that of copying a small batch).

    Where replay keeps image frames once (a frame pool), each sender's batches go in one by one
    against a budget of new frames: at most :data:`FRAMES_PER_ITEM` per transition it has sent,
    plus :data:`FRAME_SLACK`. Consecutive observations share all frames but one, so honest
    actors use about one per transition; frames that share nothing (random bytes) would take
    ``2 * frame_stack`` each and multiply replay's memory.
    """

    def __init__(self, replay: ReplayBuffer, max_peers: int = 1024, idle_s: float = 600.0) -> None:
        self.replay = replay
        self.rejected = 0  # batches replay refused (e.g. bad priorities)
        self.rejected_frames = 0  # batches refused for bringing more new frames than their sender's budget
        self.pooled = isinstance(replay, UniformReplay) and bool(replay.frame_keys)
        self._frames: PeerTable[list[int]] = PeerTable(lambda: [0, 0], max_peers, idle_s)  # sender: [items, frames]
        self.ratelog = RateLimitedLog(log, interval=10.0)

    def insert(self, batches: list[Message]) -> list[Message]:
        """Insert ``batches``; returns those that went in. Consecutive ones are joined into one
        ``add``; where that fails, each goes in on its own, so only a batch that does not fit is
        rejected."""
        added: list[Message] = []
        for group in _groups(batches) if not self.pooled else [[m] for m in batches]:
            if len(group) > 1:
                arrays = {k: np.concatenate([m.arrays[k] for m in group]) for k in group[0].arrays}
                if self._add(arrays, None):
                    added += group
                    continue
            added += [m for m in group if self._add(m.arrays, m.sender)]
        return added

    def _add(self, arrays: dict[str, np.ndarray], sender: str | None) -> bool:
        """One ``replay.add``; a batch (``sender`` given) that does not fit is counted and logged."""
        arrays = dict(arrays)
        priorities = arrays.pop("priority", None)
        budget = self._frames.admit(sender) if self.pooled and sender is not None else None
        n = len(arrays["reward"]) if "reward" in arrays else 0
        try:
            if budget is None:
                self.replay.add(arrays, priorities=priorities)
            else:
                allowed = FRAMES_PER_ITEM * (budget[0] + n) + FRAME_SLACK - budget[1]
                self.replay.add(arrays, priorities=priorities, max_new_frames=max(0, allowed))
                budget[0] += n
                budget[1] += self.replay.new_frames
        except (ValueError, IndexError) as exc:
            if sender is not None:
                if "new frames" in str(exc):
                    self.rejected_frames += 1
                else:
                    self.rejected += 1
                self.ratelog.warn(f"replay-{sender}", f"learner: batch from {sender} does not fit replay: {exc}")
            return False
        return True
