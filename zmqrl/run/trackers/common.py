"""What the trackers share: turning a run's records into what a tracker accepts, the run directory's
files sent as artifacts, the tracker run ids kept in ``trackers.json``, and failure logging."""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zmqrl.config import ConfigError
from zmqrl.run.rundir import RunDir

log = logging.getLogger("zmqrl")

# the run directory's files sent as artifacts at the end (globs, relative to the run directory)
ARTIFACT_GLOBS = ("config.yaml", "summary.json", "checkpoints/best/**/*")


class TrackerError(ConfigError):
    """A tracker that cannot be used as configured (not installed, no server); one line."""


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"env": {"kwargs": {"a": 1}}}`` -> ``{"env.kwargs.a": 1}``; empty mappings stay as values."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def param_text(value: Any) -> str:
    """A parameter value as text: scalars as ``str``, lists and mappings as JSON."""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def finite(values: Mapping[str, Any]) -> dict[str, float]:
    """The finite values as floats (None, NaN and infinities are left out)."""
    out: dict[str, float] = {}
    for key, value in values.items():
        if value is None:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            out[key] = number
    return out


def artifact_files(run_dir: Path, max_bytes: float, tracker: str) -> list[Path]:
    """The files of ``ARTIFACT_GLOBS`` under ``run_dir`` to send; those over ``max_bytes`` are left out,
    each with a log line naming ``tracker``."""
    send: list[Path] = []
    seen: set[Path] = set()
    for pattern in ARTIFACT_GLOBS:
        for path in sorted(run_dir.glob(pattern)):
            if path in seen or not path.is_file():
                continue
            seen.add(path)
            size = path.stat().st_size
            if size <= max_bytes:
                send.append(path)
            else:
                log.info("%s: %s left out (%.0f MB, over run.artifact_max_mb)", tracker, path.relative_to(run_dir),
                         size / 2**20)
    return send


_state_lock = threading.Lock()


def read_state(run_dir: Path) -> dict[str, Any]:
    """``trackers.json``: per tracker, the ids of the run it records to (empty when none yet)."""
    try:
        state = json.loads(RunDir(run_dir).trackers.read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def write_state(run_dir: Path, tracker: str, entry: Mapping[str, Any]) -> None:
    """Record ``tracker``'s ids in ``trackers.json`` (atomically: write, then rename)."""
    with _state_lock:
        state = read_state(run_dir)
        state[tracker] = dict(entry)
        path = RunDir(run_dir).trackers
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
        os.replace(tmp, path)


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: message`` on one line, cut at ``limit`` characters."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


class FailureLog:
    """Logs a tracker's failures: the first at once, then at most one line per ``interval_s``."""

    def __init__(self, name: str, interval_s: float = 60.0) -> None:
        self.name = name
        self.interval_s = interval_s
        self.total = 0
        self.consecutive = 0
        self._hidden = 0
        self._last = -math.inf

    def failed(self, what: str, exc: BaseException, retry_s: float | None = None) -> None:
        self.total += 1
        self.consecutive += 1
        now = time.monotonic()
        if self.consecutive > 1 and now - self._last < self.interval_s:
            self._hidden += 1
            return
        hidden = f" ({self._hidden} more failures since the last line)" if self._hidden else ""
        then = f"; retrying in {retry_s:.3g} s" if retry_s is not None else ""
        log.warning("%s: %s failed: %s%s%s", self.name, what, one_line(exc), hidden, then)
        self._last, self._hidden = now, 0

    def succeeded(self) -> None:
        if self.consecutive:
            log.info("%s: working again after %d failed attempts", self.name, self.consecutive)
        self.consecutive = 0
        self._hidden = 0
