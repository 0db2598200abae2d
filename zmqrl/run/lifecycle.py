"""Process lifecycle shared by every role: seeding, graceful SIGINT/SIGTERM handling, periodic ticks
(:class:`Every`) and work done in a background thread whose result or exception is kept (:class:`Background`)."""

from __future__ import annotations

import logging
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

log = logging.getLogger("zmqrl")


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and (when this process uses it) torch global generators."""
    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(seed)


_early: list[str] = []  # stop signals a role process got before its StopFlag was in place


def _remember(signum: int, frame: Any) -> None:
    if _early:
        raise KeyboardInterrupt  # a second signal: the operator means now
    _early.append(signal.Signals(signum).name)


def catch_stop_signals_early() -> None:
    """From here on (a role process's first moments) SIGINT/SIGTERM are remembered, not fatal.

    A role signalled while it starts (importing, binding) then stops at its loop's first step,
    and one signalled after its loop has ended (saving, closing, interpreter shutdown) exits with
    its own code instead of dying by the signal; :class:`StopFlag` handles signals in between.
    """
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _remember)


def take_early_stop_signal() -> str | None:
    """The name of a stop signal remembered since :func:`catch_stop_signals_early`, consumed; None if none."""
    return _early.pop(0) if _early else None


def ignore_stop_signals() -> None:
    """For a role or launcher process whose work is done: SIGINT/SIGTERM are ignored from here to its exit.

    Python resets signals with a handler of its own to their default while it shuts down, so a
    stop signal then would still kill the process; an ignored signal stays ignored.
    """
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


class StopFlag:
    """Set by SIGINT/SIGTERM so a loop can finish its step and flush what it owes; ``count`` counts them.

    A role (``escalate`` True, the default) takes a second signal as *now*: it raises
    KeyboardInterrupt. A launcher (``escalate`` False) never raises: it passes each further signal
    on to its roles (SIGTERM, then SIGKILL) as it stops them. A signal that came while the process
    was starting (:func:`catch_stop_signals_early`) counts as the first.
    """

    def __init__(self, escalate: bool = True, what: str = "stopping after the current step") -> None:
        self.escalate, self.what = escalate, what
        self.count = 0
        self.signal_name = ""
        self._previous: dict[int, Any] = {}

    @classmethod
    def launcher(cls) -> StopFlag:
        """The flag of a launcher, which stops its roles step by step and never raises."""
        return cls(escalate=False, what="stopping every role")

    @property
    def set(self) -> bool:
        return self.count > 0

    @set.setter
    def set(self, value: bool) -> None:
        """Set (or clear) it from the program itself: a stop asked for without a signal."""
        self.count = max(self.count, 1) if value else 0

    def __enter__(self) -> StopFlag:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        early = take_early_stop_signal()
        if early:  # signalled while starting: stop at the first step
            self.count, self.signal_name = 1, early
            log.info("received %s while starting: %s", early, self.what)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.count and self.escalate:
            raise KeyboardInterrupt
        self.count += 1
        if self.count == 1:
            self.signal_name = name
            log.info("received %s: %s", name, self.what)
        else:
            log.warning("received %s again (%d): stopping the roles %s", name, self.count,
                        "now" if self.count == 2 else "by SIGKILL")

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

class Every:
    """True once per ``interval_s``: for periodic work inside a loop."""

    def __init__(self, interval_s: float, now: bool = False) -> None:
        self.interval_s = interval_s
        self._next = time.monotonic() + (0.0 if now else interval_s)

    def __call__(self) -> bool:
        t = time.monotonic()
        if t >= self._next:
            self._next = t + self.interval_s
            return True
        return False


T = TypeVar("T")


class Background(threading.Thread, Generic[T]):
    """Runs one function in a daemon thread and keeps its result or the exception it raised."""

    def __init__(self, fn: Callable[[], T], name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.fn = fn
        self.result: T | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # handed to the thread that asks for the result
            self.error = exc

    def get(self) -> T:
        """The result once the thread has finished (call after ``join``); re-raises its exception."""
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result
