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
ENV_ONLY = (4, 16)  # EnvPool envs per process
# (backend, envs, env.batch): batch 0 steps every env each time; 16 of 32 acts for half while the pool
# steps the other half (two cores' worth for one process: per CPU-second about the same, per second ~2x)
ACTING = (("gymnasium", 4, 0), ("envpool", 4, 0), ("envpool", 16, 0), ("envpool", 32, 0), ("envpool", 32, 16))


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


def _acting(path: Any, backend: str, envs: int, batch: int, seconds: float) -> tuple[float, float]:
    from zmqrl.run.acting import ActingLoop, make_task

    cfg = load_config(path, f"env.backend={backend}", f"env.num_envs={envs}", f"env.batch={batch}", "env.threads=1")
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
    chain, _ = _env_only(cfg, "gymnasium", 4, seconds)  # the atari chain: the baseline of the env rows
    for envs in ENV_ONLY:
        per_cpu, per_wall = _env_only(cfg, "envpool", envs, seconds)
        rows.append(make_row(f"env_pong_envpool_{envs}", per_cpu, chain, "env steps/CPU-s",
                             f"env alone, random actions, {envs} envs, 1 thread ({per_wall:,.0f}/s wall); "
                             f"baseline: the gymnasium chain, 4 envs"))
    for backend, envs, batch in ACTING:
        per_cpu, per_wall = _acting(path, backend, envs, batch, seconds)
        name, what = f"acting_pong_{backend}_{envs}", f"{envs} envs, one CPU forward for all"
        if batch:
            name, what = f"{name}_async{batch}", f"{envs} envs, a forward for the {batch} ready as the rest step"
        rows.append(make_row(name, per_cpu, ACTING_GOAL, "env steps/CPU-s",
                             f"acting loop: {what}, n-step, priorities; "
                             f"{per_wall:,.0f}/s wall; goal >= {ACTING_GOAL:,.0f} per actor core",
                             goal=(">=", 1.0)))
    return rows
