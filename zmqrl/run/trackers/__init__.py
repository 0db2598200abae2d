"""Where a run's records go: ``run.trackers`` picks any of TensorBoard (the default: ``RUN_DIR/tb``),
MLflow (a tracking server) and Weights & Biases (offline by default: ``RUN_DIR/wandb``).

:func:`open_recorders` returns one :class:`~zmqrl.run.trackers.fanout.FanOut` that the bookkeeping
records through (:class:`zmqrl.core.Recorder`). MLflow and W&B are optional extras
(``pip install 'zmqrl[mlflow]'``, ``'zmqrl[wandb]'``); :func:`check_trackers` says in one line which
one is missing, or that MLflow has no server, before a run starts. They run on threads of their own
(:class:`~zmqrl.run.trackers.background.Background`), so a slow or unreachable tracker costs the
training loop microseconds; one that fails is logged and retried, and never stops training.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zmqrl.config import Config, to_flat_dict
from zmqrl.run.trackers.common import TrackerError
from zmqrl.run.trackers.fanout import FanOut

#: tracker name -> (module that must be importable, what installs it)
TRACKERS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "zmqrl"),
    "mlflow": ("mlflow", "zmqrl[mlflow]"),
    "wandb": ("wandb", "zmqrl[wandb]"),
}
QUEUE_SIZE = 10_000  # scalars calls a background tracker holds while it is slow or unreachable
CLOSE_TIMEOUT_S = 30.0  # how long the end of a run waits for a background tracker to send what it holds

__all__ = ["TRACKERS", "FanOut", "TrackerError", "check_trackers", "open_recorders", "tracking_uri"]


def tracking_uri(cfg: Config) -> str:
    """MLflow's server: ``run.mlflow_uri``, else ``$MLFLOW_TRACKING_URI``."""
    return cfg.run.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI", "")


def check_trackers(cfg: Config) -> None:
    """TrackerError (one line) for a tracker whose package is not installed, or an MLflow without a server."""
    for name in cfg.run.trackers:
        module, extra = TRACKERS[name]
        if importlib.util.find_spec(module) is None:
            raise TrackerError(f"run.trackers has {name}, but {module} is not installed: pip install '{extra}'")
    if "mlflow" in cfg.run.trackers and not tracking_uri(cfg):
        raise TrackerError("run.trackers has mlflow, but no tracking server is set: set run.mlflow_uri "
                           "(e.g. http://127.0.0.1:5000) or MLFLOW_TRACKING_URI")


def run_tags(cfg: Config, run_dir: Path) -> dict[str, str]:
    from zmqrl import __version__

    return {"zmqrl.version": __version__, "zmqrl.env_id": cfg.env.id, "zmqrl.algo": cfg.agent.algo,
            "zmqrl.run_dir": str(Path(run_dir).resolve()), "zmqrl.host": socket.gethostname()}


def open_recorders(cfg: Config, run_dir: str | Path, log_interval_s: float = 60.0) -> FanOut:
    """The recorders ``run.trackers`` names, behind one :class:`FanOut` (see the module docstring).
    MLflow and W&B open on their own threads: this returns at once."""
    from zmqrl.run.trackers.background import Background

    check_trackers(cfg)
    run_dir = Path(run_dir)
    params: Mapping[str, Any] = to_flat_dict(cfg)
    tags = run_tags(cfg, run_dir)
    rc = cfg.run
    recorders: list[Any] = []
    for name in rc.trackers:
        if name == "tensorboard":
            from zmqrl.run.trackers.tensorboard import TensorBoardRecorder

            recorders.append(TensorBoardRecorder(run_dir / "tb"))
        elif name == "mlflow":
            from zmqrl.run.trackers.mlflow_tracker import MLflowRecorder

            def open_mlflow(uri: str = tracking_uri(cfg),
                            experiment: str = rc.mlflow_experiment or rc.name or "zmqrl") -> MLflowRecorder:
                return MLflowRecorder(run_dir, params, tags, tracking_uri=uri, experiment=experiment,
                                      run_name=run_dir.name, artifact_max_mb=rc.artifact_max_mb)

            recorders.append(Background("mlflow", open_mlflow, queue_size=QUEUE_SIZE, close_timeout_s=CLOSE_TIMEOUT_S,
                                        log_interval_s=log_interval_s, transient=MLflowRecorder.transient))
        elif name == "wandb":
            from zmqrl.run.trackers.wandb_tracker import WandbRecorder

            def open_wandb() -> WandbRecorder:
                return WandbRecorder(run_dir, params, tags, project=rc.wandb_project, entity=rc.wandb_entity,
                                     group=rc.name, run_name=run_dir.name, mode=rc.wandb_mode,
                                     artifact_max_mb=rc.artifact_max_mb)

            recorders.append(Background("wandb", open_wandb, queue_size=QUEUE_SIZE, close_timeout_s=CLOSE_TIMEOUT_S,
                                        log_interval_s=log_interval_s, transient=WandbRecorder.transient))
    return FanOut(recorders, log_interval_s=log_interval_s)
