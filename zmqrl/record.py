"""Recording: TensorBoard event files, a console progress view, and the run summary."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("zmqrl")


def setup_logging(level: str = "info", role: str = "") -> None:
    """One log format for every role: time, role, level, message."""
    prefix = f"[{role}] " if role else ""
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format=f"%(asctime)s {prefix}%(levelname)s %(message)s", datefmt="%H:%M:%S",
                        force=True)


class TensorBoardRecorder:
    """Scalars, histograms and the hyperparameter table, written under ``logdir``."""

    def __init__(self, logdir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(logdir), flush_secs=5)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for tag, value in values.items():
            if value is not None and np.isfinite(value):
                self.writer.add_scalar(tag, float(value), step)

    def histogram(self, step: int, tag: str, values: np.ndarray) -> None:
        if len(values):
            self.writer.add_histogram(tag, np.asarray(values), step)

    def hparams(self, flat_config: Mapping[str, Any], metrics: Mapping[str, float]) -> None:
        """The resolved config as TensorBoard's hyperparameter table."""
        hp = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in flat_config.items()}
        self.writer.add_hparams(hp, {f"hparam/{k}": v for k, v in metrics.items()}, run_name=".")

    def text(self, tag: str, text: str) -> None:
        self.writer.add_text(tag, text)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class Progress:
    """A live progress bar on a terminal, a log line every few seconds otherwise."""

    def __init__(self, total: int, unit: str = "opt", interval_s: float = 5.0,
                 stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.interval_s = interval_s
        self._last = 0.0
        self.bar = None
        if getattr(self.stream, "isatty", lambda: False)():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit=unit, dynamic_ncols=True, file=self.stream, smoothing=0.1)
        self._n = 0

    def update(self, n: int, fields: Mapping[str, Any]) -> None:
        """Move to ``n`` and show ``fields`` (a few short key/value pairs)."""
        if self.bar is not None:
            self.bar.update(n - self._n)
            self._n = n
            now = time.monotonic()
            if now - self._last >= 0.5:
                self._last = now
                self.bar.set_postfix({k: _fmt(v) for k, v in fields.items()}, refresh=False)
            return
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            text = " ".join(f"{k}={_fmt(v)}" for k, v in fields.items())
            log.info("opt %d  %s", n, text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.3g}"
    return str(value)
