"""zmqrl from Python: load a config, train (in this process or with every role as a process), act.

The same functions the command line uses, with the same errors: a bad key, value or file is a
:class:`~zmqrl.config.ConfigError`, an unreadable checkpoint a
:class:`~zmqrl.run.checkpoint.CheckpointError`, each naming what is wrong. Everything is reachable
from the package (``zmqrl.load_config``, ``zmqrl.run_train``, ``zmqrl.run_local``,
``zmqrl.load_policy``, ``zmqrl.plot_runs``) without importing torch until it is needed::

    import zmqrl

    cfg = zmqrl.load_config("configs/cartpole_dqn.yaml", overrides=["trainer.max_opts=20000"])
    summary = zmqrl.run_train(cfg, run_dir="runs/api")     # or zmqrl.run_local(cfg, actors=2, ...)
    print(summary["best_eval_return"], summary["wall_s"])

    policy = zmqrl.load_policy("runs/api", checkpoint="best")
    action = policy.act(obs)                                # one observation, or a batch of them
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from zmqrl import config as config_mod
from zmqrl.config import Config, ConfigError
from zmqrl.tools.enjoy import TrainedPolicy, load_policy

__all__ = ["load_config", "run_train", "run_local", "load_policy", "save_callable", "TrainedPolicy"]


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """A config from a YAML file (the defaults when ``path`` is None) with ``section.key=value``
    overrides applied, as ``--set`` does; checked against the schema (``zmqrl config`` lists it)."""
    return config_mod.load(path, list(overrides))


def _logging_for(cfg: Config) -> None:
    """Log lines (progress, evaluations, the end table) when the caller has set up no logging."""
    if not logging.getLogger().handlers:
        from zmqrl.run.record import setup_logging

        setup_logging(cfg.run.log_level)


def _run_path(cfg: Config, run_dir: str | Path | None) -> Path:
    return Path(run_dir or cfg.run.run_dir or f"runs/{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}")


def _take_callables(cfg: Config, path: Path, env: Any, wrappers: Any, network: Any) -> bool:
    """The callables given (and those the config names already) into ``path``'s ``callables/``; returns whether
    the run has any."""
    from zmqrl.run import user_callables

    user_callables.resolve(cfg, path)  # a config.yaml of the run names its files relative to it
    user_callables.save(cfg, path, user_callables.objects(env, wrappers or None, network))
    return bool(user_callables.configured(cfg))


def run_train(cfg: Config, run_dir: str | Path | None = None, resume: bool = False, *,
              env: Callable[..., Any] | None = None, wrappers: Sequence[Callable[[Any], Any]] | None = None,
              network: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Train in this process, as ``zmqrl train`` does; returns the summary (also in ``summary.json``).

    The run directory is ``run_dir``, else ``cfg.run.run_dir``, else ``runs/<name>-<time>``; it is
    stored in ``cfg.run.run_dir``. ``resume`` continues from its ``checkpoints/latest``.

    ``env``: a callable returning a gymnasium Env (a function, a lambda, a closure, a class), used
    instead of ``env.id`` (called with ``env.kwargs``); ``wrappers``: callables each taking an env and
    returning one, applied after ``env.wrappers``; ``network``: a callable returning a torch module
    (taking the observation space, or nothing) that maps observations ``(B, *shape)`` to features
    ``(B, F)``, the torso the algorithm's heads sit on. Each is written with cloudpickle into
    ``RUN_DIR/callables/`` (``env.fn``, ``env.wrappers_fn``, ``agent.network_fn`` name the files).
    """
    from zmqrl.run.train import train as train_in_process

    _logging_for(cfg)
    if any(x is not None for x in (env, wrappers, network)) or _has_callables(cfg):
        run_dir = _run_path(cfg, run_dir)
        _take_callables(cfg, run_dir, env, wrappers, network)
    return train_in_process(cfg, run_dir, resume=resume)


def _has_callables(cfg: Config) -> bool:
    from zmqrl.run import user_callables

    return bool(user_callables.configured(cfg))


def save_callable(obj: Any, path: str | Path, kind: str = "env") -> str:
    """Write ``obj`` with cloudpickle to ``path`` as a callables file of ``kind`` (``env``: a factory returning an
    Env; ``wrappers``: a list of callables env -> env; ``network``: a torso factory); returns its sha256. What
    ``zmqrl head``, ``zmqrl host``, ``zmqrl local`` and ``zmqrl train`` take as ``--env-fn``, ``--wrappers-fn``
    and ``--network-fn``, for a run started from the command line or across machines."""
    from zmqrl import callables

    if kind not in callables.KINDS:
        raise ConfigError(f"kind: must be one of {', '.join(callables.KINDS)}, got {kind!r}")
    try:
        return callables.write(path, obj, kind)
    except TypeError as exc:
        raise ConfigError(str(exc)) from None


def run_local(cfg: Config, actors: int = 2, run_dir: str | Path | None = None,
              evaluator: bool = True, *, env: Callable[..., Any] | None = None,
              wrappers: Sequence[Callable[[Any], Any]] | None = None, network: Callable[..., Any] | None = None,
              resume: bool = False) -> dict[str, Any]:
    """A distributed run on this machine, as ``zmqrl local`` does: a learner, a proxy, ``actors``
    actor processes and (unless ``evaluator`` is False) the evaluator; returns the learner's summary.

    The roles read ``cfg`` from a YAML copy made for them. A role that fails is a
    :class:`RuntimeError` naming the exit code and the directory of the roles' logs. ``env``,
    ``wrappers`` and ``network`` are callables from Python, as :func:`run_train` takes them: written with
    cloudpickle into ``RUN_DIR/callables/``, from where every role loads them; an env or a torso that does
    not fit the config is a ConfigError here, before any process starts. ``resume`` continues the run in
    ``run_dir`` from its ``checkpoints/latest`` (its callables from its ``callables/``, unless given again).
    """
    from zmqrl.roles.launch.local import run_local as launch

    if actors < 1:
        raise ConfigError(f"actors must be >= 1, got {actors}")
    _logging_for(cfg)
    path = _run_path(cfg, run_dir)
    cfg.run.run_dir = str(path)
    cfg.actor.num_actors = actors
    if _take_callables(cfg, path, env, wrappers, network):
        from zmqrl.run.acting import make_task

        make_task(cfg)  # an env or a torso that does not fit is refused here, as each role would refuse it
    with tempfile.TemporaryDirectory(prefix="zmqrl-local-") as tmp:
        config_path = Path(tmp) / "config.yaml"
        config_mod.dump(cfg, config_path)
        code = launch(cfg, str(config_path), [], actors, str(path), evaluator=evaluator, resume=resume)
    from zmqrl.run.rundir import read_summary

    summary = read_summary(path)
    if code != 0 or summary is None:
        raise RuntimeError(f"zmqrl local: the run ended with exit code {code}"
                           f"{' and no summary.json' if summary is None else ''}; role logs are in {path / 'logs'}")
    return summary
