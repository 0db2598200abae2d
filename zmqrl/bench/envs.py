"""Envs group: Atari env steps per CPU-second (one core's worth), EnvPool against the gymnasium chain,
env alone (the ceiling) and with the acting loop around it (the policy's batched CPU forward and
the n-step builder: an actor less its sending, which the actor group measures).

CPU-seconds are the process's own (every thread's), so a pool's worker thread counts as it should:
a figure is what one actor core makes when every core is busy.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from zmqrl.bench.harness import Context, Row, load_config, make_row

CONFIG = "pong_dqn.yaml"
ACTING_GOAL = 1500.0  # env steps per actor core, end to end (the issue "Atari at full speed"; ~800 before EnvPool)
ENV_ONLY = (("gymnasium", 4), ("envpool", 4), ("envpool", 16))  # (backend, envs)
ACTING = (("gymnasium", 4), ("envpool", 4), ("envpool", 16), ("envpool", 32))


def _per_cpu_second(step: Any, envs_per_step: Any, seconds: float) -> tuple[float, float]:
    """(env steps per CPU-second, per wall second) of calling ``step`` for about ``seconds``."""
    step()  # warm: first forward, first pool batch
    steps, cpu0, wall0 = 0, time.process_time(), time.perf_counter()
    deadline = wall0 + seconds
    while time.perf_counter() < deadline:
        steps += envs_per_step(step())
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return steps / max(cpu, 1e-9), steps / max(wall, 1e-9)


def _env_only(cfg: Any, backend: str, envs: int, seconds: float) -> tuple[float, float]:
    from dataclasses import replace

    from zmqrl.envs.factory import make_stepper

    stepper = make_stepper(replace(cfg.env, backend=backend, threads=1), envs, seed=0)
    rng = np.random.default_rng(0)
    try:
        return _per_cpu_second(lambda: stepper.step(rng.integers(0, 6, envs)),
                               lambda s: envs if s.valid is None else int(s.valid.sum()), seconds)
    finally:
        stepper.close()


def _acting(path: Any, backend: str, envs: int, seconds: float) -> tuple[float, float]:
    from zmqrl.run.acting import ActingLoop, make_task

    cfg = load_config(path, f"env.backend={backend}", f"env.num_envs={envs}", "env.threads=1")
    task = make_task(cfg)
    loop = ActingLoop(cfg, task.policy(0, backend=cfg.actor.backend), task.exploration(0), seed=0,
                      priorities=cfg.actor.compute_priorities and cfg.replay.prioritized)
    try:
        return _per_cpu_second(loop.step, lambda acted: acted.env_steps, seconds)
    finally:
        loop.close()


def run(c: Context) -> list[Row]:
    """Env-only and acting-loop rows for the Atari config, per backend and envs per process."""
    import torch

    from zmqrl.envs import pool

    torch.set_num_threads(1)  # one actor core
    seconds = c.settings.actor_s * c.settings.actor_reps
    path = c.configs(CONFIG)[0]
    cfg = load_config(path)
    if not pool.installed():
        return [make_row("env_pong_envpool", None, None, "env steps/CPU-s", "EnvPool is not installed here")]
    rows = []
    chain = None
    for backend, envs in ENV_ONLY:
        per_cpu, per_wall = _env_only(cfg, backend, envs, seconds)
        chain = per_cpu if backend == "gymnasium" else chain
        rows.append(make_row(f"env_pong_{backend}_{envs}", per_cpu, chain if backend != "gymnasium" else None,
                             "env steps/CPU-s", f"env alone, random actions, {envs} envs, 1 thread; "
                             f"{per_wall:,.0f}/s wall; ratio: over the gymnasium chain"))
    for backend, envs in ACTING:
        per_cpu, per_wall = _acting(path, backend, envs, seconds)
        rows.append(make_row(f"acting_pong_{backend}_{envs}", per_cpu, ACTING_GOAL, "env steps/CPU-s",
                             f"acting loop: {envs} envs, one CPU forward for all, n-step, priorities; "
                             f"{per_wall:,.0f}/s wall; goal >= {ACTING_GOAL:,.0f} per actor core",
                             goal=(">=", 1.0)))
    return rows
