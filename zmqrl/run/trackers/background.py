"""A recorder driven from a thread of its own: the training thread only queues (microseconds), the
thread opens the tracker (imports, connects: seconds), sends, and retries with backoff what fails for a
passing reason. At most ``queue_size`` scalars calls wait; past that the oldest are dropped and
counted. ``close`` waits for the queue to drain for at most ``close_timeout_s`` and says what it left."""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zmqrl.run.trackers.common import FailureLog, finite, one_line

log = logging.getLogger("zmqrl")

MAX_VALUES = 1000  # scalars sent in one request at most (MLflow takes 1,000 metrics a request)

_Op = tuple[str, Any]  # (kind, argument)


@dataclass
class BackgroundStats:
    enqueued: int = 0  # scalars calls taken from the training thread
    sent: int = 0  # scalars calls the tracker accepted
    dropped: int = 0  # scalars calls dropped: the queue was full (oldest first), or left unsent at close
    rejected: int = 0  # calls the tracker refused for good
    failures: int = 0  # failed attempts (each retried)
    pending: int = 0  # calls waiting now


class Background:
    """Drives a recorder from a thread of its own; the caller's methods only enqueue.

    ``opener`` builds the recorder (imports, connects: slow) on that thread, retried with
    backoff while it fails for a passing reason. Scalars calls queued together are sent
    together (``scalars_many``, up to ``max_batch`` calls and ``max_values`` values). The queue
    holds at most ``queue_size`` scalars calls; past that the oldest are dropped and counted.
    """

    def __init__(self, name: str, opener: Callable[[], Any], *, queue_size: int = 10_000, max_batch: int = 50,
                 max_values: int = MAX_VALUES, close_timeout_s: float = 30.0,
                 backoff_s: tuple[float, float] = (1.0, 60.0), log_interval_s: float = 60.0,
                 transient: Callable[[BaseException], bool] | None = None) -> None:
        self.name = name
        self._is_transient = transient
        self._opener = opener
        self.queue_size = queue_size
        self.max_batch = max_batch
        self.max_values = max_values
        self.close_timeout_s = close_timeout_s
        self.backoff_s = backoff_s
        self.recorder: Any = None
        self.stats = BackgroundStats()
        self._failures = FailureLog(name, log_interval_s)
        self._ops: collections.deque[_Op] = collections.deque()
        self._n_scalars = 0
        self._cond = threading.Condition()
        self._closing = False
        self._close_by = math.inf
        self._abandon = False
        self._dead = False  # could not be opened for good: drop everything
        self._thread = threading.Thread(target=self._run, name=f"recorder-{name}", daemon=True)
        self._thread.start()

    # -- the caller's side (the training thread) --
    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self._put(("scalars", (int(step), finite(values), time.time())))

    def text(self, tag: str, text: str) -> None:
        self._put(("text", (tag, text)))

    def hparams(self, params: Mapping[str, Any], metrics: Mapping[str, float]) -> None:
        self._put(("hparams", (dict(params), dict(metrics))))

    def artifacts(self, run_dir: Path) -> None:
        self._put(("artifacts", (Path(run_dir),)))

    def start_close(self, failed: bool = False) -> None:
        """Queue the close behind what is queued; :meth:`close` waits for it."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._close_by = time.monotonic() + self.close_timeout_s
            self._ops.append(("close", (failed,)))
            self._cond.notify()

    def close(self, failed: bool = False) -> None:
        """Send what is queued (for at most ``close_timeout_s``), then close the tracker's run."""
        self.start_close(failed)
        if self._abandon:
            return
        self._thread.join(max(0.0, self._close_by - time.monotonic()))
        if self._thread.is_alive():
            with self._cond:
                self._abandon = True
                unsent = self._n_scalars
                self.stats.dropped += unsent
                self._ops.clear()
                self._n_scalars = 0
                self._cond.notify()
            log.warning("%s: gave up after %.0f s at close with %d scalars calls not sent (%d failed attempts)",
                        self.name, self.close_timeout_s, unsent, self.stats.failures)
        elif self.stats.dropped or self.stats.rejected:
            log.warning("%s: closed; %d scalars calls were dropped and %d calls rejected during the run",
                        self.name, self.stats.dropped, self.stats.rejected)

    def snapshot(self) -> dict[str, int]:
        with self._cond:
            self.stats.pending = len(self._ops)
            return dict(vars(self.stats))

    def _put(self, op: _Op) -> None:
        with self._cond:
            if self._closing or self._dead:
                if op[0] == "scalars":
                    self.stats.dropped += 1
                return
            self._ops.append(op)
            if op[0] == "scalars":
                self.stats.enqueued += 1
                self._n_scalars += 1
                self._trim()
            self._cond.notify()

    def _trim(self) -> None:
        """Drop the oldest scalars calls past ``queue_size`` (holding the lock)."""
        while self._n_scalars > self.queue_size:
            for i, queued in enumerate(self._ops):
                if queued[0] == "scalars":
                    del self._ops[i]
                    break
            self._n_scalars -= 1
            self.stats.dropped += 1

    # -- the worker's side --
    def _wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless abandoned meanwhile; returns whether to go on."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while not self._abandon and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            return not self._abandon

    def _transient(self, exc: BaseException) -> bool:
        """Whether a failure is worth retrying (the tracker's own judgement, or: not a bad argument)."""
        if self._is_transient is not None:
            return self._is_transient(exc)
        return not isinstance(exc, (TypeError, ValueError, LookupError, ImportError))

    def _open(self) -> bool:
        backoff = self.backoff_s[0]
        while self.recorder is None:
            try:
                self.recorder = self._opener()
            except Exception as exc:
                if isinstance(exc, ImportError) or not self._transient(exc):
                    log.error("%s: cannot record this run: %s", self.name, one_line(exc))
                    with self._cond:
                        self._dead = True
                        self.stats.dropped += self._n_scalars
                        self._ops.clear()
                        self._n_scalars = 0
                    return False
                self.stats.failures += 1
                self._failures.failed("opening", exc, backoff)
                if not self._wait(backoff):
                    return False
                backoff = min(backoff * 2, self.backoff_s[1])
        self._failures.succeeded()
        return True

    def _take(self) -> list[_Op]:
        """The next op, or the run of scalars calls at the head (holding the lock)."""
        first = self._ops.popleft()
        if first[0] != "scalars":
            return [first]
        batch = [first]
        size = len(first[1][1])
        while self._ops and self._ops[0][0] == "scalars" and len(batch) < self.max_batch:
            size += len(self._ops[0][1][1])
            if size > self.max_values:  # one request each (MLflow takes 1000 metrics a request)
                break
            batch.append(self._ops.popleft())
        self._n_scalars -= len(batch)
        return batch

    def _run(self) -> None:
        with self._cond:
            while not self._ops and not self._abandon:
                self._cond.wait()
        if self._abandon or not self._open():
            return
        backoff = self.backoff_s[0]
        while True:
            with self._cond:
                while not self._ops and not self._abandon:
                    self._cond.wait()
                if self._abandon:
                    return
                batch = self._take()
            kind, arg = batch[0]
            try:
                if kind == "scalars":
                    many = getattr(self.recorder, "scalars_many", None)
                    if many is not None:
                        many([a for _, a in batch])
                    else:
                        for _, (step, values, _t) in batch:
                            self.recorder.scalars(step, values)
                else:
                    getattr(self.recorder, kind)(*arg)
            except Exception as exc:
                if self._transient(exc):
                    self.stats.failures += 1
                    self._failures.failed(kind, exc, backoff)
                    with self._cond:  # back to the head, in order; the oldest go first if that overflows
                        self._ops.extendleft(reversed(batch))
                        if kind == "scalars":
                            self._n_scalars += len(batch)
                            self._trim()
                    if not self._wait(backoff):
                        return
                    backoff = min(backoff * 2, self.backoff_s[1])
                    continue
                self.stats.rejected += len(batch)
                self._failures.failed(f"{kind} (rejected, not retried)", exc)
                if kind == "close":
                    return
                continue
            backoff = self.backoff_s[0]
            self._failures.succeeded()
            if kind == "scalars":
                self.stats.sent += len(batch)
            elif kind == "close":
                return
