"""Several recorders behind one: each is called in turn, and one that raises is logged, skipped for a
while (1 s doubling to 5 min) and tried again; a tracker that fails never stops training."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from zmqrl.run.trackers.common import FailureLog


class _Entry:
    def __init__(self, recorder: Any, name: str, log_interval_s: float, backoff_s: tuple[float, float]) -> None:
        self.recorder = recorder
        self.name = name
        self.failures = FailureLog(name, log_interval_s)
        self.backoff_s = backoff_s
        self.backoff = backoff_s[0]
        self.retry_at = -math.inf
        self.skipped = 0
        self.closed = False


class FanOut:
    """Calls each recorder in turn; one that raises is logged, skipped for a while, and never stops training.

    After a failure the recorder is skipped (the calls counted in ``skipped``) for a backoff
    period that starts at 1 s and doubles to 5 min, then tried again; the first success resets
    it. ``histogram`` and ``flush`` go to the recorders that have them.
    """

    def __init__(self, recorders: Iterable[Any], *, log_interval_s: float = 60.0,
                 backoff_s: tuple[float, float] = (1.0, 300.0)) -> None:
        self._entries = [_Entry(r, getattr(r, "name", type(r).__name__), log_interval_s, backoff_s)
                         for r in recorders]
        self._lock = threading.Lock()

    @property
    def recorders(self) -> list[Any]:
        return [e.recorder for e in self._entries]

    def _call(self, method: str, *args: Any, force: bool = False) -> None:
        for entry in self._entries:
            fn = getattr(entry.recorder, method, None)
            if fn is None or entry.closed:
                continue
            now = time.monotonic()
            if not force and now < entry.retry_at:
                entry.skipped += 1
                continue
            try:
                fn(*args)
            except Exception as exc:
                with self._lock:
                    entry.failures.failed(method, exc, entry.backoff)
                    entry.retry_at = time.monotonic() + entry.backoff
                    entry.backoff = min(entry.backoff * 2, entry.backoff_s[1])
            else:
                if entry.failures.consecutive:
                    with self._lock:
                        entry.failures.succeeded()
                        entry.backoff = entry.backoff_s[0]
                        entry.retry_at = -math.inf

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self._call("scalars", step, values)

    def histogram(self, step: int, tag: str, values: Any) -> None:
        self._call("histogram", step, tag, values)

    def text(self, tag: str, text: str) -> None:
        self._call("text", tag, text)

    def hparams(self, params: Mapping[str, Any], metrics: Mapping[str, float]) -> None:
        self._call("hparams", params, metrics, force=True)

    def artifacts(self, run_dir: Path) -> None:
        self._call("artifacts", Path(run_dir), force=True)

    def flush(self) -> None:
        self._call("flush")

    def close(self, failed: bool = False) -> None:
        """Close each; background trackers drain together, each for at most its ``close_timeout_s``."""
        self._call("start_close", failed, force=True)
        self._call("close", failed, force=True)
        for entry in self._entries:
            entry.closed = True

    def stats(self) -> dict[str, dict[str, int]]:
        """Per recorder: calls that raised (``errors``), calls skipped while backing off, and a background
        one's queue figures (``enqueued``, ``sent``, ``dropped``, ``rejected``, ``failures``, ``pending``)."""
        out: dict[str, dict[str, int]] = {}
        for e in self._entries:
            figures = {"errors": e.failures.total, "skipped": e.skipped}
            snap = getattr(e.recorder, "snapshot", None)
            if snap is not None:
                figures.update(snap())
            out[e.name] = figures
        return out
