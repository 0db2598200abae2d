"""``zmqrl plot``, ``enjoy`` and ``status``: tools that read a run directory."""

from __future__ import annotations

import argparse
import logging
import sys

import numpy as np

from zmqrl.cli.common import Command
from zmqrl.config import ConfigError
from zmqrl.run.checkpoint import CheckpointError
from zmqrl.run.rundir import RunDirError


def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{np.mean(values):.1f}" if len(values) == 1 else f"{np.mean(values):.1f} ± {np.std(values):.1f}"


def run_plot(args: argparse.Namespace) -> int:
    from zmqrl.tools.plot import plot_runs

    try:
        groups = plot_runs(args.run_dirs, args.out, x=args.x, title=args.title)
    except RunDirError as exc:
        print(f"zmqrl plot: {exc}", file=sys.stderr)
        return 2
    for g in groups:
        print(f"{g.label}: final eval {_mean_std(g.stats['final_eval'])}, best eval {_mean_std(g.stats['best_eval'])}"
              f"  [{', '.join(str(r.path) for r in g.runs)}]")
    print(f"wrote {args.out}")
    return 0


def run_enjoy(args: argparse.Namespace) -> int:
    from zmqrl.tools.enjoy import load_policy

    try:
        policy = load_policy(args.run_dir, args.checkpoint, backend=args.backend)
        print(policy.describe())

        def show(i: int, ret: float, length: int) -> None:
            print(f"episode {i + 1:>3}: return {ret:8.1f}  length {length}", flush=True)

        played = policy.play(args.episodes, args.seed, args.video, on_episode=show)
    except (ConfigError, CheckpointError) as exc:
        print(f"zmqrl enjoy: {exc}", file=sys.stderr)
        return 2
    print(played.describe() + f"; seeds {args.seed}..{args.seed + args.episodes - 1}")
    for video in played.videos:
        print(f"video: {video}")
    return 0


def run_status(args: argparse.Namespace) -> int:
    from zmqrl.tools.status import show

    logging.basicConfig(level=logging.WARNING)
    return show(args.run_dir, watch=args.watch, interval_s=args.interval)


def plot_args(p: argparse.ArgumentParser) -> None:
    from zmqrl.tools.plot import AXES

    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (zmqrl train / zmqrl local)")
    p.add_argument("--out", default="curves.png", metavar="FILE.png",
                   help="image to write (default curves.png; the suffix picks the format: .png, .svg, .pdf)")
    p.add_argument("--x", default="env_steps", choices=tuple(AXES), help="x axis (default env_steps)")
    p.add_argument("--title", help="figure title (default: the env ids)")


def enjoy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by zmqrl train or zmqrl local")
    p.add_argument("--checkpoint", default="best", metavar="best|latest|N",
                   help="which checkpoint: best (default), latest, or N optimisation steps")
    p.add_argument("--episodes", type=int, default=10, help="episodes to play (default 10)")
    p.add_argument("--seed", type=int, default=0, help="episode i resets with seed S+i (default 0)")
    p.add_argument("--video", metavar="DIR", help="write one MP4 per episode into DIR (needs moviepy)")
    p.add_argument("--backend", default="auto", choices=("auto", "numpy", "torch"),
                   help="policy forward: auto (numpy for MLPs), numpy or torch")


def status_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory")
    p.add_argument("--watch", action="store_true", help="refresh until interrupted")
    p.add_argument("--interval", type=float, default=2.0, metavar="S", help="seconds between refreshes (default 2)")


COMMANDS = [
    Command("plot", "learning curves of one or more runs as a PNG", plot_args, run_plot,
            "Draw evaluation and training returns of run directories into an image. Runs whose config.yaml "
            "differ only in run.seed/run.name/run.run_dir are one group, drawn as mean ± std over seeds."),
    Command("enjoy", "watch or re-evaluate a trained agent: greedy episodes from a checkpoint", enjoy_args, run_enjoy,
            "Play greedy episodes with the policy of one checkpoint of a run directory (any algorithm), print each "
            "return and the mean ± std; --video records MP4s."),
    Command("status", "a table of every role of a run: rates, batches, lag, restarts", status_args, run_status,
            "Show every role of the run in RUN_DIR (host, id, incarnation, env steps/s, batches, lost, policy lag, "
            "last seen, restarts) from the learner's summary.json and the launchers' supervisor/*.json."),
]
