"""Atomic checkpoints: write everything under a temporary name, then rename into place.

A checkpoint is a directory holding ``agent.pt`` (networks and optimiser, read back with
``torch.load(weights_only=True)`` so no code is ever executed from it; under ``policy``, the
named parameters an actor acts with, whichever algorithm wrote it) and ``state.json``
(counters, model version, schedules, RNG states). One written by the evaluator (``best`` of a
distributed run) holds the policy alone: ``policy.npz`` (see :func:`write_tree`) in place of
``agent.pt``, written and read without torch. Replacing an existing directory takes two
renames: the old copy moves to ``NAME.old`` first and is deleted only after the new one is in
place; :func:`load` falls back to ``NAME.old`` if a crash happened in between. Every file of
the temporary directory, then the directory itself, is fsynced before the rename, and the parent
after it, so neither a crash nor a power loss can leave a torn checkpoint.

A process killed while writing leaves its temporary (``.NAME.tmp-PID``) behind; every save
removes those of processes no longer alive from its parent directory first
(:func:`remove_stale_temporaries`), and any ``NAME.old`` that a complete ``NAME`` has made
unnecessary.

Other files of a checkpoint that hold nested plain data (numbers, strings, numpy arrays, lists,
tuples, dicts), such as the state of the envs, go through :func:`write_tree` and
:func:`read_tree`: an ``.npz`` of the arrays and a JSON outline, read back without pickles.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import shutil
import stat
import threading
import zipfile
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from zmqrl.config import ConfigError
from zmqrl.run.rundir import NAMED_CHECKPOINTS, RunDir, require_run_dir, write_json_atomic

if TYPE_CHECKING:
    import torch

AGENT_FILE = "agent.pt"
STATE_FILE = "state.json"
REPLAY_FILE = "replay.npz"  # in checkpoints/latest with trainer.checkpoint_replay: the replay contents
POLICY_FILE = "policy.npz"  # instead of agent.pt in a checkpoint of the policy alone (the evaluator's best)
POLICY_KEY = "policy"  # in agent.pt of every checkpoint: the policy parameters actors act with
TREE_KEY = "__tree__"  # in a file written by write_tree: the JSON outline, as uint8 bytes
# What reading a damaged file can raise; readers turn each into one CheckpointError naming the file.
FILE_ERRORS = (OSError, EOFError, ValueError, KeyError, TypeError, IndexError, zipfile.BadZipFile, zlib.error)
OLD_SUFFIX = ".old"  # NAME.old: the previous copy while NAME is being replaced
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.tmp-(?P<pid>[0-9]+)")  # .NAME.tmp-PID, written by process PID

log = logging.getLogger("zmqrl")
_in_flight: set[Path] = set()  # temporaries this process is writing now (a background save among them)
_in_flight_lock = threading.Lock()


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


def _fsync_tree(root: Path) -> None:
    """Fsync every regular file under ``root``, then each directory, ``root`` last (links are not followed)."""
    for parent, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            path = os.path.join(parent, name)
            if not stat.S_ISREG(os.lstat(path).st_mode):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(parent))


def _remove(path: Path) -> None:
    """Delete a file or a directory tree, whichever ``path`` is; gone already, or removed meanwhile
    by another save, is fine."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            if path.exists():
                shutil.rmtree(path)  # again, for the error that kept it
        else:
            path.unlink()
    except FileNotFoundError:
        pass


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists here and is not a zombie (one that cannot write any more)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True  # another user's process
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[:1] != ["Z"]
    except OSError:
        return True


def remove_stale_temporaries(ckpt_dir: str | Path) -> list[Path]:
    """Delete what interrupted saves left in ``ckpt_dir``; returns the paths removed.

    A temporary ``.NAME.tmp-PID`` goes when process PID is gone, or is this process and not one
    of its saves in progress (an earlier process had the same PID). ``NAME.old`` goes only when
    ``NAME`` is complete (what :func:`resolve` reads) and no live process is writing ``NAME``:
    after an interrupted swap it is the only good copy, and is kept.
    """
    ckpt_dir = Path(ckpt_dir)
    try:
        names = os.listdir(ckpt_dir)
    except OSError:
        return []
    with _in_flight_lock:
        in_flight = set(_in_flight)
    stale: list[Path] = []
    being_written: set[str] = set()
    for name in names:
        match = _TEMPORARY.fullmatch(name)
        if match is None:
            continue
        pid, path = int(match["pid"]), ckpt_dir / name
        if path in in_flight or (pid != os.getpid() and _pid_alive(pid)):
            being_written.add(match["name"])
        else:
            stale.append(path)
    for name in names:
        if name.endswith(OLD_SUFFIX) and not name.startswith("."):
            current = name[:-len(OLD_SUFFIX)]
            if current not in being_written and (ckpt_dir / current / STATE_FILE).is_file():
                stale.append(ckpt_dir / name)
    removed = []
    for path in stale:
        try:
            _remove(path)
        except OSError as exc:
            log.warning("could not remove %s, left by an interrupted save: %s", path, exc)
            continue
        log.info("removed %s, left by an interrupted save", path)
        removed.append(path)
    return removed


