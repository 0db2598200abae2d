"""The learner's intake: receive, check, account and admit what peers send, in a thread beside the loop.

:class:`Intake` owns the data and evaluation sockets. For each message it reads it checks the
form (:mod:`zmqrl.wire`), the run's batch spec, the meaning of values and meta, the sender's key
under CURVE, the sequence number, the rate limiter's allowance, and for an evaluation report the
admission rules (:mod:`~zmqrl.roles.admission`); it keeps the per-sender tables (sequences,
proxies' reports, refusals by reason). What passes becomes ready work, handed to the update loop
through a bounded :class:`Handoff`: batches (:class:`Arrived`) and admitted evaluations
(:class:`Evaluation`). The loop never waits on a socket; when the handoff is full the intake
stops reading, ZeroMQ's bounded queues fill and senders block, so memory stays bounded.

A batch whose image frames came once (:mod:`zmqrl.wire.compact`) stays that way: its frames are
decompressed (bounded first), its indices checked against them and the frames fingerprinted
here, and replay interns them as they came; no stack is rebuilt. A flood of bad messages costs
this thread, not the updates.

Why a thread and not a process: the loop and the intake share the replay's slots only through
the handoff, and what the intake does in bulk (ZeroMQ's receive, decompression, the fingerprints'
matrix product, numpy's checks) runs without the interpreter lock; a process would copy every
frame once more and move the peer tables and the allowance out of the learner. What the thread
costs the loop in the lock is measured by ``zmqrl bench --only learner`` (the fed rows against
the same learner alone).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from zmqrl.config import Config
from zmqrl.frames import Fingerprints, frame_layout
from zmqrl.roles.admission import EvalAdmission, reported_point
from zmqrl.roles.beside import Beside
from zmqrl.roles.net import limits
from zmqrl.roles.peers import episodes, meta_problem, plain
from zmqrl.roles.ratelimit import Allowances
from zmqrl.run.bookkeeping import ModelPoint
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
    SequenceTracker,
    WireError,
    check_batch_spec,
    decode,
    peer_key,
    unbundle,
)
from zmqrl.wire.compact import CompactBatch, is_compact, open_compact

log = logging.getLogger("zmqrl")

# data messages expected smaller than this are received as bytes (actors pack them into one frame):
# zero-copy frames cost more
COPY_BELOW = DEFAULT_COPY_THRESHOLD
BURST = 256  # messages read per wake-up before the thread looks at its other duties
HANDOFF_ITEMS = 256  # ready batches waiting for the loop before the intake stops reading
HANDOFF_BYTES = 256 << 20  # ... or ready bytes
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
        batch has them, must be finite and not negative. Fields ``arrays`` lacks are not looked at."""
        priority = arrays.get("priority")
        if priority is not None and priority.size:
            low = priority.min()
            if not (low >= 0 and np.isfinite(np.add.reduce(priority, axis=None, dtype=np.float64))):
                return f"priority holds {low if not low >= 0 else 'a non-finite value'}, not a priority"
        for key in self.finite:
            a = arrays.get(key)
            if a is not None and a.size and not np.isfinite(np.add.reduce(a, axis=None, dtype=np.float64)):
                return f"{key} holds a non-finite value"
        for key, lo, hi in self.bounded:
            a = arrays.get(key)
            if a is not None and a.size:
                low, high = a.min(), a.max()
                if not (lo <= low and high <= hi):
                    return f"{key} holds values outside [{lo:g}, {hi:g}] (from {low} to {high})"
        return None


@dataclass
class Arrived:
    """A batch that passed every check of the intake, for replay: ``msg`` (its arrays the fields
    stored as given), and where its image frames came once, ``frames`` with the ``indices`` of each
    image field and the frames' ``fingerprints``."""

    msg: Message
    rows: int
    frames: np.ndarray | None = None
    indices: dict[str, np.ndarray] = field(default_factory=dict)
    fingerprints: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        arrays = [*self.msg.arrays.values(), *self.indices.values()]
        return sum(a.nbytes for a in arrays) + (self.frames.nbytes if self.frames is not None else 0)


