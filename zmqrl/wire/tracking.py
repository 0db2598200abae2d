"""Per-sender sequence tracking, model version tracking and rate-limited logging."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Generic, TypeVar

MAX_INCARNATIONS = 4  # incarnations remembered per sender name (a restart, or two processes under one name)
MAX_SEQ_GAP = 1 << 20  # a jump further ahead than this many batches is refused, not counted as lost


@dataclass
class SenderState:
    """What a :class:`SequenceTracker` remembers about one sender name."""

    incarnation: str  # the incarnation of its latest accepted message ("" until the first)
    last_seq: int  # that incarnation's last accepted sequence number
    accepted: int = 0
    lost: int = 0  # sequence numbers skipped (messages that never arrived)
    dropped: int = 0  # repeated or older messages rejected
    jumps: int = 0  # messages refused for a sequence number implausibly far ahead
    incarnations: int = 1  # incarnations seen (restarts + 1)
    seqs: OrderedDict[str, int] = field(default_factory=OrderedDict)  # incarnation -> last seq, oldest first


V = TypeVar("V")

DEFAULT_MAX_PEERS = 1024
DEFAULT_PEER_IDLE_S = 600.0


class PeerTable(Generic[V]):
    """Per-peer state for at most ``max_peers`` peers, so memory stays flat whatever names arrive.

    A peer not in the table is admitted while there is room. When the table is full, peers
    silent for ``idle_s`` seconds are forgotten to make room; if none is, the newcomer is
    refused and counted (peers already known keep their state: a flood of new names cannot
    push out the actors that are really there).
    """

    def __init__(self, factory: Callable[[], V], max_peers: int = DEFAULT_MAX_PEERS,
                 idle_s: float = DEFAULT_PEER_IDLE_S, clock: Callable[[], float] = time.monotonic) -> None:
        if max_peers < 1:
            raise ValueError("max_peers must be >= 1")
        self.factory, self.max_peers, self.idle_s, self._clock = factory, max_peers, idle_s, clock
        self._peers: OrderedDict[str, V] = OrderedDict()
        self._seen: dict[str, float] = {}
        self.refused = 0  # messages from peers turned away because the table was full
        self.refused_names: set[str] = set()  # a few of them, for the log (bounded)
        self.forgotten = 0

    def admit(self, name: str) -> V | None:
        """The state of ``name``, created if there is room; None (counted) when it is refused."""
        now = self._clock()
        state = self._peers.get(name)
        if state is None:
            if len(self._peers) >= self.max_peers:
                self._forget_idle(now)
            if len(self._peers) >= self.max_peers:
                self.refused += 1
                if len(self.refused_names) < 8:
                    self.refused_names.add(name)
                return None
            state = self._peers[name] = self.factory()
        self._peers.move_to_end(name)
        self._seen[name] = now
        return state

    def _forget_idle(self, now: float) -> None:
        while self._peers:
            oldest = next(iter(self._peers))
            if now - self._seen[oldest] < self.idle_s:
                return
            del self._peers[oldest], self._seen[oldest]
            self.forgotten += 1

    def get(self, name: str) -> V | None:
        return self._peers.get(name)

    def last_seen_s(self, name: str) -> float | None:
        """Seconds since ``name`` was last admitted, if it is known."""
        seen = self._seen.get(name)
        return None if seen is None else self._clock() - seen

    def items(self) -> list[tuple[str, V]]:
        return list(self._peers.items())

    def __len__(self) -> int:
        return len(self._peers)

    def __contains__(self, name: object) -> bool:
        return name in self._peers


class SequenceTracker:
    """Detects lost, repeated and out-of-order messages per sender.

    Each sender process picks a random incarnation id at start and numbers its
    messages 0, 1, 2...  A new incarnation (a restarted sender) starts a fresh
    sequence and is always accepted.  At most ``max_senders`` senders are
    remembered (a :class:`PeerTable`): a new sender beyond that is refused and
    counted, unless a sender silent for ``idle_s`` can be forgotten.
    """

    def __init__(self, max_senders: int = DEFAULT_MAX_PEERS, idle_s: float = DEFAULT_PEER_IDLE_S) -> None:
        self._senders: PeerTable[SenderState] = PeerTable(lambda: SenderState("", -1), max_senders, idle_s)
        self._totals = {"accepted": 0, "lost": 0, "dropped": 0, "jumps": 0, "incarnations": 0, "refused": 0}
        self.last_refusal = ""  # why the last message :meth:`observe` refused was refused

    @property
    def max_senders(self) -> int:
        return self._senders.max_peers

    @property
    def refused(self) -> int:
        return self._totals["refused"]

    @property
    def refused_names(self) -> set[str]:
        """A few of the senders refused (at most 8)."""
        return self._senders.refused_names

    def observe(self, sender: str, incarnation: str, seq: int) -> tuple[bool, int]:
        """Record one message; return ``(accept, lost)``. :attr:`last_refusal` says why one was refused.

        First message of a sender or of a new incarnation: accepted, lost 0.
        ``seq == last + 1``: accepted.  ``seq > last + 1``: accepted, ``lost`` is
        the gap.  ``seq <= last``: rejected (``"old"``: a repeat or older), lost 0.
        ``seq > last + MAX_SEQ_GAP``: rejected (``"jump"``), leaving ``last`` as it was, so one
        message naming a sender's incarnation cannot push its sequence out of that sender's reach.
        A sender refused for lack of room: rejected (``"refused"``, counted in ``refused``).

        Each of the last :data:`MAX_INCARNATIONS` incarnations of a name keeps its own sequence:
        two processes sending under one name (or a restart whose predecessor's last batches are
        still on their way) do not make each other's messages look new.
        """
        self.last_refusal = ""
        state = self._senders.admit(sender)
        if state is None:
            self._totals["refused"] += 1
            self.last_refusal = "refused"
            return False, 0
        last = state.seqs.get(incarnation)
        if last is None:
            if state.incarnation:  # a known sender, restarted
                state.incarnations += 1
            state.seqs[incarnation] = seq
            while len(state.seqs) > MAX_INCARNATIONS:
                state.seqs.popitem(last=False)
            state.incarnation, state.last_seq = incarnation, seq
            self._totals["incarnations"] += 1
            return self._accept(state, 0)
        if seq <= last:
            state.dropped += 1
            self._totals["dropped"] += 1
            self.last_refusal = "old"
            return False, 0
        if seq - last > MAX_SEQ_GAP:
            state.jumps += 1
            self._totals["jumps"] += 1
            self.last_refusal = "jump"
            return False, 0
        state.seqs[incarnation] = seq
        state.seqs.move_to_end(incarnation)
        state.incarnation, state.last_seq = incarnation, seq
        return self._accept(state, seq - last - 1)

    def _accept(self, state: SenderState, lost: int) -> tuple[bool, int]:
        state.accepted += 1
        state.lost += lost
        self._totals["accepted"] += 1
        self._totals["lost"] += lost
        return True, lost

    def sender(self, sender: str) -> SenderState | None:
        """The state of one sender, if remembered."""
        return self._senders.get(sender)

    def stats(self) -> dict[str, Any]:
        """JSON-able totals and per-sender counters."""
        return {**self._totals, "senders": {name: asdict(s) for name, s in self._senders.items()}}

    def losses(self) -> dict[str, tuple[int, int]]:
        """Per sender remembered: (messages lost, repeated or older ones dropped); cheap enough for every record."""
        return {name: (s.lost, s.dropped) for name, s in self._senders.items()}


class VersionTracker:
    """Decides whether a received model is newer than the one in use.

    A model is accepted when it comes from a different learner incarnation
    (a learner restarted without resuming starts a new version line, which must
    not be ignored as "older") or has a higher version than the current one.
    """

    def __init__(self) -> None:
        self.incarnation: str | None = None
        self.version: int = -1
        self.accepted = 0
        self.rejected = 0
        self.incarnations = 0

    def would_accept(self, incarnation: str, version: int) -> bool:
        """Whether :meth:`offer` would accept, without recording anything."""
        return incarnation != self.incarnation or version > self.version

    def offer(self, incarnation: str, version: int) -> bool:
        """Accept (and remember) ``(incarnation, version)`` if it is newer; else False."""
        if not self.would_accept(incarnation, version):
            self.rejected += 1
            return False
        if incarnation != self.incarnation:
            self.incarnations += 1
        self.incarnation, self.version = incarnation, version
        self.accepted += 1
        return True

    def stats(self) -> dict[str, Any]:
        """JSON-able state and counters."""
        return {
            "incarnation": self.incarnation,
            "version": self.version,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "incarnations": self.incarnations,
        }


class RateLimitedLog:
    """Logs a warning at most once per ``interval`` seconds per key.

    Suppressed warnings are counted and the count is mentioned on the next
    line emitted for that key.
    """

    MAX_KEYS = 256  # keys often carry a peer's name: beyond this many, they share one

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warn(self, key: str, msg: str) -> bool:
        """Log ``msg`` under ``key`` unless one was logged less than ``interval`` ago.

        Returns whether the line was emitted.
        """
        if key not in self._last and len(self._last) >= self.MAX_KEYS:
            key = "(other keys)"
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        suppressed = self._suppressed.pop(key, 0)
        if suppressed:
            msg = f"{msg} ({suppressed} similar suppressed)"
        self._last[key] = now
        self.logger.warning("%s", msg)
        return True

    def suppressed(self, key: str) -> int:
        """Warnings for ``key`` suppressed since the last emitted one."""
        return self._suppressed.get(key, 0)


class KeyBinding:
    """Which CURVE key may speak for which sender name: the key that first used a name.

    With CurveZMQ a message's ZAP ``User-Id`` is its sender's public key. A relay's key (a
    proxy's) speaks for every name it forwards; an actor's key for its own. Binding each name to
    the first key that used it means one admitted key cannot send under another's names (to
    silence an actor with a forged sequence number, or to take its share of the rate limit).
    Without CURVE there is no key (None) and every name is allowed. At most ``max_names``
    names are bound (:class:`PeerTable`: names silent for ``idle_s`` are forgotten first).
    """

    def __init__(self, max_names: int = DEFAULT_MAX_PEERS, idle_s: float = DEFAULT_PEER_IDLE_S) -> None:
        self._keys: PeerTable[list[bytes]] = PeerTable(list, max_names, idle_s)
        self.refused = 0  # messages refused: their name is bound to another key, or no room to bind it

    def allows(self, name: str, key: bytes | None) -> bool:
        """Whether ``key`` may speak for ``name`` (binding the name to it if it is new)."""
        if key is None:
            return True
        bound = self._keys.admit(name)
        if bound is None:
            self.refused += 1
            return False
        if not bound:
            bound.append(key)
        if bound[0] != key:
            self.refused += 1
            return False
        return True
