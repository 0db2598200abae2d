"""Startup group: ``zmqrl local`` launch -> the first transition in the learner's replay."""

from __future__ import annotations

import time
from pathlib import Path

from zmqrl.bench.harness import Context, Procs, Row, make_row, median, zmqrl_argv

CONFIG = "cartpole_dqn.yaml"
GOAL_S = 3.0


def _once(c: Context, path: Path, k: int) -> float:
    """Seconds from launching ``zmqrl local`` to the first transition in the learner's replay.

    The learner writes ``RUN_DIR/first_batch.json`` (an atomic rename) right after it inserts its
    first batch, so that file's appearance, polled from here every 5 ms, marks the first
    transition in replay. The run uses the config as it is (no overrides but the seed).
    """
    from zmqrl.roles.learner import FIRST_BATCH_FILE

    run_dir = c.path(f"startup-{k}")
    marker = run_dir / FIRST_BATCH_FILE
    argv = zmqrl_argv("local", str(path), "--actors", "2", "--run-dir", str(run_dir), "--set", "run.seed=0")
    with Procs(c.logs) as procs:
        procs.sweep_args.append(str(run_dir))
        start = time.monotonic()
        proc = procs.start(f"startup-{k}", argv)
        while time.monotonic() - start < 120.0:
            if marker.exists():
                return time.monotonic() - start
            if not proc.alive():
                raise proc.failure("zmqrl local exited before the first transition")
            time.sleep(0.005)
        raise proc.failure("no transition reached replay within 120s")


def run(c: Context) -> list[Row]:
    path = c.configs(CONFIG)[0]
    times = [_once(c, path, k) for k in range(c.settings.startup_reps)]
    note = (f"launch of `zmqrl local {path.name} --actors 2` (learner, proxy, 2 actors, evaluator) -> first batch in "
            f"replay (the learner's first_batch.json appears); runs: {', '.join(f'{t:.2f}' for t in times)} s; "
            "baseline = the goal, ratio = goal/median")
    return [make_row("startup_s", median(times), GOAL_S, "s", note, (">=", 1.0), inverse=True)]
