"""Reading a run directory (DESIGN §4) from outside the run: its config, summary and checkpoints.

``zmqrl plot``, ``zmqrl enjoy`` and :func:`zmqrl.load_policy` find what they show here. A
directory is a run directory when it holds the ``config.yaml`` every run writes first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from zmqrl.config import Config, ConfigError, load
from zmqrl.run import checkpoint
from zmqrl.run.checkpoint import CheckpointError

CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.json"
FIRST_BATCH_FILE = "first_batch.json"  # written by the learner once the first batch is in replay
FIRST_UPDATE_FILE = "first_update.json"  # written by the learner once its first optimisation step is done
NAMED_CHECKPOINTS = ("best", "latest")


class RunDirError(ConfigError):
    """A path that is not a run directory, or one with nothing to show; the message names it."""


def require_run_dir(path: str | Path) -> Path:
    """``path`` if it is a run directory, else a :class:`RunDirError` saying what is missing."""
    path = Path(path)
    if not path.is_dir():
        raise RunDirError(f"{path}: no such directory")
    if not (path / CONFIG_FILE).is_file():
        raise RunDirError(f"{path}: not a run directory (no {CONFIG_FILE}; `zmqrl train` and `zmqrl local` "
                          "write one into every run directory)")
    return path


def run_config(path: str | Path) -> Config:
    """The resolved config the run used, checked against the schema."""
    return load(require_run_dir(path) / CONFIG_FILE)


def raw_config(path: str | Path) -> dict[str, Any]:
    """``config.yaml`` as plain data (for comparing runs)."""
    file = require_run_dir(path) / CONFIG_FILE
    try:
        data = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise RunDirError(f"{file}: unreadable: {exc}") from None
    if not isinstance(data, dict):
        raise RunDirError(f"{file}: expected a mapping at the top level")
    return data


def read_summary(path: str | Path) -> dict[str, Any] | None:
    """``summary.json`` (None while a run has not written one yet)."""
    file = Path(path) / SUMMARY_FILE
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{file}: unreadable: {exc}") from None
    return data if isinstance(data, dict) else None


def checkpoints(path: str | Path) -> list[str]:
    """Names of the run's checkpoints: ``best``, ``latest``, then numbered ones in step order."""
    root = Path(path) / "checkpoints"
    if not root.is_dir():
        return []
    names = set()
    for entry in root.iterdir():
        name = entry.name[:-4] if entry.name.endswith(".old") else entry.name
        if not name.startswith(".") and (entry / checkpoint.STATE_FILE).is_file():
            names.add(name)
    named = [n for n in NAMED_CHECKPOINTS if n in names]
    numbered = sorted((n for n in names if n.isdigit()), key=int)
    return named + numbered + sorted(names - set(named) - set(numbered))


def checkpoint_dir(path: str | Path, which: str | int = "best") -> Path:
    """The directory of checkpoint ``which`` (``best``, ``latest`` or a number of optimisation steps).

    A name that is none of these is a :class:`ConfigError`; a checkpoint the run does not have is
    a :class:`CheckpointError` naming the directory and listing those it has.
    """
    run = require_run_dir(path)
    name = str(which)
    if name not in NAMED_CHECKPOINTS and not name.isdigit():
        raise ConfigError(f"--checkpoint: expected best, latest or a number of optimisation steps, got {name!r}")
    target = run / "checkpoints" / name
    try:
        return checkpoint.resolve(target)
    except CheckpointError:
        have = checkpoints(run)
        raise CheckpointError(f"{target}: no such checkpoint in this run; it has "
                              f"{', '.join(have) if have else 'none yet'}") from None
