"""Startup group: ``zmqrl local`` launch -> the learner's first optimisation step."""

from __future__ import annotations

import time
from pathlib import Path

from zmqrl.bench.harness import Context, Procs, Row, make_row, median, zmqrl_argv
from zmqrl.run.rundir import FIRST_BATCH_FILE, FIRST_UPDATE_FILE, read_json

CONFIG = "cartpole_dqn.yaml"
GOAL_S = 3.0


def _once(c: Context, path: Path, k: int) -> tuple[float, float | None]:
    """Seconds from launching ``zmqrl local`` to the learner's first optimisation step, and to the
    first transition in its replay.

    The learner writes ``RUN_DIR/first_update.json`` (an atomic rename) right after its first
    optimisation step, so that file's appearance, polled from here every 5 ms, marks it; the first
    batch's time comes from ``first_batch.json`` (its Unix time against the launch's). The run uses
    the config as it is (no overrides but the seed).
    """
    run_dir = c.path(f"startup-{k}")
    marker = run_dir / FIRST_UPDATE_FILE
    argv = zmqrl_argv("local", str(path), "--actors", "2", "--run-dir", str(run_dir), "--set", "run.seed=0")
    with Procs(c.logs) as procs:
        procs.sweep_args.append(str(run_dir))
        start, start_wall = time.monotonic(), time.time()
        proc = procs.start(f"startup-{k}", argv)
        while time.monotonic() - start < 120.0:
            if marker.exists():
                first_update = time.monotonic() - start
                batch = read_json(run_dir / FIRST_BATCH_FILE) or {}
                first_batch = batch["time"] - start_wall if "time" in batch else None
                return first_update, first_batch
            if not proc.alive():
                raise proc.failure("zmqrl local exited before the learner's first optimisation step")
            time.sleep(0.005)
        raise proc.failure("no optimisation step within 120s")


def run(c: Context) -> list[Row]:
    path = c.configs(CONFIG)[0]
    runs = [_once(c, path, k) for k in range(c.settings.startup_reps)]
    times = [t for t, _ in runs]
    batches = ", ".join("-" if b is None else f"{b:.2f}" for _, b in runs)
    note = (f"launch of `zmqrl local {path.name} --actors 2` (learner, proxy, 2 actors; the evaluator starts after "
            f"the first update) -> the learner's first optimisation step (its first_update.json appears); runs: "
            f"{', '.join(f'{t:.2f}' for t in times)} s; first batch in replay at {batches} s; "
            "baseline = the goal, ratio = goal/median")
    return [make_row("startup_s", median(times), GOAL_S, "s", note, (">=", 1.0), inverse=True)]
