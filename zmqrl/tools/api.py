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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zmqrl import config as config_mod
from zmqrl.config import Config, ConfigError
from zmqrl.tools.enjoy import TrainedPolicy, load_policy

__all__ = ["load_config", "run_train", "run_local", "load_policy", "TrainedPolicy"]


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """A config from a YAML file (the defaults when ``path`` is None) with ``section.key=value``
    overrides applied, as ``--set`` does; checked against the schema (``zmqrl config`` lists it)."""
    return config_mod.load(path, list(overrides))


def _logging_for(cfg: Config) -> None:
    """Log lines (progress, evaluations, the end table) when the caller has set up no logging."""
    if not logging.getLogger().handlers:
        from zmqrl.run.record import setup_logging

        setup_logging(cfg.run.log_level)


def run_train(cfg: Config, run_dir: str | Path | None = None, resume: bool = False) -> dict[str, Any]:
    """Train in this process, as ``zmqrl train`` does; returns the summary (also in ``summary.json``).

    The run directory is ``run_dir``, else ``cfg.run.run_dir``, else ``runs/<name>-<time>``; it is
    stored in ``cfg.run.run_dir``. ``resume`` continues from its ``checkpoints/latest``.
    """
    from zmqrl.run.train import train as train_in_process

    _logging_for(cfg)
    return train_in_process(cfg, run_dir, resume=resume)


def run_local(cfg: Config, actors: int = 2, run_dir: str | Path | None = None,
              evaluator: bool = True) -> dict[str, Any]:
    """A distributed run on this machine, as ``zmqrl local`` does: a learner, a proxy, ``actors``
    actor processes and (unless ``evaluator`` is False) the evaluator; returns the learner's summary.

    The roles read ``cfg`` from a YAML copy made for them. A role that fails is a
    :class:`RuntimeError` naming the exit code and the directory of the roles' logs.
    """
    from zmqrl.roles.launch.local import run_local as launch

    if actors < 1:
        raise ConfigError(f"actors must be >= 1, got {actors}")
    _logging_for(cfg)
    path = Path(run_dir or cfg.run.run_dir or f"runs/{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    cfg.run.run_dir = str(path)
    cfg.actor.num_actors = actors
    with tempfile.TemporaryDirectory(prefix="zmqrl-local-") as tmp:
        config_path = Path(tmp) / "config.yaml"
        config_mod.dump(cfg, config_path)
        code = launch(cfg, str(config_path), [], actors, str(path), evaluator=evaluator)
    from zmqrl.run.rundir import read_summary

    summary = read_summary(path)
    if code != 0 or summary is None:
        raise RuntimeError(f"zmqrl local: the run ended with exit code {code}"
                           f"{' and no summary.json' if summary is None else ''}; role logs are in {path / 'logs'}")
    return summary
