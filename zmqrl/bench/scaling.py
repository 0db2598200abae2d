"""Scaling group: env steps/s of ``zmqrl local`` (rate limiter off) with N actors vs 1 actor, and on
MuJoCo vs a bare acting loop of the same envs."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from zmqrl.bench.harness import Context, Procs, Row, load_config, make_row, zmqrl_argv
from zmqrl.run.rundir import read_json

CONFIG = "cartpole_dqn.yaml"  # the N-actor rows
BARE_CONFIGS = ("halfcheetah_sac.yaml",)  # the local-vs-bare rows
BARE_ACTORS = 2  # `zmqrl local`'s default
LIMITER_OFF = "trainer.min_samples_per_insert=0"  # actors step as fast as they can: what the row measures


def local_env_rate(c: Context, path: Path, actors: int, tag: str) -> tuple[float, str]:
    """Total env steps/s of ``zmqrl local --actors N --no-evaluator`` (rate limiter off) between two
    learner summaries ``scaling_window_s`` apart, once training is under way."""
    s = c.settings
    run_dir = c.path(f"scaling-{tag}-{actors}")
    summary_path = run_dir / "summary.json"
    argv = zmqrl_argv("local", str(path), "--actors", str(actors), "--no-evaluator", "--run-dir", str(run_dir),
                      "--set", "run.seed=0", "--set", "trainer.stop_return=null", "--set", LIMITER_OFF,
                      "--set", f"trainer.max_seconds={60 + 2 * s.scaling_window_s:g}")
    first: dict[str, Any] | None = None
    with Procs(c.logs) as procs:
        procs.sweep_args.append(str(run_dir))
        proc = procs.start(f"scaling-{tag}-{actors}", argv)
        deadline = time.monotonic() + 60.0 + s.scaling_window_s
        while time.monotonic() < deadline:
            summary = read_json(summary_path)
            if summary and summary.get("opt_steps", 0) > 0:
                if first is None:
                    first = summary
                elif summary["wall_s"] > first["wall_s"] and summary["wall_s"] >= first["wall_s"] + s.scaling_window_s:
                    proc.stop(15.0)
                    rate = (summary["env_steps"] - first["env_steps"]) / (summary["wall_s"] - first["wall_s"])
                    return rate, _window_detail(first, summary)
            if not proc.alive():
                raise proc.failure("zmqrl local exited early")
            time.sleep(0.2)
        raise proc.failure("no two learner summaries with training under way before the deadline")


def _window_detail(first: dict[str, Any], last: dict[str, Any]) -> str:
    """The window's length and each actor's env steps/s in it (from the learner's per-actor counters)."""
    span = last["wall_s"] - first["wall_s"]
    before = first.get("actors", {})
    per = {name: round((a.get("env_steps", 0) - before.get(name, {}).get("env_steps", 0)) / span)
           for name, a in sorted(last.get("actors", {}).items())}
    return f"{span:.1f}s window of learner summaries; per actor {per}"


def bare_rate(path: Path, seconds: float) -> float:
    """Env steps/s of actor 0's acting loop of config ``path`` (envs, policy, n-step builder) in this process."""
    import torch

    from zmqrl.run.acting import ActingLoop, make_task

    torch.set_num_threads(1)
    cfg = load_config(path)
    task = make_task(cfg)
    seed = cfg.run.seed + 1000
    loop = ActingLoop(cfg, task.policy(seed, backend=cfg.actor.backend), task.exploration(0), seed)
    try:
        n, start = 0, time.perf_counter()
        while n < 256 or time.perf_counter() - start < seconds:
            loop.step()
            n += loop.num_envs
        return n / (time.perf_counter() - start)
    finally:
        loop.close()


def local_vs_bare(c: Context, path: Path) -> Row:
    """Total env steps/s of ``zmqrl local --actors 2`` vs one bare acting loop of the same envs and policy."""
    cfg = load_config(path)
    rate, detail = local_env_rate(c, path, BARE_ACTORS, cfg.run.name)
    seconds = 2 * c.settings.actor_s
    bare = bare_rate(path, seconds)
    return make_row(f"scaling_{cfg.run.name}_local_vs_bare", rate, bare, "env steps/s",
                    f"`zmqrl local {path.name} --actors {BARE_ACTORS} --no-evaluator`, rate limiter off "
                    f"({LIMITER_OFF}), learner training ({cfg.agent.algo}, device {cfg.run.device}) on the same "
                    f"{os.cpu_count()} CPUs; {detail}; baseline: one ActingLoop of the same {cfg.env.num_envs} "
                    f"{cfg.env.id} env(s) and policy in the bench process, {seconds:g} s, nothing else running")


def run(c: Context) -> list[Row]:
    s = c.settings
    path = c.configs(CONFIG)[0]
    results = {n: local_env_rate(c, path, n, "n") for n in s.scaling}
    base_n = s.scaling[0]
    base = results[base_n][0]
    rows = []
    for n, (rate, detail) in results.items():
        rows.append(make_row(f"scaling_{n}_actors", rate, base, "env steps/s",
                             f"`zmqrl local {path.name} --actors {n} --no-evaluator`, rate limiter off "
                             f"({LIMITER_OFF}), learner training on the same {os.cpu_count()} CPUs; vs {base_n} "
                             f"actor; {detail}"))
    rows.extend(local_vs_bare(c, bare) for bare in c.configs(*BARE_CONFIGS))
    return rows
