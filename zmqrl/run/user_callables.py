"""The callables a run is given from Python (:mod:`zmqrl.callables`): the config key that names each
file, where a run directory keeps them, and how every process finds them.

``env.fn``, ``env.wrappers_fn`` and ``agent.network_fn`` each name a callables file; a relative path is
relative to the run directory (where zmqrl writes them: ``RUN_DIR/callables/KIND.pkl``), so a run
directory can move and ``zmqrl local --resume`` or ``zmqrl enjoy`` still finds them. Every process
resolves them once, when it loads its config (:func:`resolve`), and ``config.yaml`` holds them relative
again (:func:`portable`). The sha256 of each file is part of the run's task signature (:func:`hashes`),
so a role whose file differs from the learner's is refused, naming both.
"""

from __future__ import annotations

import copy
import logging
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from zmqrl import callables
from zmqrl.config import Config, ConfigError
from zmqrl.run.rundir import RunDir, callable_name

log = logging.getLogger("zmqrl")

KEYS = {"env": "env.fn", "wrappers": "env.wrappers_fn", "network": "agent.network_fn"}  # kind -> config key
FLAGS = {"env": "--env-fn", "wrappers": "--wrappers-fn", "network": "--network-fn"}  # kind -> launcher flag
SIGNATURE_FIELDS = {"env": "env_fn", "wrappers": "wrappers_fn", "network": "network_fn"}  # kind -> signature field


def _where(cfg: Config, kind: str) -> tuple[Any, str]:
    section, field = KEYS[kind].split(".")
    return getattr(cfg, section), field


def value(cfg: Config, kind: str) -> str:
    """The path the config names for ``kind`` ("" for none)."""
    section, field = _where(cfg, kind)
    return str(getattr(section, field) or "")


def set_value(cfg: Config, kind: str, path: str) -> None:
    section, field = _where(cfg, kind)
    setattr(section, field, path)


def configured(cfg: Config) -> dict[str, str]:
    """The callables files the config names, by kind."""
    return {kind: value(cfg, kind) for kind in KEYS if value(cfg, kind)}


def resolve(cfg: Config, run_dir: str | Path | None) -> Config:
    """Make the config's callables paths absolute (in place; returns ``cfg``): a relative one against
    ``run_dir``, or the working directory where there is none."""
    base = Path(run_dir) if run_dir else Path.cwd()
    for kind, path in configured(cfg).items():
        file = Path(path).expanduser()
        set_value(cfg, kind, str((file if file.is_absolute() else base / file).absolute()))
    return cfg


def portable(cfg: Config, run_dir: str | Path) -> Config:
    """``cfg`` as ``config.yaml`` holds it: callables files inside ``run_dir`` named relative to it (a copy;
    ``cfg`` itself where it names none)."""
    names = configured(cfg)
    if not names:
        return cfg
    out = copy.deepcopy(cfg)
    base = Path(run_dir).absolute()
    for kind, path in names.items():
        try:
            set_value(out, kind, str(Path(path).absolute().relative_to(base)))
        except ValueError:  # outside the run directory: kept as it is
            pass
    return out


def save(cfg: Config, run_dir: str | Path, objects: Mapping[str, Any]) -> dict[str, str]:
    """Write each callable of ``objects`` (kind -> a callable, or a list of wrappers; None skipped) into
    ``RUN_DIR/callables/KIND.pkl`` and point its key there; with an env factory, ``env.id`` becomes the
    env's name (a label for logs and records). Returns the files' sha256 by kind."""
    run = RunDir(run_dir)
    digests = {}
    for kind, obj in objects.items():
        if obj is None:
            continue
        if kind not in KEYS:
            raise ValueError(f"unknown kind of callable {kind!r}; known: {', '.join(KEYS)}")
        file = run.callable_file(kind)
        try:
            callables.check_object(obj, kind)
        except TypeError as exc:
            raise ConfigError(f"{kind}=: {exc}") from None
        try:
            digests[kind] = callables.write(file, obj, kind)
        except Exception as exc:  # what cloudpickle cannot pickle (a lock, an open file) says what it is
            raise ConfigError(f"{kind}=: cannot be pickled with cloudpickle: {type(exc).__name__}: {exc}") from None
        set_value(cfg, kind, str(file.absolute()))
    if "env" in digests:
        label(cfg)
    return digests


