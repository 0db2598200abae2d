"""The launcher subcommands beyond ``zmqrl local``: ``head`` and ``host`` (one per machine of a cluster)
and ``status`` (a table of every role of a run); and the supervision flags they share with ``local``."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path

from zmqrl import config as config_mod
from zmqrl.config import Config
from zmqrl.run.record import setup_logging

Handlers = dict[str, Callable[[argparse.Namespace], int]]


def add_supervision_args(p: argparse.ArgumentParser) -> None:
    """``--max-restarts`` and ``--fail-fast``, as every launcher takes them."""
    from zmqrl.roles.supervise import MAX_RESTARTS

    p.add_argument("--max-restarts", type=_count, default=MAX_RESTARTS, metavar="N",
                   help=f"restarts allowed per role over the whole run before it stops (default {MAX_RESTARTS})")
    p.add_argument("--fail-fast", action="store_true",
                   help="stop the run when any role dies instead of restarting it")


def _count(text: str) -> int:
    """An argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def config_from_run_dir(args: argparse.Namespace) -> None:
    """``--resume`` without CONFIG: take the run directory's own ``config.yaml`` (what ran before)."""
    if args.config is None and getattr(args, "resume", False) and args.run_dir:
        saved = Path(args.run_dir) / "config.yaml"
        if saved.is_file():
            args.config = str(saved)


def load_config(args: argparse.Namespace, extra: list[str] | None = None) -> Config:
    cfg = config_mod.load(args.config, list(extra or []) + args.overrides)
    setup_logging(cfg.run.log_level, args.command)
    return cfg


def cmd_head(args: argparse.Namespace) -> int:
    from zmqrl.roles.cluster import run_head

    config_from_run_dir(args)
    cfg = load_config(args)
    return run_head(cfg, args.config, args.overrides, args.run_dir, bind=args.bind, evaluator=not args.no_evaluator,
                    resume=args.resume, auto_resume=args.auto_resume, max_restarts=args.max_restarts,
                    fail_fast=args.fail_fast)


def cmd_host(args: argparse.Namespace) -> int:
    from zmqrl.roles.cluster import run_host

    cfg = load_config(args)
    return run_host(cfg, args.config, args.overrides, args.learner, args.actors, args.first_id, args.run_dir,
                    name=args.name, max_restarts=args.max_restarts, fail_fast=args.fail_fast)


def cmd_status(args: argparse.Namespace) -> int:
    from zmqrl.tools.status import show

    logging.basicConfig(level=logging.WARNING)
    return show(args.run_dir, watch=args.watch, interval_s=args.interval)


def register(sub: argparse._SubParsersAction, handlers: Handlers) -> None:  # type: ignore[type-arg]
    """Add ``head``, ``host`` and ``status`` to ``sub`` and their handlers to ``handlers``."""
    from zmqrl.cli import _add_config_args

    p = sub.add_parser("head", help="a cluster's learner machine: the learner and the evaluator, supervised",
                       description="Run the learner and the evaluator on this machine, restarting them when they die "
                                   "(the learner with --resume from RUN_DIR/checkpoints/latest). The learner binds "
                                   "net.data_port, net.model_port and net.eval_port; hosts need the first two.")
    _add_config_args(p)
    p.add_argument("--run-dir", required=True, help="run directory (on a cluster: shared, or on a volume that "
                                                    "outlives the head)")
    p.add_argument("--bind", metavar="HOST", help="interface the learner binds (default net.bind_host; 0.0.0.0 for "
                                                  "every interface, so other machines reach it)")
    p.add_argument("--resume", action="store_true", help="continue the run in RUN_DIR from checkpoints/latest "
                                                         "(CONFIG defaults to RUN_DIR/config.yaml)")
    p.add_argument("--auto-resume", action="store_true", help="resume when RUN_DIR holds a checkpoint, start fresh "
                                                              "otherwise (for schedulers that restart or requeue)")
    p.add_argument("--no-evaluator", action="store_true", help="run without the evaluator")
    add_supervision_args(p)
    handlers["head"] = cmd_head

    p = sub.add_parser("host", help="a cluster's actor machine: one proxy and N actors, supervised",
                       description="Run one proxy (on loopback) and N actors on this machine, restarting them when "
                                   "they die. Actor ids are FIRST_ID..FIRST_ID+N-1 and must be below "
                                   "actor.num_actors, the number of actors over all hosts.")
    _add_config_args(p)
    p.add_argument("--learner", required=True, metavar="HOST",
                   help="the learner machine's name or address (ports: net.data_port and net.model_port)")
    p.add_argument("--actors", type=int, required=True, metavar="N", help="actor processes on this machine")
    p.add_argument("--first-id", type=int, default=0, metavar="K", help="id of this machine's first actor (default 0)")
    p.add_argument("--run-dir", help="where logs, role stats and the launcher's status go (default "
                                     "runs/<name>-host-<host name>)")
    p.add_argument("--name", help="this host's name in the run (default SHORT_HOSTNAME-FIRST_ID); its proxy is "
                                  "proxy-NAME")
    add_supervision_args(p)
    handlers["host"] = cmd_host

    p = sub.add_parser("status", help="a table of every role of a run: rates, batches, lag, restarts",
                       description="Show every role of the run in RUN_DIR (host, id, incarnation, env steps/s, "
                                   "batches, lost, policy lag, last seen, restarts) from the learner's summary.json "
                                   "and the launchers' supervisor/*.json.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory")
    p.add_argument("--watch", action="store_true", help="refresh until interrupted")
    p.add_argument("--interval", type=float, default=2.0, metavar="S", help="seconds between refreshes (default 2)")
    handlers["status"] = cmd_status
