"""TensorBoard: scalars, histograms, text and the hyperparameter table, as event files in ``RUN_DIR/tb``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from zmqrl.run.trackers.common import finite


class TensorBoardRecorder:
    """Writes under ``logdir``; synchronous (a call takes about a millisecond)."""

    name = "tensorboard"

    def __init__(self, logdir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(logdir), flush_secs=5)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for tag, value in finite(values).items():
            self.writer.add_scalar(tag, value, step)

    def histogram(self, step: int, tag: str, values: np.ndarray) -> None:
        if len(values):
            self.writer.add_histogram(tag, np.asarray(values), step)

    def text(self, tag: str, text: str) -> None:
        self.writer.add_text(tag, text)

    def hparams(self, params: Mapping[str, Any], metrics: Mapping[str, float]) -> None:
        """The resolved config as TensorBoard's hyperparameter table."""
        hp = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in params.items()}
        self.writer.add_hparams(hp, {f"hparam/{k}": v for k, v in finite(metrics).items()}, run_name=".")

    def artifacts(self, run_dir: Path) -> None:
        """Nothing to send: the event files are in the run directory already."""

    def flush(self) -> None:
        self.writer.flush()

    def close(self, failed: bool = False) -> None:
        self.writer.close()
