"""Rewards group: a shipped config solves its task as fast with the rewards paid ×0.01 or ×100.

For each config, ``zmqrl local --actors 2`` runs to the config's ``trainer.stop_return`` (scaled with
the rewards: evaluations see the scaled game) on the task as shipped and with an env wrapper that
multiplies every reward (:mod:`zmqrl.bench.reward_wrappers`), seeds 0..seeds-1, the three scales of a
seed back to back so the machine's load falls on each alike. A row per config and scale: the median
wall time from launch to exit at that scale against the unscaled median (goal <= 1.5). A run that
hits its cap counts at its wall time and the row is not met.

``--config FILE`` measures that config alone (``--seeds`` how many seeds).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from zmqrl.bench.harness import (
    BenchError,
    Context,
    Row,
    load_config,
    make_row,
    median,
    timed_launcher,
    zmqrl_argv,
)
from zmqrl.bench.reward_wrappers import SCALES

CONFIGS = ("cartpole_dqn.yaml", "cartpole_pomdp_r2d2.yaml", "pendulum_sac.yaml", "cartpole_iqn.yaml",
           "cartpole_appo.yaml")
GOAL = 1.5  # time to solve at another reward scale, at most this many times the unscaled time
CAP_S = {"full": 400.0, "quick": 120.0, "smoke": 20.0}  # a run stops here if it has not solved


@dataclass
class ScaledRun:
    scale: float
    seed: int
    wall_s: float
    solved: bool
    factor: float | None  # the learner's reward factor (env.reward_scale: auto measures it)


def _run(c: Context, path: Path, tag: str, target: float, wrappers: list[str], scale: float, seed: int,
         cap_s: float) -> ScaledRun:
    """One ``zmqrl local --actors 2`` run to the scaled stop return, timed launch -> exit."""
    run_dir = c.path(f"rewards-{tag}-x{scale:g}-{seed}")
    names = [*wrappers, SCALES[scale]] if scale != 1.0 else wrappers
    sets = [f"run.seed={seed}", f"trainer.stop_return={target * scale!r}", f"trainer.max_seconds={cap_s:.0f}",
            f"env.wrappers=[{', '.join(names)}]"]
    argv = zmqrl_argv("local", str(path), "--run-dir", str(run_dir), "--actors", "2",
                      *(a for s in sets for a in ("--set", s)))
    wall, summary = timed_launcher(c, f"rewards-{tag}-x{scale:g}-{seed}", argv, run_dir, cap_s + 60.0)
    factor = summary.get("reward_scale")
    return ScaledRun(scale, seed, wall, bool(summary.get("solved")), None if factor is None else float(factor))


def measure(c: Context, path: Path) -> list[Row]:
    cfg = load_config(path)
    tag, target = cfg.run.name, cfg.trainer.stop_return
    if target is None:
        raise BenchError(f"{path.name}: trainer.stop_return is not set; the rewards rows time runs to it")
    cap = CAP_S.get(c.settings.mode, CAP_S["full"])
    runs: dict[float, list[ScaledRun]] = {1.0: [], **{scale: [] for scale in SCALES}}
    for seed in range(c.settings.seeds):
        for scale in runs:
            runs[scale].append(_run(c, path, tag, target, list(cfg.env.wrappers), scale, seed, cap))
    base = runs[1.0]
    base_s = median([r.wall_s for r in base])
    rows = []
    for scale in SCALES:
        scaled = runs[scale]
        note = (f"{path.name} ({cfg.env.id}, env.reward_scale {cfg.env.reward_scale}) with every reward x{scale:g} "
                f"(stop return {target * scale:g}) vs as shipped ({target:g}), `zmqrl local --actors 2`, launch -> "
                f"exit, seeds 0..{c.settings.seeds - 1}, capped at {cap:.0f} s; x{scale:g}: {_describe(scaled)}; "
                f"x1: {_describe(base)}")
        rows.append(make_row(f"rewards_{tag}_x{scale:g}_vs_x1", median([r.wall_s for r in scaled]), base_s, "s",
                             note, ("<=", GOAL), complete=all(r.solved for r in scaled + base)))
    return rows


def _describe(runs: list[ScaledRun]) -> str:
    solved = sum(r.solved for r in runs)
    per = ", ".join(f"{r.seed}: {r.wall_s:.1f} s{'' if r.solved else ' unsolved'}"
                    + (f" (factor {r.factor:.4g})" if r.factor is not None else "") for r in runs)
    return f"solved {solved}/{len(runs)}, median {median([r.wall_s for r in runs]):.1f} s; per seed {per}"


def run(c: Context) -> list[Row]:
    return [row for path in c.configs(*CONFIGS) for row in measure(c, path)]
