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
    """The config CONFIG and ``--set`` say (``extra`` overrides first), with logging set up from it; its
    callables files (``env.fn`` and the like) resolved against ``--run-dir``."""
    from zmqrl.run import user_callables

    cfg = config_mod.load(args.config, list(extra or []) + args.overrides)
    setup_logging(cfg.run.log_level, getattr(args, "role_label", args.command))
    return user_callables.resolve(cfg, getattr(args, "run_dir", None))


def add_callable_args(p: argparse.ArgumentParser, where: str = "copied into RUN_DIR/callables/") -> None:
    """``--env-fn``, ``--wrappers-fn`` and ``--network-fn``: callables files from Python
    (``zmqrl.save_callable``), as the launchers and ``zmqrl train`` take them."""
    p.add_argument("--env-fn", metavar="FILE", help=f"an env factory's callables file (sets env.fn; {where})")
    p.add_argument("--wrappers-fn", metavar="FILE", help=f"a callables file of env wrappers (sets env.wrappers_fn; "
                                                          f"{where})")
    p.add_argument("--network-fn", metavar="FILE", help=f"a torch torso's callables file (sets agent.network_fn; "
                                                         f"{where})")


def take_callables(args: argparse.Namespace, cfg: Config, copy_in: bool = True) -> list[str]:
    """The ``--env-fn``-style files into ``cfg`` (copied into the run directory with ``copy_in``; a default run
    directory is picked when none is given); returns the ``--set`` overrides that tell the roles."""
    import time

    from zmqrl.run import user_callables

    files = {kind: getattr(args, flag[2:].replace("-", "_"), None) for kind, flag in user_callables.FLAGS.items()}
    if not any(files.values()):
        return []
    if copy_in and not args.run_dir:
        args.run_dir = cfg.run.run_dir or f"runs/{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return user_callables.adopt(cfg, args.run_dir, files, copy_in=copy_in)


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
