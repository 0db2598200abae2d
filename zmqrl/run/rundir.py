"""The run directory (docs/usage.md, "The run directory"): the one place that knows its file names, what makes a
directory a run directory, and how its JSON files are read and written.

Every run, single-process or distributed, writes one directory: ``config.yaml`` (the resolved
config, written first), ``summary.json``, ``tb/`` (TensorBoard), ``checkpoints/`` (``latest/``,
``best/``, numbered ones), with MLflow or W&B ``trackers.json`` (and ``wandb/``), and in a
distributed run ``endpoints.json``, ``logs/``, ``roles/`` (each role's stats at exit),
``supervisor/`` (the launchers' status), ``eval.token`` and the start-up marks ``first_batch.json``
and ``first_update.json``; ``callables/`` holds the env factory, wrappers and torso a run was given from
Python (:mod:`zmqrl.callables`). A directory is a run directory when
it holds ``config.yaml``, ``summary.json`` or a launcher's status (a ``zmqrl host`` machine's
directory has only the last).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import yaml

from zmqrl.config import Config, ConfigError, load

CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.json"
ENDPOINTS_FILE = "endpoints.json"  # the addresses of a distributed run's roles
EVAL_TOKEN_FILE = "eval.token"  # the secret the learner admits evaluation reports with (mode 0600)
FIRST_BATCH_FILE = "first_batch.json"  # written by the learner once the first batch is in replay
FIRST_UPDATE_FILE = "first_update.json"  # written by the learner once its first optimisation step is done
TRACKERS_FILE = "trackers.json"  # the MLflow and W&B runs this run records to, so a resumed run continues them
WANDB_DIR = "wandb"  # Weights & Biases' own files (offline runs until `wandb sync`)
CHECKPOINTS_DIR = "checkpoints"
TB_DIR = "tb"
LOGS_DIR = "logs"
ROLES_DIR = "roles"
SUPERVISOR_DIR = "supervisor"
CALLABLES_DIR = "callables"  # the callables from Python a run was given: env.pkl, wrappers.pkl, network.pkl
LATEST, BEST = "latest", "best"
NAMED_CHECKPOINTS = (BEST, LATEST)


class RunDirError(ConfigError):
    """A path that is not a run directory, or one with nothing to show; the message names it."""


class RunDir:
    """The paths of one run directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    @property
    def config(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY_FILE

    @property
    def endpoints(self) -> Path:
        return self.path / ENDPOINTS_FILE

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS_DIR

    def checkpoint(self, name: str | int) -> Path:
        """``checkpoints/NAME`` (``latest``, ``best`` or a number of optimisation steps)."""
        return self.checkpoints / str(name)

    @property
    def latest(self) -> Path:
        return self.checkpoint(LATEST)

    @property
    def best(self) -> Path:
        return self.checkpoint(BEST)

    @property
    def tb(self) -> Path:
        return self.path / TB_DIR

    @property
    def trackers(self) -> Path:
        return self.path / TRACKERS_FILE

    @property
    def logs(self) -> Path:
        return self.path / LOGS_DIR

    @property
    def roles(self) -> Path:
        return self.path / ROLES_DIR

    def role_stats(self, name: str) -> Path:
        """``roles/NAME.json``: what a role did, written at its exit."""
        return self.roles / f"{name}.json"

    @property
    def supervisor(self) -> Path:
        return self.path / SUPERVISOR_DIR

    def supervisor_status(self, launcher: str) -> Path:
        """``supervisor/NAME.json``: a launcher's status (its roles, starts, exits, restarts)."""
        return self.supervisor / f"{launcher}.json"

    def callable_file(self, kind: str) -> Path:
        """``callables/KIND.pkl``: the callables file of ``kind`` (env, wrappers, network) the run was given."""
        return self.path / callable_name(kind)

    def is_run_dir(self) -> bool:
        """Whether it holds what a run writes: ``config.yaml``, ``summary.json`` or a launcher's status."""
        return any(mark.exists() for mark in (self.config, self.summary, self.supervisor))


def callable_name(kind: str) -> str:
    """Where in a run directory the callables file of ``kind`` lies (what ``env.fn`` and the like hold)."""
    return f"{CALLABLES_DIR}/{kind}.pkl"


def require_run_dir(path: str | Path, needs_config: bool = False) -> Path:
    """``path`` if it is a run directory (with ``config.yaml`` when ``needs_config``), else a
    :class:`RunDirError` saying what is missing."""
    run = RunDir(path)
    if not run.path.exists():
        raise RunDirError(f"{run.path}: no such directory")
    if not run.path.is_dir():
        raise RunDirError(f"{run.path}: not a directory")
    if needs_config and not run.config.is_file():
        raise RunDirError(f"{run.path}: not a run directory (no {CONFIG_FILE}; `zmqrl train` and the learner "
                          "write one into every run directory)")
    if not run.is_run_dir():
        raise RunDirError(f"{run.path}: not a run directory (it holds none of {CONFIG_FILE}, {SUMMARY_FILE}, "
                          f"{SUPERVISOR_DIR}/)")
    return run.path


def run_config(path: str | Path) -> Config:
    """The resolved config the run used, checked against the schema."""
    return load(RunDir(require_run_dir(path, needs_config=True)).config)


def raw_config(path: str | Path) -> dict[str, Any]:
    """``config.yaml`` as plain data (for comparing runs)."""
    file = RunDir(require_run_dir(path, needs_config=True)).config
    try:
        data = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise RunDirError(f"{file}: unreadable: {exc}") from None
    if not isinstance(data, dict):
        raise RunDirError(f"{file}: expected a mapping at the top level")
    return data


def read_summary(path: str | Path) -> dict[str, Any] | None:
    """``summary.json`` (None while a run has not written one yet)."""
    file = RunDir(path).summary
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{file}: unreadable: {exc}") from None
    return data if isinstance(data, dict) else None


def read_json(path: str | Path) -> dict[str, Any] | None:
    """A JSON file, or None while it does not exist (or is being replaced)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON to ``path`` via a temporary file, fsynced, and a rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True, default=float)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_role_stats(run_dir: str | Path | None, name: str, stats: dict[str, Any]) -> None:
    """``RUN_DIR/roles/NAME.json``: what a role did, for the launcher, tests and humans."""
    if not run_dir:
        return
    run = RunDir(run_dir)
    run.roles.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run.role_stats(name), {"pid": os.getpid(), "time": time.time(), **stats})


def read_status_files(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Every launcher's status file in ``run_dir/supervisor/``, by launcher name."""
    found = {}
    for path in sorted(RunDir(run_dir).supervisor.glob("*.json")):
        data = read_json(path)
        if data is not None:
            found[path.stem] = data
    return found


def restart_counts(run_dir: str | Path) -> dict[str, int]:
    """Restarts per role over every launcher of the run (what ``summary.json`` reports)."""
    counts: dict[str, int] = {}
    for launcher in read_status_files(run_dir).values():
        roles = launcher.get("roles")
        for name, entry in (roles.items() if isinstance(roles, dict) else []):
            restarts = entry.get("restarts") if isinstance(entry, dict) else None
            if isinstance(restarts, int) and not isinstance(restarts, bool):
                counts[name] = counts.get(name, 0) + restarts
    return counts
