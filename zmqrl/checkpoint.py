"""Atomic checkpoints: write everything under a temporary name, then rename into place.

A checkpoint is a directory holding ``agent.pt`` (networks and optimiser, read back with
``torch.load(weights_only=True)`` so no code is ever executed from it; under ``policy``, the
named parameters an actor acts with, whichever algorithm wrote it) and ``state.json``
(counters, model version, schedules, RNG states). Replacing an existing directory takes two
renames: the old copy moves to ``NAME.old`` first and is deleted only after the new one is in
place; :func:`load` falls back to ``NAME.old`` if a crash happened in between. A crash can
therefore never leave a torn checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

AGENT_FILE = "agent.pt"
STATE_FILE = "state.json"
POLICY_KEY = "policy"  # in agent.pt of every checkpoint: the policy parameters actors act with


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read; the message names the file."""


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON to ``path`` via a temporary file and a rename."""
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


def save(directory: str | Path, agent_state: dict[str, Any], state: dict[str, Any],
         extra_files: dict[str, Any] | None = None) -> Path:
    """Write a checkpoint to ``directory`` atomically; ``extra_files`` maps names to callables(path)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    import torch  # here, not at the top: roles that never checkpoint need not load torch

    try:
        torch.save(agent_state, tmp / AGENT_FILE)
        write_json_atomic(tmp / STATE_FILE, state)
        for name, writer in (extra_files or {}).items():
            writer(tmp / name)
        _fsync_dir(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = directory.with_name(directory.name + ".old")
    if directory.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(directory, old)
    os.replace(tmp, directory)
    _fsync_dir(directory.parent)
    if old.exists():
        shutil.rmtree(old)
    return directory


def copy(src: str | Path, dest: str | Path) -> Path:
    """Copy a finished checkpoint to another name, atomically."""
    src, dest = Path(src), Path(dest)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(src, tmp)
    old = dest.with_name(dest.name + ".old")
    if dest.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(dest, old)
    os.replace(tmp, dest)
    if old.exists():
        shutil.rmtree(old)
    return dest


def resolve(directory: str | Path) -> Path:
    """The checkpoint directory to read: ``directory`` or, after an interrupted swap, its ``.old``."""
    directory = Path(directory)
    if (directory / STATE_FILE).is_file():
        return directory
    old = directory.with_name(directory.name + ".old")
    if (old / STATE_FILE).is_file():
        return old
    raise CheckpointError(f"{directory}: no checkpoint here (missing {STATE_FILE})")


def load(directory: str | Path, map_location: str | torch.device = "cpu") -> tuple[dict[str, Any], dict[str, Any]]:
    """Read ``(agent_state, state)``; any problem is a :class:`CheckpointError` naming the file."""
    directory = resolve(directory)
    state_path, agent_path = directory / STATE_FILE, directory / AGENT_FILE
    try:
        state = json.loads(state_path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{state_path}: unreadable checkpoint state: {exc}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{state_path}: expected a JSON object")
    if not agent_path.is_file():
        raise CheckpointError(f"{agent_path}: missing")
    import torch

    try:
        agent_state = torch.load(agent_path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises many types for corrupt files
        raise CheckpointError(f"{agent_path}: unreadable checkpoint: {type(exc).__name__}: {exc}") from None
    if not isinstance(agent_state, dict):
        raise CheckpointError(f"{agent_path}: expected a dict of agent state")
    return agent_state, state


def policy_tensors(params: dict[str, Any]) -> dict[str, Any]:
    """Named numpy arrays as CPU tensors (what ``agent.pt`` stores under :data:`POLICY_KEY`)."""
    import numpy as np
    import torch

    return {k: torch.from_numpy(np.array(v, copy=True)) for k, v in params.items()}


def load_policy_params(directory: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The policy parameters (named numpy arrays) and ``state.json`` of any checkpoint."""
    agent_state, state = load(directory)
    params = agent_state.get(POLICY_KEY)
    if not isinstance(params, dict) or not params:
        raise CheckpointError(f"{resolve(directory) / AGENT_FILE}: holds no policy parameters ('{POLICY_KEY}')")
    return {k: v.detach().cpu().numpy() for k, v in params.items()}, state
