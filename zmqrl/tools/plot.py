"""``zmqrl plot RUN_DIR...``: learning curves from the runs' own records, as a PNG (no display needed).

Evaluation returns (``eval/return_mean``) and training returns (``train/episode_return``, the
mean of recent episodes) are read from each run's TensorBoard files in ``tb/`` and drawn
against env steps, wall-clock seconds or optimisation steps. The x of an evaluation comes from
``summary.json``'s ``evals`` where it lists that optimisation step, else from ``eval/env_steps``
and ``perf/wall_s`` of the records. Runs whose ``config.yaml`` differ only in ``run.seed``,
``run.name`` and ``run.run_dir`` (and ran the same way: ``zmqrl train`` or ``zmqrl local``) form
one group, drawn as its mean ± std over seeds (where all its runs have data) over faint lines of
each seed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zmqrl.run.rundir import RunDirError, raw_config, read_summary, require_run_dir

AXES = {"env_steps": "env steps", "wall_s": "wall-clock time (s)", "opt_steps": "optimisation steps"}
IGNORED_FOR_GROUPING = {("run", "seed"), ("run", "name"), ("run", "run_dir")}  # what tells seeds apart
TAGS = ("eval/return_mean", "eval/return_std", "eval/env_steps", "train/episode_return", "perf/env_steps",
        "perf/wall_s")


@dataclass
class Curve:
    """Points of one quantity against every axis (arrays of equal length, sorted by opt steps)."""

    x: dict[str, np.ndarray]
    y: np.ndarray

    def along(self, axis: str) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` sorted by ``x`` on ``axis``, points without an x dropped."""
        x = self.x[axis]
        keep = np.isfinite(x)
        order = np.argsort(x[keep], kind="stable")
        return x[keep][order], self.y[keep][order]


@dataclass
class Run:
    """What one run directory recorded."""

    path: Path
    config: dict[str, Any]
    evals: Curve
    train: Curve
    mode: str = "train"  # how it ran: train (one process) or local (a learner and actor processes)

    @property
    def name(self) -> str:
        return str(self.config.get("run", {}).get("name") or self.path.name)

    @property
    def seed(self) -> Any:
        return self.config.get("run", {}).get("seed")

    def group_key(self) -> str:
        """How it ran and its config without the keys that tell seeds of one experiment apart."""
        return json.dumps([self.mode, _flat(self.config)], sort_keys=True, default=str)


@dataclass
class Group:
    """Runs that differ only in seed, and the label the legend gives them."""

    runs: list[Run]
    label: str = ""
    stats: dict[str, Any] = field(default_factory=dict)


def read_scalars(tb_dir: Path, tags: Sequence[str] = TAGS) -> dict[str, dict[int, float]]:
    """``tag -> {step: value}`` for ``tags`` (by default those plotted) found in a run's ``tb/``; a step
    recorded twice (a resumed run) keeps the last."""
    if not tb_dir.is_dir():
        return {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0, "histograms": 1, "tensors": 1, "images": 1})
    acc.Reload()
    present = set(acc.Tags().get("scalars", []))
    out: dict[str, dict[int, float]] = {}
    for tag in tags:
        if tag in present:
            events = sorted(acc.Scalars(tag), key=lambda e: e.wall_time)
            out[tag] = {int(e.step): float(e.value) for e in events}
    return out


def _lookup(table: dict[int, float], steps: np.ndarray) -> np.ndarray:
    return np.array([table.get(int(s), np.nan) for s in steps], dtype=np.float64)


def _interp(table: dict[int, float], steps: np.ndarray) -> np.ndarray:
    """Values of a recorded counter at ``steps``, interpolated between the steps it was recorded at."""
    if not table:
        return np.full(len(steps), np.nan)
    known = np.array(sorted(table), dtype=np.float64)
    return np.interp(steps, known, [table[int(k)] for k in known], left=np.nan, right=np.nan)


