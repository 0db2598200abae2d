"""The ``zmqrl`` command: one subcommand per role, plus train, local, the cluster launchers and tools.

This package's own module stays light: ``python -m zmqrl.cli ROLE`` (how launchers start roles)
catches stop signals before the rest is imported (:mod:`zmqrl.cli.__main__`); :mod:`zmqrl.cli.app`
builds the parser from each group's commands (:mod:`~zmqrl.cli.roles`, :mod:`~zmqrl.cli.cluster`,
:mod:`~zmqrl.cli.tools`, :mod:`~zmqrl.cli.config`, :mod:`~zmqrl.cli.keys`, :mod:`~zmqrl.cli.bench`).
"""

from __future__ import annotations

import sys

ROLE_COMMANDS = ("learner", "proxy", "actor", "evaluator")  # processes that launchers start and stop
LAUNCHER_COMMANDS = ("local", "head", "host")  # processes that start and stop roles
RUN_COMMANDS = ("train",)  # a whole run in one process, which saves its final checkpoint after its loop


def role_process(argv: list[str] | None) -> bool:
    """Whether this is a role's own process (``zmqrl ROLE ...`` from the command line)."""
    return argv is None and len(sys.argv) > 1 and sys.argv[1] in ROLE_COMMANDS


def signal_aware_process(argv: list[str] | None) -> bool:
    """Whether this process (a role, a launcher or ``zmqrl train``, from the command line) ends on a stop signal
    with its own code: the signal is remembered while it starts and after its loop, ignored once its work is done."""
    return role_process(argv) or (argv is None and len(sys.argv) > 1
                                  and sys.argv[1] in (*LAUNCHER_COMMANDS, *RUN_COMMANDS))


def main(argv: list[str] | None = None) -> int:
    """The ``zmqrl`` entry point (see :func:`zmqrl.cli.app.main`)."""
    from zmqrl.cli.app import main as run

    return run(argv)
