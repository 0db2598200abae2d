"""Per-sender sequence tracking, model version tracking and rate-limited logging."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class SenderState:
    """What a :class:`SequenceTracker` remembers about one sender."""

    incarnation: str
    last_seq: int
    accepted: int = 0
    lost: int = 0  # sequence numbers skipped (messages that never arrived)
    dropped: int = 0  # repeated or older messages rejected
    incarnations: int = 1  # incarnations seen (restarts + 1)


class SequenceTracker:
    """Detects lost, repeated and out-of-order messages per sender.

    Each sender process picks a random incarnation id at start and numbers its
    messages 0, 1, 2...  A new incarnation (a restarted sender) starts a fresh
    sequence and is always accepted.  At most ``max_senders`` senders are
    remembered; the least recently seen is forgotten first (its counters stay
    in the totals).
    """

    def __init__(self, max_senders: int = 1024) -> None:
        if max_senders < 1:
            raise ValueError("max_senders must be >= 1")
        self.max_senders = max_senders
        self._senders: OrderedDict[str, SenderState] = OrderedDict()
        self._totals = {"accepted": 0, "lost": 0, "dropped": 0, "incarnations": 0}

    def observe(self, sender: str, incarnation: str, seq: int) -> tuple[bool, int]:
        """Record one message; return ``(accept, lost)``.

        First message of a sender or of a new incarnation: accepted, lost 0.
        ``seq == last + 1``: accepted.  ``seq > last + 1``: accepted, ``lost`` is
        the gap.  ``seq <= last``: rejected (repeat or older), lost 0.
        """
        state = self._senders.get(sender)
        if state is None or state.incarnation != incarnation:
            if state is None:
                state = SenderState(incarnation, seq)
                self._senders[sender] = state
                self._evict()
            else:
                state.incarnation, state.last_seq = incarnation, seq
                state.incarnations += 1
            self._senders.move_to_end(sender)
            self._totals["incarnations"] += 1
            return self._accept(state, 0)
        self._senders.move_to_end(sender)
        if seq <= state.last_seq:
            state.dropped += 1
            self._totals["dropped"] += 1
            return False, 0
        lost = seq - state.last_seq - 1
        state.last_seq = seq
        return self._accept(state, lost)

    def _accept(self, state: SenderState, lost: int) -> tuple[bool, int]:
        state.accepted += 1
        state.lost += lost
        self._totals["accepted"] += 1
        self._totals["lost"] += lost
        return True, lost

    def _evict(self) -> None:
        while len(self._senders) > self.max_senders:
            self._senders.popitem(last=False)

    def sender(self, sender: str) -> SenderState | None:
        """The state of one sender, if remembered."""
        return self._senders.get(sender)

    def stats(self) -> dict[str, Any]:
        """JSON-able totals and per-sender counters."""
        return {**self._totals, "senders": {name: asdict(s) for name, s in self._senders.items()}}


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
