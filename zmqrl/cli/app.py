"""The ``zmqrl`` command's parser, built from each group's commands, and its error handling."""

from __future__ import annotations

import argparse
import logging
import sys

from zmqrl.cli import bench, cluster, config, keys, roles, signal_aware_process, tools
from zmqrl.cli.common import Handler, add_commands
from zmqrl.config import ConfigError
from zmqrl.roles.addresses import EXIT_ADDRESS_IN_USE
from zmqrl.run.checkpoint import CheckpointError
from zmqrl.run.lifecycle import catch_stop_signals_early, ignore_stop_signals
from zmqrl.wire import SocketSetupError

log = logging.getLogger("zmqrl")


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Handler]]:
    parser = argparse.ArgumentParser(prog="zmqrl", description="Distributed off-policy RL on ZeroMQ.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    handlers: dict[str, Handler] = {}
    for group in (roles, cluster, tools, config, keys, bench):
        add_commands(sub, handlers, group.COMMANDS)
    return parser, handlers


def main(argv: list[str] | None = None) -> int:
    """Run ``zmqrl ARGV`` (the process's own arguments when None); returns the exit code."""
    if signal_aware_process(argv):  # stop signals are remembered from its start and ignored once its work is done
        catch_stop_signals_early()
        try:
            return _main(argv)
        finally:
            ignore_stop_signals()
    return _main(argv)


def _main(argv: list[str] | None) -> int:
    parser, handlers = build_parser()
    args = parser.parse_args(argv)
    try:
        return handlers[args.command](args)
    except ConfigError as exc:
        print(f"zmqrl {args.command}: config error: {exc}", file=sys.stderr)
        return 2
    except SocketSetupError as exc:
        print(f"zmqrl {args.command}: {exc}", file=sys.stderr)
        return EXIT_ADDRESS_IN_USE if exc.address_in_use else 2
    except CheckpointError as exc:
        print(f"zmqrl {args.command}: checkpoint error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"zmqrl {args.command}: interrupted", file=sys.stderr)
        return 130