def save(directory: str | Path, agent_state: dict[str, Any], state: dict[str, Any],
         extra_files: Mapping[str, Callable[[Path], Any]] | None = None) -> Path:
    """Write a checkpoint to ``directory`` atomically; ``extra_files`` maps names to callables(path)."""
    def write(tmp: Path) -> None:
        import torch  # here, not at the top: roles that never checkpoint need not load torch

        torch.save(agent_state, tmp / AGENT_FILE)
        write_json_atomic(tmp / STATE_FILE, state)
        for name, writer in (extra_files or {}).items():
            writer(tmp / name)

    return _write_atomically(Path(directory), write)


def save_policy(directory: str | Path, params: Mapping[str, np.ndarray], state: dict[str, Any]) -> Path:
    """Write a checkpoint of the policy alone (``policy.npz``: the named arrays an actor acts with,
    and ``state.json``) atomically, without torch: what the evaluator keeps as ``best``. Importing
    torch to write ``agent.pt`` cost the evaluator 1.2 s of CPU, taken from the learner just as
    it began to train."""
    def write(tmp: Path) -> None:
        write_tree(tmp / POLICY_FILE, {name: np.asarray(value) for name, value in params.items()})
        write_json_atomic(tmp / STATE_FILE, state)

    return _write_atomically(Path(directory), write)


def _write_atomically(directory: Path, write: Callable[[Path], None]) -> Path:
    """``write(tmp)`` fills a fresh temporary directory, which then replaces ``directory`` (module docstring)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}")
    with _in_flight_lock:
        _in_flight.add(tmp)
    try:
        remove_stale_temporaries(directory.parent)
        _remove(tmp)
        tmp.mkdir()
        try:
            write(tmp)
            _fsync_tree(tmp)  # whatever the writers made: they need not fsync their own files
            _swap_in(tmp, directory)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        with _in_flight_lock:
            _in_flight.discard(tmp)
    return directory


def _swap_in(tmp: Path, directory: Path) -> None:
    """Rename the complete, fsynced ``tmp`` to ``directory``; any previous copy waits as ``NAME.old``
    until the rename is durable."""
    old = directory.with_name(directory.name + OLD_SUFFIX)
    if directory.exists():
        if (directory / STATE_FILE).is_file() or not (old / STATE_FILE).is_file():
            _remove(old)
            os.replace(directory, old)
        else:  # not a checkpoint; the copy resolve reads is NAME.old, kept until the new one is in place
            _remove(directory)
    os.replace(tmp, directory)
    _fsync_dir(directory.parent)
    try:
        _remove(old)
    except OSError as exc:  # the new copy is in place; the next save in this directory tries again
        log.warning("could not remove %s: %s", old, exc)


def copy(src: str | Path, dest: str | Path) -> Path:
    """Copy a finished checkpoint to another name, atomically."""
    def write(tmp: Path) -> None:
        shutil.copytree(src, tmp, dirs_exist_ok=True)

    return _write_atomically(Path(dest), write)


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
    agent_path = directory / AGENT_FILE
    state = _read_state(directory)
    if not agent_path.is_file():
        if (directory / POLICY_FILE).is_file():
            raise CheckpointError(f"{agent_path}: missing; this checkpoint holds the policy alone ({POLICY_FILE}, "
                                  "as the evaluator keeps checkpoints/best), no training state")
        raise CheckpointError(f"{agent_path}: missing")
    import torch

    try:
        agent_state = torch.load(agent_path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises many types for corrupt files
        raise CheckpointError(f"{agent_path}: unreadable checkpoint: {type(exc).__name__}: {exc}") from None
    if not isinstance(agent_state, dict):
        raise CheckpointError(f"{agent_path}: expected a dict of agent state")
    return agent_state, state


def _read_state(directory: Path) -> dict[str, Any]:
    state_path = directory / STATE_FILE
    try:
        state = json.loads(state_path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{state_path}: unreadable checkpoint state: {exc}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{state_path}: expected a JSON object")
    return state


def _encode(value: Any, arrays: dict[str, np.ndarray], where: str) -> Any:
    """JSON for ``value``; arrays go to ``arrays`` and are referenced by name."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (np.ndarray, np.generic)) and not value.dtype.hasobject:
        name = f"a{len(arrays)}"
        arrays[name] = np.asarray(value)
        return {"__array__" if isinstance(value, np.ndarray) else "__scalar__": name}
    if isinstance(value, list):
        return [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, collections.deque):
        return {"__deque__": [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(value)],
                "maxlen": value.maxlen}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"__dict__": {k: _encode(v, arrays, f"{where}.{k}") for k, v in value.items()}}
    raise TypeError(f"{where}: {type(value).__name__} is not plain data")


