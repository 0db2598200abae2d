"""Process lifecycle shared by every role: seeding and graceful SIGINT/SIGTERM handling."""

from __future__ import annotations

import logging
import random
import signal
import sys
from typing import Any

import numpy as np

log = logging.getLogger("zmqrl")


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and (when this process uses it) torch global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(seed)


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
