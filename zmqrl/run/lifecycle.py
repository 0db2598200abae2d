"""Process lifecycle shared by every role: seeding and graceful SIGINT/SIGTERM handling."""

from __future__ import annotations

import logging
import random
import signal
import sys
from typing import Any

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
    """Set by SIGINT/SIGTERM so a loop can finish its step and flush what it owes.

    A second signal raises KeyboardInterrupt: the operator means *now*.
    """

    def __init__(self) -> None:
        self.set = False
        self.signal_name = ""
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopFlag:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        early = take_early_stop_signal()
        if early:  # signalled while starting: stop at the first step
            self.signal_name = early
            log.info("received %s while starting: stopping after the first step", self.signal_name)
            self.set = True
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.set:
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name
        log.info("received %s: stopping after the current step", self.signal_name)
        self.set = True

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