def read_run(path: str | Path) -> Run:
    """The evaluation and training curves of one run directory (:class:`RunDirError` if it has none)."""
    path = require_run_dir(path)
    config = raw_config(path)
    summary = read_summary(path) or {}
    scalars = read_scalars(path / "tb")
    by_opt = {int(e["opt_steps"]): e for e in summary.get("evals", []) if "opt_steps" in e}
    eval_table = scalars.get("eval/return_mean") or {k: float(e["return_mean"]) for k, e in by_opt.items()}
    steps = np.array(sorted(eval_table), dtype=np.float64)
    env = _lookup({k: float(e["env_steps"]) for k, e in by_opt.items() if "env_steps" in e}, steps)
    env = np.where(np.isfinite(env), env, _lookup(scalars.get("eval/env_steps", {}), steps))
    wall = _lookup({k: float(e["wall_s"]) for k, e in by_opt.items() if "wall_s" in e}, steps)
    wall = np.where(np.isfinite(wall), wall, _interp(scalars.get("perf/wall_s", {}), steps))
    evals = Curve({"opt_steps": steps, "env_steps": env, "wall_s": wall},
                  np.array([eval_table[int(s)] for s in steps], dtype=np.float64))
    train_table = scalars.get("train/episode_return", {})
    tsteps = np.array(sorted(train_table), dtype=np.float64)
    train = Curve({"opt_steps": tsteps, "env_steps": _lookup(scalars.get("perf/env_steps", {}), tsteps),
                   "wall_s": _lookup(scalars.get("perf/wall_s", {}), tsteps)},
                  np.array([train_table[int(s)] for s in tsteps], dtype=np.float64))
    if not len(evals.y) and not len(train.y):
        raise RunDirError(f"{path}: nothing to plot yet (no eval/ or train/ returns in tb/, no evals in "
                          "summary.json)")
    distributed = summary.get("role") == "learner" or (path / "endpoints.json").is_file()
    return Run(path, config, evals, train, mode="local" if distributed else "train")


def group_runs(runs: list[Run]) -> list[Group]:
    """Runs grouped by config (seed, name and run dir ignored) and mode, in the order first seen.

    A group's label is the run name; where groups share one, it adds how they differ (``zmqrl
    local`` or ``train``, up to three config keys), then the seeds: ``cartpole_dqn (agent.lr=0.001,
    3 seeds, mean ± std)``.
    """
    groups: dict[str, Group] = {}
    for run in runs:
        groups.setdefault(run.group_key(), Group([])).runs.append(run)
    out = list(groups.values())
    names = {id(g): "/".join(sorted({r.name for r in g.runs})[:2]) for g in out}
    details: dict[int, list[str]] = {id(g): [] for g in out}
    for name in set(names.values()):
        same = [g for g in out if names[id(g)] == name]
        if len(same) < 2:
            continue
        diffs = _differing_keys([g.runs[0].config for g in same])  # same name, different configs: how
        modes = len({g.runs[0].mode for g in same}) > 1
        for g in same:
            flat = _flat(g.runs[0].config)
            details[id(g)] += ([f"zmqrl {g.runs[0].mode}"] if modes else []) + \
                [f"{k}={flat.get(k)}" for k in diffs[:3]] or [g.runs[0].path.name]
    for g in out:
        seeds = f"{len(g.runs)} seeds, mean ± std" if len(g.runs) > 1 else \
            f"seed {g.runs[0].seed}" if g.runs[0].seed is not None else ""
        parts = details[id(g)] + ([seeds] if seeds else [])
        g.label = f"{names[id(g)]} ({', '.join(parts)})" if parts else names[id(g)]
    return out


def _flat(config: dict[str, Any]) -> dict[str, Any]:
    return {f"{s}.{k}": v for s, sec in config.items() if isinstance(sec, dict) for k, v in sec.items()
            if (s, k) not in IGNORED_FOR_GROUPING}