def _decode(node: Any, arrays: dict[str, np.ndarray]) -> Any:
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [_decode(v, arrays) for v in node]
    if not isinstance(node, dict) or len(node) not in (1, 2):
        raise ValueError(f"unexpected node in the outline: {str(node)[:80]}")
    if "__array__" in node:
        return arrays[node["__array__"]]
    if "__scalar__" in node:
        scalar = arrays[node["__scalar__"]]
        if scalar.ndim != 0:
            raise ValueError(f"scalar {node['__scalar__']!r} has shape {scalar.shape}")
        return scalar[()]
    if "__tuple__" in node:
        return tuple(_decode(v, arrays) for v in node["__tuple__"])
    if "__deque__" in node:
        return collections.deque((_decode(v, arrays) for v in node["__deque__"]), maxlen=node.get("maxlen"))
    if "__dict__" in node and isinstance(node["__dict__"], dict):
        return {k: _decode(v, arrays) for k, v in node["__dict__"].items()}
    raise ValueError(f"unexpected node in the outline: {str(node)[:80]}")


def write_tree(path: str | Path, tree: Any) -> None:
    """Write nested plain data (see :func:`is_plain`) to an ``.npz`` at ``path``: each array as
    an array, the rest as a JSON outline. Types survive the round trip (int, float, tuple, numpy
    scalar dtypes, NaN). TypeError names the first part that is not plain data."""
    arrays: dict[str, np.ndarray] = {}
    outline = json.dumps(_encode(tree, arrays, "tree")).encode("utf-8")
    arrays[TREE_KEY] = np.frombuffer(outline, dtype=np.uint8)
    with open(path, "wb") as fh:
        np.savez(fh, allow_pickle=False, **arrays)
        fh.flush()
        os.fsync(fh.fileno())


def read_tree(path: str | Path) -> Any:
    """Read a file written by :func:`write_tree` (no pickles); any problem is a
    :class:`CheckpointError` naming the file."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        outline = arrays.pop(TREE_KEY)
        if outline.dtype != np.uint8 or outline.ndim != 1:
            raise ValueError(f"{TREE_KEY!r}: expected 1-D uint8 JSON bytes, got {outline.dtype} {outline.shape}")
        return _decode(json.loads(outline.tobytes().decode("utf-8")), arrays)
    except FILE_ERRORS as exc:
        detail = f"missing {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        raise CheckpointError(f"{path}: unreadable: {detail}") from None


def policy_tensors(params: dict[str, Any]) -> dict[str, Any]:
    """Named numpy arrays as CPU tensors (what ``agent.pt`` stores under :data:`POLICY_KEY`)."""
    import numpy as np
    import torch

    return {k: torch.from_numpy(np.array(v, copy=True)) for k, v in params.items()}


def policy_file(directory: str | Path) -> Path:
    """The file a checkpoint's policy parameters are read from: ``policy.npz`` where the checkpoint
    holds the policy alone, else ``agent.pt``."""
    directory = resolve(directory)
    return directory / POLICY_FILE if (directory / POLICY_FILE).is_file() else directory / AGENT_FILE


def load_policy_params(directory: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The policy parameters (named numpy arrays) and ``state.json`` of any checkpoint (torch is
    imported only for one with ``agent.pt``)."""
    path = policy_file(directory)
    if path.name == POLICY_FILE:
        params = read_tree(path)
        if not isinstance(params, dict) or not params or \
                not all(isinstance(v, np.ndarray) and v.dtype.kind == "f" for v in params.values()):
            raise CheckpointError(f"{path}: expected named float arrays (the policy parameters)")
        return params, _read_state(path.parent)
    agent_state, state = load(directory)
    params = agent_state.get(POLICY_KEY)
    if not isinstance(params, dict) or not params:
        raise CheckpointError(f"{resolve(directory) / AGENT_FILE}: holds no policy parameters ('{POLICY_KEY}')")
    return {k: v.detach().cpu().numpy() for k, v in params.items()}, state


def checkpoints(path: str | Path) -> list[str]:
    """Names of the run's checkpoints: ``best``, ``latest``, then numbered ones in step order."""
    root = RunDir(path).checkpoints
    if not root.is_dir():
        return []
    names = set()
    for entry in root.iterdir():
        name = entry.name[:-4] if entry.name.endswith(".old") else entry.name
        if not name.startswith(".") and (entry / STATE_FILE).is_file():
            names.add(name)
    named = [n for n in NAMED_CHECKPOINTS if n in names]
    numbered = sorted((n for n in names if n.isdigit()), key=int)
    return named + numbered + sorted(names - set(named) - set(numbered))


def checkpoint_dir(path: str | Path, which: str | int = "best") -> Path:
    """The directory of checkpoint ``which`` (``best``, ``latest`` or a number of optimisation steps).

    A name that is none of these is a :class:`ConfigError`; a checkpoint the run does not have is
    a :class:`CheckpointError` naming the directory and listing those it has.
    """
    run = RunDir(require_run_dir(path))
    name = str(which)
    if name not in NAMED_CHECKPOINTS and not name.isdigit():
        raise ConfigError(f"--checkpoint: expected best, latest or a number of optimisation steps, got {name!r}")
    target = run.checkpoint(name)
    try:
        return resolve(target)
    except CheckpointError:
        have = checkpoints(run.path)
        raise CheckpointError(f"{target}: no such checkpoint in this run; it has "
                              f"{', '.join(have) if have else 'none yet'}") from None