@dataclass
class Evaluation:
    """An evaluation report the admission counted: its model version, where the run was when that
    model was made, and its episodes."""

    version: int
    at: ModelPoint
    returns: list[float]
    lengths: list[int]


class Handoff:
    """The bounded queue from the intake to the loop: items and their bytes; the intake checks
    :meth:`room` before it reads, the loop takes what is there without waiting (or waits on it,
    never on a socket, when it has nothing else to do)."""

    def __init__(self, max_items: int = HANDOFF_ITEMS, max_bytes: int = HANDOFF_BYTES) -> None:
        self.max_items, self.max_bytes = max_items, max_bytes
        self._items: collections.deque[tuple[Arrived | Evaluation, int]] = collections.deque()
        self._bytes = 0
        self._ready = threading.Condition()
        self.full_s = 0.0  # time the intake spent with the handoff full (not reading)

    def put(self, item: Arrived | Evaluation, nbytes: int = 0) -> None:
        with self._ready:
            self._items.append((item, nbytes))
            self._bytes += nbytes
            self._ready.notify()

    def room(self) -> bool:
        return len(self._items) < self.max_items and self._bytes < self.max_bytes

    def take(self, max_items: int | None = None) -> list[Arrived | Evaluation]:
        """What is ready (at most ``max_items``), oldest first, without waiting."""
        out: list[Arrived | Evaluation] = []
        with self._ready:
            while self._items and (max_items is None or len(out) < max_items):
                item, nbytes = self._items.popleft()
                self._bytes -= nbytes
                out.append(item)
        return out

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for something to be ready; whether it is."""
        with self._ready:
            if not self._items:
                self._ready.wait(timeout)
            return bool(self._items)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        return self._bytes


class Receiver:
    """Reads, decodes and checks what has arrived on the data and evaluation sockets.

    A message is checked for form (:mod:`zmqrl.wire`), against the run's batch spec, and for
    meaning: values inside the algorithm's bounds (:class:`ValueCheck`), meta numbers finite and in
    range (:func:`~zmqrl.roles.peers.meta_problem`), and under CURVE the sender's name bound to the
    key that first used it. A bundle's batches are checked together and, where that fails, one by
    one, so one actor's bad batch never costs the others theirs. Every refusal is counted by reason.
    """

    def __init__(self, data: zmq.Socket, evals: zmq.Socket, cfg: Config, spec: BatchSpec,
                 value_limits: dict[str, tuple[float, float]] | None = None,
                 batch_problem: Callable[[dict[str, np.ndarray]], str | None] | None = None) -> None:
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
        self.batch_problem = batch_problem
        self.keys = KeyBinding(cfg.net.max_peers, cfg.net.peer_idle_s)
        self.rejected: collections.Counter[str] = collections.Counter()
        self.bytes = 0
        self.bundles = 0  # proxies' bundles taken apart (their batches are counted as batches)
        self.rows = 0  # items of the batches received (``bytes / rows``: bytes per item on the wire)
        self.compact_batches = 0  # batches that came with image frames once (and their frames)
        self.frames = 0
        self.ratelog = RateLimitedLog(log, interval=10.0)

    def read(self, evals: bool, max_messages: int = BURST, data: bool = True) -> list[tuple[Message, Any]]:
        """Valid messages that have arrived (at most ``max_messages`` of each socket read, without
        waiting), each with its opened compact frames (:class:`CompactBatch`) or None."""
        messages: list[tuple[Message, Any]] = []
        if evals:
            messages += self._read(self.eval_reader, self.eval_limits, "eval", max_messages)
        if data:
            messages += self._read(self.data_reader, self.data_limits, "data", max_messages)
        return messages

    def _read(self, reader: BoundedReader, lim: Any, where: str, max_messages: int) -> list[tuple[Message, Any]]:
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

    def _decode(self, frames: list[Any], lim: Any, where: str) -> list[tuple[Message, Any]]:
        """The message ``frames`` hold (a bundle's batches, taken apart), less what is refused."""
        sender = "?"
        compact = False
        try:
            msg = decode(frames, lim)
            sender = msg.sender
            compact = msg.kind in (BATCH, BUNDLE) and is_compact(msg.arrays)
            if compact:  # frames once: each batch taken apart and opened on its own, below
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
            return [(msg, None)]
        opened = self._open(parts, where) if compact else [(part, None) for part in parts]
        self.rows += sum(_rows(part, frames_of) for part, frames_of in opened)
        # one pass over a bundle; part by part only if it fails (compact ones: part by part)
        whole = self._problem(msg.arrays) if not compact else ""
        kept = []
        for part, frames_of in opened:
            problem = None if whole is None else self._problem(part.arrays)
            if problem is not None:
                self.refuse("values", where, part.sender, f"batch {part.seq}: {problem}")
            elif (problem := meta_problem(part.meta)) is not None:
                self.refuse("meta", where, part.sender, f"batch {part.seq}: meta {problem}")
            elif part is not msg and not self.keys.allows(part.sender, key):
                self.refuse("key", where, part.sender, "its name was first used by another CURVE key")
            else:
                kept.append((part, frames_of))
        return kept

    def _problem(self, arrays: dict[str, np.ndarray]) -> str | None:
        problem = self.values.problem(arrays)
        if problem is None and self.batch_problem is not None:
            problem = self.batch_problem(arrays)
        return problem

    def _open(self, parts: list[Message], where: str) -> list[tuple[Message, CompactBatch]]:
        """Compact batches (image frames once, :mod:`zmqrl.wire.compact`) opened and checked against the
        run's batch spec, each one that does not fit refused on its own; the message of each keeps the
        fields stored as given."""
        out = []
        for part in parts:
            try:
                opened = open_compact(part, self.spec, self.data_limits)
                rest = Message(part.kind, part.sender, part.incarnation, part.seq, part.version, opened.rest,
                               part.meta, sum(a.nbytes for a in opened.rest.values()))
                spec = {k: v for k, v in self.spec.items() if k not in opened.indices}
                check_batch_spec(rest, spec)
            except WireError as exc:
                self.refuse(exc.reason, where, part.sender, f"batch {part.seq}: {exc}")
                continue
            self.compact_batches += 1
            self.frames += len(opened.frames)
            out.append((rest, opened))
        return out

    def wire_stats(self) -> dict[str, Any]:
        """What batches cost on the wire: bytes per item received, and the batches that brought their
        image frames once (with frames per item among them)."""
        return {"transitions": self.rows, "bytes_per_transition": round(self.bytes / max(self.rows, 1), 1),
                "compact_batches": self.compact_batches, "frames": self.frames}


def _rows(part: Message, opened: CompactBatch | None) -> int:
    if opened is not None:
        return opened.rows
    reward = part.arrays.get("reward")
    return len(reward) if reward is not None else 0


class Intake(Beside):
    """The learner's intake thread (module docstring). ``now`` gives where the run is (for the
    admission of evaluations), ``published`` the newest model version handed to the publisher;
    ``fingerprint`` says whether replay keeps frames once (then the intake fingerprints them)."""

    def __init__(self, data: zmq.Socket, evals: zmq.Socket, cfg: Config, spec: BatchSpec, *,
                 value_limits: dict[str, tuple[float, float]], allowances: Allowances, admission: EvalAdmission,
                 incarnation: str, now: Callable[[], ModelPoint], published: Callable[[], int],
                 fingerprint: bool, batch_problem: Callable[[dict[str, np.ndarray]], str | None] | None = None,
                 handoff: Handoff | None = None) -> None:
        super().__init__("intake")
        net = cfg.net
        self.receiver = Receiver(data, evals, cfg, spec, value_limits, batch_problem)
        self.handoff = handoff or Handoff()
        self.allowances, self.admission = allowances, admission
        self.incarnation, self.now, self.published = incarnation, now, published
        self.sequences = SequenceTracker(net.max_peers, net.peer_idle_s)
        self.proxies: PeerTable[dict[str, Any]] = PeerTable(dict, net.max_peers, net.peer_idle_s)
        self.refused_models: PeerTable[list[str]] = PeerTable(list, net.max_peers, net.peer_idle_s)
        self.mismatches = 0  # peers that refused the learner's model as not fitting their config
        self.lock = threading.RLock()  # held while a burst is read and handled: the loop reads the tables under it
        self._prints: Fingerprints | None = None
        self._fingerprint = fingerprint
        self._drain_s = 0.0
        self.batches = self.evaluations = 0
        self.ratelog = self.receiver.ratelog

    # --- the thread --------------------------------------------------------------------------
    def work(self) -> None:
        data, evals = self.receiver.data, self.receiver.evals
        poller = zmq.Poller()
        poller.register(evals, zmq.POLLIN)
        poller.register(self.waker.fd, zmq.POLLIN)
        reading = False
        while not self.stopping:
            if self.handoff.room() != reading:
                reading = not reading
                if reading:
                    poller.register(data, zmq.POLLIN)
                else:
                    poller.unregister(data)
            started = time.monotonic()
            events = dict(poller.poll(100))
            if not reading:
                self.handoff.full_s += time.monotonic() - started
            if self.waker.fd in events:
                self.waker.clear()
            if data in events or evals in events:
                with self.lock:
                    self.take(self.receiver.read(evals in events, data=data in events))
        self._drain()

    def poll(self, timeout: float = 0.0) -> None:
        """Read and admit what arrives within ``timeout`` seconds, on the calling thread (for a learner
        driven step by step, whose intake thread does not run)."""
        data, evals = self.receiver.data, self.receiver.evals
        poller = zmq.Poller()
        poller.register(data, zmq.POLLIN)
        poller.register(evals, zmq.POLLIN)
        events = dict(poller.poll(int(timeout * 1000)))
        if events:
            with self.lock:
                self.take(self.receiver.read(evals in events, data=data in events))

    def _drain(self) -> None:
        """On the way out: what peers already sent, read for at most the time :meth:`stop` gave, whatever
        the handoff holds (the loop takes it all before its final checkpoint)."""
        deadline = time.monotonic() + self._drain_s
        while time.monotonic() < deadline:
            with self.lock:
                messages = self.receiver.read(evals=False)
                if not messages and not self.receiver.data.poll(0, zmq.POLLIN):
                    break
                self.take(messages)

    def stop(self, timeout: float = 5.0, drain_s: float = 0.0) -> None:
        """Stop reading; with ``drain_s``, first take in what peers already sent, for that long."""
        self._drain_s = drain_s
        super().stop(timeout + drain_s)

    # --- what arrived ------------------------------------------------------------------------
    def take(self, messages: Iterable[tuple[Message, CompactBatch | None]]) -> None:
        """Admit what arrived: batches in sequence and within their allowance go to the handoff (their
        frames fingerprinted), admitted evaluations too; proxies' reports and peers' hellos are kept.
        (The caller holds :attr:`lock` while it reads and this takes, so the loop's reports see whole bursts.)"""
        with self.lock:
            for msg, opened in messages:
                if msg.kind == BATCH:
                    self._batch(msg, opened)
                elif msg.kind == EVAL:
                    self._evaluation(msg)
                elif msg.kind == STATS:
                    self._proxy_stats(msg)
                elif msg.kind == HELLO:
                    self._hello(msg)

    def _batch(self, msg: Message, opened: CompactBatch | None) -> None:
        accept, _ = self.sequences.observe(msg.sender, msg.incarnation, msg.seq)
        rows = opened.rows if opened is not None else _rows(msg, None)
        if not accept:
            if self.sequences.last_refusal == "jump":
                self.receiver.refuse("seq_jump", "data", msg.sender, f"sequence number {msg.seq} lies implausibly "
                                     "far ahead of its last one (refused, not counted as lost)")
            return
        if not self.allowances.take(msg.sender, rows, msg.meta.get("grants")):
            self.receiver.refuse("over_allowance", "data", msg.sender, "it sent more than the learner allowed it "
                                 "(an actor that ignores the rate limiter's pause)")
            return
        item = Arrived(msg, rows)
        if opened is not None:
            item.frames, item.indices = opened.frames, opened.indices
            if self._fingerprint:
                item.fingerprints = self._fingerprints(opened.frames)
        self.batches += 1
        self.handoff.put(item, item.nbytes)

    def _fingerprints(self, frames: np.ndarray) -> np.ndarray:
        nbytes = int(np.prod(frame_layout(frames.shape[1:])[1], dtype=np.int64))
        if self._prints is None or self._prints.nbytes != nbytes:
            self._prints = Fingerprints(nbytes)
        return self._prints.of_frames(frames)

    def _evaluation(self, msg: Message) -> None:
        """Take an evaluation report if it is the admitted evaluator's, for a model this learner published
        (:mod:`~zmqrl.roles.admission`); refuse and count it otherwise."""
        now = self.now()
        refused = self.admission.problem(msg.sender, msg.incarnation, msg.seq, msg.version, msg.meta,
                                         self.incarnation, self.published(), now)
        if refused is not None:
            reason, why = refused
            self.receiver.refuse(reason, "eval", msg.sender, f"evaluation report not counted: {why}")
            return
        returns, lengths = episodes({"episodes": msg.meta})
        at = reported_point(msg.meta, now)
        assert at is not None  # (the admission checked it)
        self.evaluations += 1
        self.handoff.put(Evaluation(msg.version, at, returns, lengths))

    def _proxy_stats(self, msg: Message) -> None:
        """Keep a proxy's report, reduced to plain, bounded values (:func:`~zmqrl.roles.peers.plain`)."""
        table = self.proxies.admit(msg.sender)
        if table is not None:
            table.clear()
            table.update(plain(msg.meta))
            table["incarnation"] = msg.incarnation

    def _hello(self, msg: Message) -> None:
        """A peer's report that the learner's model does not fit its config: counted, kept, logged."""
        reason = msg.meta.get("refused_model")
        if not isinstance(reason, str):
            return
        self.mismatches += 1
        kept = self.refused_models.admit(msg.sender)
        if kept is not None:
            kept[:] = [reason[:1000]]
        self.ratelog.warn(f"mismatch-{msg.sender}", f"learner: {msg.sender} refused this learner's model: {reason}")

    # --- reports (the loop calls these; they hold the lock) ------------------------------------
    def rejected_total(self) -> int:
        with self.lock:
            return sum(self.receiver.rejected.values())

    def summary(self) -> dict[str, Any]:
        """What the intake counted, for the learner's summary."""
        with self.lock:
            r = self.receiver
            losses = self.sequences.losses()
            return {
                "bytes_received": r.bytes, "wire": r.wire_stats(), "bundles_received": r.bundles,
                "rejected": dict(r.rejected), "rejected_total": sum(r.rejected.values()),
                "batches_admitted": self.batches, "evaluations_admitted": self.evaluations,
                "batches_lost": sum(lost for lost, _ in losses.values()),
                "batches_dropped_old": sum(dropped for _, dropped in losses.values()),
                "peers_refused": self.sequences.refused + self.proxies.refused,
                "refused_names": sorted(self.sequences.refused_names | self.proxies.refused_names)[:8],
                "config_mismatches": self.mismatches,
                "over_allowance_transitions": self.allowances.refused_transitions,
                "lost_by_sender": {name: lost for name, (lost, _) in losses.items()},
                "dropped_by_sender": {name: dropped for name, (_, dropped) in losses.items()},
                "refused_models": {name: kept[0] for name, kept in self.refused_models.items() if kept},
                "proxies": {name: {**p, "last_seen": time.time() - (self.proxies.last_seen_s(name) or 0.0)}
                            for name, p in self.proxies.items()},
                "handoff": {"items": len(self.handoff), "bytes": self.handoff.nbytes,
                            "full_s": round(self.handoff.full_s, 3)},
                "cpu_s": round(self.cpu_s(), 3),
            }
