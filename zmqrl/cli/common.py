"""What every ``zmqrl`` subcommand shares: how a command is declared, the config flags, loading the
config, the launchers' supervision flags, and the address help."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from zmqrl import config as config_mod
from zmqrl.config import Config
from zmqrl.run.record import setup_logging

Handler = Callable[[argparse.Namespace], int]
ADDR_HELP = ("tcp://HOST:PORT, HOST:PORT or HOST (the port then comes from the config's net section); HOST "
             "a host name, an IPv4 address or a bracketed IPv6 one, PORT 1..65535")
BIND_HELP = f"{ADDR_HELP}; binding, HOST may also be * or 0.0.0.0 (every interface) and PORT 0 (a free one)"


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, one-line help, its flags and what it runs (returning the exit code)."""

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Handler
    description: str | None = None


def add_commands(sub: argparse._SubParsersAction, handlers: dict[str, Handler],  # type: ignore[type-arg]
                 commands: Iterable[Command]) -> None:
    """Add each command's parser to ``sub`` and its handler to ``handlers``."""
    for command in commands:
        parser = sub.add_parser(command.name, help=command.help, description=command.description or command.help)
        command.arguments(parser)
        handlers[command.name] = command.run


def add_config_args(p: argparse.ArgumentParser) -> None:
    """CONFIG and ``--set KEY=VALUE``, as every command that runs something takes them."""
    p.add_argument("config", nargs="?", help="YAML config file (defaults when omitted)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set agent.lr=3e-4 (repeatable)")


def load_config(args: argparse.Namespace, extra: list[str] | None = None) -> Config:
    """The config CONFIG and ``--set`` say (``extra`` overrides first), with logging set up from it."""
    cfg = config_mod.load(args.config, list(extra or []) + args.overrides)
    setup_logging(cfg.run.log_level, getattr(args, "role_label", args.command))
    return cfg


def config_from_run_dir(args: argparse.Namespace) -> None:
    """``--resume`` without CONFIG: take the run directory's own ``config.yaml`` (what ran before)."""
    from zmqrl.run.rundir import CONFIG_FILE

    if args.config is None and getattr(args, "resume", False) and args.run_dir:
        saved = Path(args.run_dir) / CONFIG_FILE
        if saved.is_file():
            args.config = str(saved)


def add_supervision_args(p: argparse.ArgumentParser) -> None:
    """``--max-restarts`` and ``--fail-fast``, as every launcher takes them."""
    from zmqrl.roles.launch.supervisor import MAX_RESTARTS

    p.add_argument("--max-restarts", type=count, default=MAX_RESTARTS, metavar="N",
                   help=f"restarts allowed per role over the whole run before it stops (default {MAX_RESTARTS})")
    p.add_argument("--fail-fast", action="store_true",
                   help="stop the run when any role dies instead of restarting it")


def count(text: str) -> int:
    """An argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value
