"""``zmqrl bench`` (the performance goals), ``zmqrl soak`` (a job run for a while) and ``zmqrl sprint`` (a GPU
host measured in one prepared command)."""

from __future__ import annotations

import argparse

from zmqrl.bench.registry import GROUPS
from zmqrl.cli.common import Command


def bench_args(p: argparse.ArgumentParser) -> None:
    from zmqrl.bench.suite import add_arguments

    add_arguments(p)


def run_bench(args: argparse.Namespace) -> int:
    from zmqrl.bench.suite import cmd_bench

    return cmd_bench(args)


def soak_args(p: argparse.ArgumentParser) -> None:
    from zmqrl.bench.soak import add_arguments

    add_arguments(p)


def run_soak(args: argparse.Namespace) -> int:
    from zmqrl.bench.soak import cmd_soak

    return cmd_soak(args)


def sprint_args(p: argparse.ArgumentParser) -> None:
    from zmqrl.bench.sprint import add_arguments

    add_arguments(p)


def run_sprint(args: argparse.Namespace) -> int:
    from zmqrl.bench.sprint import cmd_sprint

    return cmd_sprint(args)


COMMANDS = [
    Command("bench", "measure the performance goals side by side with their baselines", bench_args, run_bench,
            "Measure each performance goal next to its baseline in one run and print a table (name, measured, "
            f"baseline, ratio, goal, met). Names: {', '.join(GROUPS)}."),
    Command("soak", "run a distributed job for a while and report every role's memory growth", soak_args, run_soak,
            "Run a distributed job for a while and report every role's memory growth."),
    Command("sprint", "measure a host with a GPU in one prepared command (bench rows, then Pong on the GPU)",
            sprint_args, run_sprint,
            "On a host with a GPU, inside a fixed budget (default 540 s): the cnn bench rows on CUDA, then zmqrl local "
            "on Pong with the learner on the GPU and cores - 2 actors; writes summary.json, config.yaml, curve.png, "
            "bench_cnn.json, sprint.json and report.txt into OUTDIR and prints the report."),
]
