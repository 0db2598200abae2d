"""The ``zmqrl bench`` command: run the chosen groups, print the table, write the JSON rows."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from zmqrl.bench.harness import Context, Row, Settings, error_row
from zmqrl.bench.registry import GROUPS, group
from zmqrl.run.rundir import write_json_atomic

log = logging.getLogger("zmqrl")


def run_suite(settings: Settings, only: Sequence[str] | None = None,
              progress: Callable[[str], None] | None = None) -> list[Row]:
    """Run the chosen groups (all by default) in a fresh work directory; returns their rows.

    A group that fails yields one row with ``met`` False and the error in its note, and the suite
    goes on; the work directory (logs of every process) is then kept and named in that note.
    """
    import torch

    torch.set_num_threads(1)
    chosen = list(only) if only else list(GROUPS)
    unknown = sorted(set(chosen) - set(GROUPS))
    if unknown:
        raise ValueError(f"unknown bench name(s) {', '.join(unknown)}; choose from {', '.join(GROUPS)}")
    if settings.keep is not None:
        settings.keep.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="bench-", dir=settings.keep))
    else:
        work = Path(tempfile.mkdtemp(prefix="zmqrl-bench-"))
    ctx = Context(settings, work)
    rows: list[Row] = []
    failed = False
    try:
        for name in GROUPS:
            if name not in chosen:
                continue
            if progress:
                progress(f"bench: {name} ...")
            started = time.monotonic()
            try:
                new = group(name)(ctx)
            except Exception as exc:  # one broken measurement must not hide the others
                failed = True
                new = [error_row(name, exc, work)]
                log.warning("bench %s failed", name, exc_info=True)
            rows.extend(new)
            if progress:
                progress(f"bench: {name} done in {time.monotonic() - started:.1f}s")
    finally:
        if not failed and settings.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return rows


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1e4:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def format_table(rows: Sequence[Row]) -> str:
    """The rows as a fixed-width table, notes last."""
    header = f"{'name':<38}{'measured':>12}{'baseline':>12}{'ratio':>8}  {'goal':<8}{'met':<6}{'unit':<18}note"
    lines = [header, "-" * len(header)]
    for r in rows:
        met = "-" if r.met is None else "yes" if r.met else "NO"
        lines.append(f"{r.name:<38}{_fmt(r.measured):>12}{_fmt(r.baseline):>12}{_fmt(r.ratio):>8}  "
                     f"{r.goal or '-':<8}{met:<6}{r.unit:<18}{r.note}")
    return "\n".join(lines)


def cmd_bench(args: argparse.Namespace) -> int:
    """The ``zmqrl bench`` entry point: run, print the table, write ``--json``; 1 if a measurement failed."""
    from zmqrl.run.record import setup_logging

    setup_logging("warning", "bench")
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    only = [name.strip() for item in args.only for name in item.split(",") if name.strip()] if args.only else None
    if only:
        unknown = sorted(set(only) - set(GROUPS))
        if unknown:
            print(f"zmqrl bench: unknown name(s) {', '.join(unknown)}; choose from {', '.join(GROUPS)}",
                  file=sys.stderr)
            return 2
    config = Path(args.config).resolve() if args.config else None
    if config is not None and not config.is_file():
        print(f"zmqrl bench: --config: no config file {args.config}", file=sys.stderr)
        return 2
    settings = Settings.preset(mode, seeds=args.seeds, sb3=args.sb3 or None, sb3_python=args.sb3_python,
                               solve_budget_s=args.solve_budget, actor_rate=args.actor_rate, config=config,
                               keep=Path(args.keep) if args.keep else None)
    started = time.monotonic()
    rows = run_suite(settings, only, progress=lambda text: print(text, file=sys.stderr, flush=True))
    print(format_table(rows))
    print(f"({mode} run, {time.monotonic() - started:.0f}s, {os.cpu_count()} CPUs)")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, [r.as_dict() for r in rows])
    return 1 if any(r.note.startswith("error:") for r in rows) else 0


HELP = "measure the performance goals side by side with their baselines"
DESCRIPTION = ("Measure each performance goal next to its baseline in one run and print a table (name, measured, "
               f"baseline, ratio, goal, met). Names: {', '.join(GROUPS)}.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``zmqrl bench``'s flags."""
    p.add_argument("--only", action="append", metavar="NAME[,NAME...]", help="run only these groups (repeatable)")
    p.add_argument("--json", metavar="FILE", help="also write the rows as a JSON list to FILE")
    p.add_argument("--quick", action="store_true", help="shorter measurements, one seed")
    p.add_argument("--smoke", action="store_true", help="a plumbing check; figures not meaningful")
    p.add_argument("--seeds", type=int, metavar="N", help="seeds for the solve rows (default 5; --quick 1)")
    p.add_argument("--solve-budget", type=float, metavar="S",
                   help="seconds shared by the capped zmqrl solve runs of each config (default 600; --quick 60)")
    p.add_argument("--actor-rate", type=float, metavar="T",
                   help="learner row: transitions/s each simulated actor offers while not paused (default 5000)")
    p.add_argument("--sb3", action="store_true",
                   help="solve group: also time Stable-Baselines3's peer of each config that has one")
    p.add_argument("--sb3-python", metavar="PATH", default="",
                   help="interpreter with stable-baselines3 installed (default: this one)")
    p.add_argument("--config", metavar="FILE",
                   help="measure with this config instead of each group's own (see the groups' notes)")
    p.add_argument("--keep", metavar="DIR", help="keep every run directory and process log under DIR")


def main(argv: list[str] | None = None) -> int:
    """``python -m zmqrl.bench [options]``: the same as ``zmqrl bench``."""
    parser = argparse.ArgumentParser(prog="zmqrl bench", description=DESCRIPTION)
    add_arguments(parser)
    return cmd_bench(parser.parse_args(sys.argv[1:] if argv is None else argv))