def _differing_keys(configs: list[dict[str, Any]]) -> list[str]:
    flats = [_flat(c) for c in configs]
    keys = sorted(set().union(*flats))
    return [k for k in keys if len({json.dumps(f.get(k), sort_keys=True, default=str) for f in flats}) > 1]


def aggregate(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and std over curves on the x values of all of them, where every curve has data."""
    curves = [(x, y) for x, y in curves if len(x)]
    if not curves:
        return np.array([]), np.array([]), np.array([])
    lo, hi = max(x[0] for x, _ in curves), min(x[-1] for x, _ in curves)
    grid = np.unique(np.concatenate([x for x, _ in curves]))
    grid = grid[(grid >= lo) & (grid <= hi)]
    values = np.stack([np.interp(grid, x, y) for x, y in curves]) if len(grid) else np.zeros((len(curves), 0))
    return grid, values.mean(axis=0), values.std(axis=0)


def _final(curve: Curve) -> float | None:
    return float(curve.y[np.argmax(curve.x["opt_steps"])]) if len(curve.y) else None


def plot_runs(run_dirs: list[str | Path], out: str | Path, x: str = "env_steps", title: str | None = None,
              dpi: int = 120) -> list[Group]:
    """Draw the curves of ``run_dirs`` into the image ``out``; returns the groups drawn (with stats)."""
    if x not in AXES:
        raise RunDirError(f"--x: expected one of {', '.join(AXES)}, got {x!r}")
    if not run_dirs:
        raise RunDirError("no run directories given")
    runs = [read_run(p) for p in run_dirs]
    groups = group_runs(runs)
    import matplotlib
    from matplotlib.figure import Figure  # no pyplot: no display, and no change to a caller's backend

    with_train = any(len(r.train.y) for r in runs)
    fig = Figure(figsize=(9, 7.5 if with_train else 4.5))
    axes = fig.subplots(2 if with_train else 1, 1, sharex=True, squeeze=False)
    ax_eval = axes[0][0]
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, group in enumerate(groups):
        color = colors[i % len(colors)]
        for ax, which in ((ax_eval, "evals"), (axes[1][0] if with_train else None, "train")):
            if ax is None:
                continue
            curves = [getattr(r, which).along(x) for r in group.runs]
            label = group.label if which == "evals" else None
            if len(curves) == 1:
                cx, cy = curves[0]
                ax.plot(cx, cy, color=color, label=label, marker="o" if which == "evals" and len(cx) <= 40 else None,
                        markersize=3, linewidth=1.6)
                continue
            for cx, cy in curves:
                ax.plot(cx, cy, color=color, alpha=0.25, linewidth=0.8)
                if which == "evals" and len(cx):  # where each seed ended (e.g. at trainer.stop_return)
                    ax.plot(cx[-1:], cy[-1:], color=color, alpha=0.6, marker="o", markersize=4, linestyle="none")
            grid, mean, std = aggregate(curves)
            ax.plot(grid, mean, color=color, label=label, linewidth=1.8)
            ax.fill_between(grid, mean - std, mean + std, color=color, alpha=0.2, linewidth=0)
        finals = [f for f in (_final(r.evals) for r in group.runs) if f is not None]
        bests = [float(np.max(r.evals.y)) for r in group.runs if len(r.evals.y)]
        group.stats = {"runs": len(group.runs), "final_eval": finals, "best_eval": bests}
    ax_eval.set_ylabel("evaluation return\n(greedy, mean over episodes)")
    ax_eval.grid(True, alpha=0.3)
    ax_eval.legend(loc="best", fontsize="small")
    if with_train:
        axes[1][0].set_ylabel("training return\n(mean of recent episodes)")
        axes[1][0].grid(True, alpha=0.3)
    axes[-1][0].set_xlabel(AXES[x])
    envs = sorted({str(r.config.get("env", {}).get("id", "?")) for r in runs})
    fig.suptitle(title or ", ".join(envs))
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    return groups
