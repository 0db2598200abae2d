"""Callables from Python in a file: an env factory, env wrappers or a torch torso that the user hands
zmqrl (``zmqrl.run_local(cfg, env=make_env)``), written with cloudpickle so that a lambda, a closure or
a class defined in ``__main__`` or a notebook reaches every process of the run.

The trust line (docs/design.md, "Callables from Python"): these files are the only pickles zmqrl
loads, and only from a path the user's own hand or launcher put in the config (``env.fn``,
``env.wrappers_fn``, ``agent.network_fn``). Nothing received on a socket is ever unpickled.

A file is a small header, then the pickle::

    zmqrl-callable 1\\n
    {"kind": "env", "name": "CoinFlip", "python": "3.11", "cloudpickle": "3.1.3", "zmqrl": "0.1.0"}\\n
    <cloudpickle bytes>

so that one written by another Python (major.minor: what its bytecode depends on) or another
cloudpickle version is refused with both versions named, before a byte of the pickle is read. The
sha256 of the whole file is what the run's task signature carries: a role whose file differs from the
learner's is refused with both hashes. Standard library and the config's schema only (cloudpickle is imported
to write or load).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zmqrl.config.schema import ConfigError

MAGIC = b"zmqrl-callable 1\n"
MAX_HEADER = 4096  # bytes of the JSON header line, at most
KINDS = ("env", "wrappers", "network")  # what a file holds: an env factory, a list of wrappers, a torso factory


def python_version() -> str:
    """This interpreter's ``major.minor``: a pickle of code is bound to it."""
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def cloudpickle_version() -> str:
    import cloudpickle

    return str(cloudpickle.__version__)


class CallableFileError(ConfigError):
    """A callables file that cannot be used here; the message names the file (and the config key)."""


@dataclass(frozen=True)
class Loaded:
    """A callables file read and unpickled: what it holds, its header and the sha256 of the file."""

    obj: Any
    path: Path
    sha256: str
    header: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.header.get("name", ""))


def describe(obj: Any) -> str:
    """A short name for a callable (or a list of them): its qualified name, or its type's."""
    if isinstance(obj, (list, tuple)):
        return ", ".join(describe(o) for o in obj)
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return str(name).replace(".<locals>", "")


def check_object(obj: Any, kind: str) -> Any:
    """``obj`` as a file of ``kind`` holds it (wrappers as a list), or a TypeError saying what is expected."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind == "wrappers":
        items = list(obj) if isinstance(obj, (list, tuple)) else [obj]
        for item in items:
            if not callable(item):
                raise TypeError(f"wrappers: each must be a callable taking an env and returning one, got {item!r}")
        return items
    if not callable(obj):
        what = "returning a gymnasium Env" if kind == "env" else "returning a torch module (the torso)"
        raise TypeError(f"{kind}: expected a callable {what}, got {obj!r}")
    return obj


def dumps(obj: Any, kind: str) -> bytes:
    """The bytes of a callables file holding ``obj`` (see the module docstring)."""
    import cloudpickle

    obj = check_object(obj, kind)
    header = {"kind": kind, "name": describe(obj), "python": python_version(),
              "cloudpickle": cloudpickle_version(), "zmqrl": _zmqrl_version()}
    payload = cloudpickle.dumps(obj, protocol=4)
    return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload


def write(path: str | Path, obj: Any, kind: str) -> str:
    """Write ``obj`` to ``path`` as a callables file of ``kind`` (atomically: a temporary name, then a
    rename); returns the file's sha256."""
    data = dumps(obj, kind)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return hashlib.sha256(data).hexdigest()


def read_header(data: bytes, where: str) -> tuple[dict[str, Any], int]:
    """The header of a callables file's bytes and where its pickle starts; CallableFileError naming
    ``where`` for bytes that are not such a file."""
    if not data.startswith(MAGIC):
        raise CallableFileError(f"{where}: not a zmqrl callables file (it does not start with "
                                f"{MAGIC.decode().strip()!r}); write one with zmqrl.save_callable(fn, path, kind)")
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + MAX_HEADER)
    try:
        if end < 0:
            raise ValueError("no end of line")
        header = json.loads(data[len(MAGIC):end])
        if not isinstance(header, dict):
            raise ValueError("not a mapping")
    except ValueError as exc:
        raise CallableFileError(f"{where}: its header is unreadable ({exc})") from None
    return header, end + 1


_CACHE: dict[tuple[str, int, int, str], Loaded] = {}  # (path, mtime_ns, size, kind) -> what it held


def load(path: str | Path, kind: str, key: str = "") -> Loaded:
    """Read and unpickle the callables file ``path`` of ``kind``, checked first: its header, its kind,
    and the Python and cloudpickle versions that wrote it against this process's. Each file is unpickled
    once per process (again when it changes). ``key`` (``env.fn``, say) starts every error message."""
    where = f"{key}: {path}" if key else str(path)
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as exc:
        raise CallableFileError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    cache_key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size, kind)
    if cache_key in _CACHE:
        return _CACHE[cache_key]
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CallableFileError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    header, start = read_header(data, where)
    if header.get("kind") != kind:
        raise CallableFileError(f"{where}: it holds {header.get('kind')!r} ({header.get('name', '?')}), not {kind!r}")
    mine = {"python": python_version(), "cloudpickle": cloudpickle_version()}
    theirs = {k: str(header.get(k)) for k in mine}
    if theirs != mine:
        raise CallableFileError(
            f"{where}: written by Python {theirs['python']} with cloudpickle {theirs['cloudpickle']}, but this is "
            f"Python {mine['python']} with cloudpickle {mine['cloudpickle']}; a pickle of code loads only where both "
            "match: write the file again with this Python (zmqrl.save_callable), or run this role under the Python "
            "and cloudpickle that wrote it")
    import cloudpickle

    try:
        obj = cloudpickle.loads(data[start:])
    except Exception as exc:  # what the pickle refers to is missing here (a module, a class)
        raise CallableFileError(f"{where}: cannot be loaded here: {type(exc).__name__}: {exc} (every module the "
                                f"callable imports must be installed where it runs)") from None
    try:
        obj = check_object(obj, kind)
    except TypeError as exc:
        raise CallableFileError(f"{where}: {exc}") from None
    loaded = Loaded(obj, path, hashlib.sha256(data).hexdigest(), header)
    _CACHE[cache_key] = loaded
    return loaded


def sha256(path: str | Path) -> str:
    """The sha256 of a file (what the task signature carries for a callables file)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def call_with_space(factory: Callable[..., Any], space: Any) -> Any:
    """``factory(space)`` where it takes an argument, else ``factory()``: a torso factory may take the
    observation space (as Stable-Baselines3's feature extractors do) or nothing."""
    import inspect

    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: try with the space
        return factory(space)
    takes = any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)
    return factory(space) if takes else factory()


def _zmqrl_version() -> str:
    from zmqrl import __version__

    return __version__
