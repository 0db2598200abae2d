"""Reading a checkpoint to continue from, before anything in the run directory is written.

:func:`read_resume_point` loads ``checkpoints/latest`` into the agent and the replay and checks
that every part fits this config (a :class:`~zmqrl.run.checkpoint.CheckpointError` naming the file
if not); the :class:`ResumePoint` carries the rest (counters, RNGs, notes on what is not exact)
to the bookkeeping. :func:`zmqrl.run.startup.open_run` is the one caller.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zmqrl.config import Config, ConfigError
from zmqrl.core import Agent, ReplayBuffer
from zmqrl.run import checkpoint
from zmqrl.run.checkpoint import REPLAY_FILE
from zmqrl.run.rundir import RunDir

if TYPE_CHECKING:
    import torch

log = logging.getLogger("zmqrl")


def _device_of(agent: Any) -> torch.device:
    import torch

    return getattr(agent, "device", torch.device("cpu"))


def require_checkpoint(run_dir: str | Path | None, resume: bool) -> None:
    """Before touching anything: ``--resume`` needs a run directory with a readable latest checkpoint."""
    if not resume:
        return
    if not run_dir:
        raise ConfigError("--resume needs --run-dir (the run directory to continue)")
    checkpoint.resolve(RunDir(run_dir).latest)


@dataclass
class ResumePoint:
    """A checkpoint read and checked before anything in the run directory is written."""

    directory: Path  # the checkpoint directory read: checkpoints/latest, or latest.old after an interrupted swap
    state: dict[str, Any]  # its state.json
    torch_rng: Any  # torch's global RNG state, or None
    notes: list[str] = field(default_factory=list)  # why continuing from it is not exact (empty when it is)


def read_resume_point(cfg: Config, run_dir: str | Path, agent: Agent,
                      replay: ReplayBuffer | None = None) -> ResumePoint:
    """Load ``RUN_DIR/checkpoints/latest`` into ``agent`` (and ``replay``, when given), checking
    that each part fits this config; writes nothing. Any problem is a CheckpointError naming the file."""
    directory = checkpoint.resolve(RunDir(run_dir).latest)
    agent_state, state = checkpoint.load(directory, map_location=_device_of(agent))
    torch_rng = agent_state.pop("torch_rng", None)
    agent_state.pop(checkpoint.POLICY_KEY, None)
    try:
        agent.load_state_dict(agent_state)
    except (KeyError, RuntimeError, ValueError, TypeError) as exc:
        raise checkpoint.CheckpointError(f"{directory / checkpoint.AGENT_FILE}: does not fit this config's agent: "
                                         f"{one_line(exc)}") from None
    point = ResumePoint(directory, state, torch_rng)
    if replay is not None:
        point.notes += load_replay(cfg, replay, directory, state)
    return point


def one_line(exc: BaseException, limit: int = 400) -> str:
    """An exception's message on one line (torch's span several), cut to ``limit`` characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _stamp(replay_state: Mapping[str, Any]) -> dict[str, Any]:
    """What identifies a replay snapshot: its counters, sampling RNG and schedules (JSON values)."""
    keys = ("ptr", "size", "added", "rng", "sample_calls", "max_priority")
    return json.loads(json.dumps({k: replay_state[k] for k in keys if k in replay_state}))


def load_replay(cfg: Config, replay: ReplayBuffer, directory: Path, state: dict[str, Any]) -> list[str]:
    """Restore the replay of the checkpoint in ``directory`` (with ``state``, its state.json);
    returns why this is not exact (empty when it is).

    With ``trainer.checkpoint_replay`` the contents come from the checkpoint's ``replay.npz``
    (or, from runs of earlier versions, ``checkpoints/replay.npz``), which must be the snapshot
    taken with this checkpoint: its counters and sampling RNG must equal those in state.json.
    Otherwise the replay starts empty, keeping the sampling RNG, beta schedule and max priority.
    """
    saved = state.get("replay")
    if cfg.trainer.checkpoint_replay:
        for path in (directory / REPLAY_FILE, directory.parent / REPLAY_FILE):
            if path.is_file():
                _load_replay_file(replay, path, directory, state)
                return []
    if isinstance(saved, dict):
        try:
            replay.load_state_dict({**saved, "ptr": 0, "size": 0})
        except (KeyError, ValueError, TypeError) as exc:
            raise checkpoint.CheckpointError(f"{directory / checkpoint.STATE_FILE}: the replay state does not fit "
                                             f"this config's replay: {one_line(exc)}") from None
    why = "trainer.checkpoint_replay is off" if not cfg.trainer.checkpoint_replay else \
        f"the checkpoint holds no {REPLAY_FILE}"
    return [f"replay contents are not saved ({why}): the replay starts empty and warms up again"]


def _load_replay_file(replay: ReplayBuffer, path: Path, directory: Path, state: dict[str, Any]) -> None:
    try:
        stamp = replay.load(str(path))
    except (*checkpoint.FILE_ERRORS, AttributeError, RuntimeError, MemoryError) as exc:
        text = one_line(exc)
        detail = text if text.startswith(str(path)) else f"{path}: {type(exc).__name__}: {text}"
        raise checkpoint.CheckpointError(f"unreadable replay snapshot: {detail}") from None
    expected, saved = directory / checkpoint.STATE_FILE, state.get("replay")
    if not isinstance(saved, dict):
        raise checkpoint.CheckpointError(f"{path}: cannot be checked against {expected}, which has no replay state")
    got, want = _stamp(replay.state_dict()), _stamp(saved)
    stamped = stamp.get("opt_steps") if isinstance(stamp, dict) else None
    if got != want or (stamped is not None and stamped != state.get("opt_steps")):
        raise checkpoint.CheckpointError(
            f"{path}: is not the replay snapshot of {directory} (it holds {got.get('size')} transitions of "
            f"{got.get('added')} added, {expected} expects {want.get('size')} of {want.get('added')}); "
            f"remove it to resume with an empty replay")
    log.info("restored %d transitions from %s", len(replay), path)
