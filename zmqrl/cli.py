"""The ``zmqrl`` command: one subcommand per role, plus train, local and tools."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from zmqrl import config as config_mod
from zmqrl.checkpoint import CheckpointError
from zmqrl.config import Config, ConfigError
from zmqrl.record import setup_logging

log = logging.getLogger("zmqrl")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="YAML config file (defaults when omitted)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set agent.lr=3e-4 (repeatable)")


def _load(args: argparse.Namespace, extra: list[str] | None = None) -> Config:
    cfg = config_mod.load(args.config, list(extra or []) + args.overrides)
    setup_logging(cfg.run.log_level, getattr(args, "role_label", args.command))
    return cfg


def cmd_train(args: argparse.Namespace) -> int:
    from zmqrl.train import train

    cfg = _load(args)
    summary = train(cfg, args.run_dir, resume=args.resume)
    return 0 if summary["stop_reason"] != "interrupted" else 130 if args.strict_exit else 0


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Callable[[argparse.Namespace], int]]]:
    parser = argparse.ArgumentParser(prog="zmqrl", description="Distributed off-policy RL on ZeroMQ.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {}

    p = sub.add_parser("train", help="train in one process (no sockets)")
    _add_config_args(p)
    p.add_argument("--run-dir", help="run directory (default runs/<name>-<time>)")
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR/checkpoints/latest")
    p.add_argument("--strict-exit", action="store_true", help="exit 130 when interrupted")
    handlers["train"] = cmd_train
    return parser, handlers


def main(argv: list[str] | None = None) -> int:
    parser, handlers = build_parser()
    args = parser.parse_args(argv)
    try:
        return handlers[args.command](args)
    except ConfigError as exc:
        print(f"zmqrl {args.command}: config error: {exc}", file=sys.stderr)
        return 2
    except CheckpointError as exc:
        print(f"zmqrl {args.command}: checkpoint error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"zmqrl {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