def adopt(cfg: Config, run_dir: str | Path | None, files: Mapping[str, str | None], copy_in: bool = True) -> list[str]:
    """The launchers' ``--env-fn FILE`` and the like: each file checked (it loads here, of its kind), then
    with ``copy_in`` copied into ``RUN_DIR/callables/`` (where a resume and ``zmqrl enjoy`` find it), else
    used where it lies; its key points there. Returns the ``--set`` overrides that tell the roles so."""
    overrides = []
    for kind, given in files.items():
        if not given:
            continue
        source = Path(given).expanduser().absolute()
        callables.load(source, kind, FLAGS[kind])
        target = source
        if copy_in:
            if not run_dir:
                raise ConfigError(f"{FLAGS[kind]} needs --run-dir (the file is copied into it)")
            target = RunDir(run_dir).callable_file(kind).absolute()
            if target != source:
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.exists() and callables.sha256(target) != callables.sha256(source):
                    log.warning("%s: replacing %s (sha256 %s) with %s (sha256 %s)", FLAGS[kind], target,
                                callables.sha256(target)[:12], source, callables.sha256(source)[:12])
                shutil.copyfile(source, target)
        set_value(cfg, kind, str(target))
        overrides.append(f"{KEYS[kind]}={callable_name(kind) if copy_in else target}")
    if files.get("env"):
        label(cfg)
        overrides.append(f"env.id={cfg.env.id}")
    return overrides


def label(cfg: Config) -> None:
    """``env.id`` as the name of the env ``env.fn`` makes: its registered id where it has one, else its class's."""
    from zmqrl.envs.factory import make_env

    env = make_env(cfg.env)
    try:
        spec = getattr(env, "spec", None)
        cfg.env.id = spec.id if spec is not None and spec.id else type(env.unwrapped).__name__
    finally:
        env.close()


def check(cfg: Config, hint: str = "") -> None:
    """Load every callables file the config names (each is unpickled once per process), so a missing,
    foreign or broken one is a ConfigError before any role starts; ``hint`` ends the message."""
    for kind, path in configured(cfg).items():
        try:
            callables.load(path, kind, KEYS[kind])
        except ConfigError as exc:
            raise ConfigError(f"{exc}{hint.format(flag=FLAGS[kind], kind=kind) if hint else ''}") from None


def hashes(cfg: Config) -> dict[str, str | None]:
    """The sha256 of each callables file by signature field (None where the config names none)."""
    out: dict[str, str | None] = dict.fromkeys(SIGNATURE_FIELDS.values())
    for kind, path in configured(cfg).items():
        out[SIGNATURE_FIELDS[kind]] = callables.load(path, kind, KEYS[kind]).sha256
    return out


def describe(cfg: Config) -> str:
    """One line for logs: each callables file, its callable's name and its sha256's start."""
    parts = []
    for kind, path in configured(cfg).items():
        loaded = callables.load(path, kind, KEYS[kind])
        parts.append(f"{KEYS[kind]}={loaded.name} ({path}, sha256 {loaded.sha256[:12]})")
    return "; ".join(parts)


def objects(env: Any = None, wrappers: Sequence[Any] | Any = None, network: Any = None) -> dict[str, Any]:
    """The API's keyword arguments by kind."""
    return {"env": env, "wrappers": wrappers, "network": network}


HOST_HINT = ("; a host reads the file its own config names: give it the head's with zmqrl host {flag} FILE (a copy of "
             "the head's RUN_DIR/callables/{kind}.pkl, or that path on a shared file system)")


def announce(cfg: Config, who: str, hint: str = "") -> None:
    """A launcher's check of the callables files before it starts any role (:func:`check`), and its log line."""
    if configured(cfg):
        check(cfg, hint)
        log.info("%s: callables from Python: %s", who, describe(cfg))
