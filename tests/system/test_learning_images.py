"""The CNN agents (DQN and IQN) learn from pixels: zmqrl/Catch-v0 (84x84 uint8 frames, the Atari image path from
the env through the wire and replay into the Nature CNN) in ``zmqrl local`` and ``zmqrl train``.

A random policy scores about -0.7; the configs stop at a greedy mean of 0.8 over 10 episodes
(at least 9 balls of 10 caught). On this machine each run takes one to three minutes; the whole
suite runs the two with DQN (see ``LOCAL_CONFIGS``), ``--all-seeds`` all four.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from procs import REPO, Procs, log_tail, zmqrl_argv
from tiers import nightly
from zmqrl.run.rundir import read_json

CATCH_DQN, CATCH_IQN = (str(REPO / "configs" / f"catch_{algo}.yaml") for algo in ("dqn", "iqn"))
# The whole suite runs each mode from pixels once, with DQN (the other two runs are nightly): the pixel path
# differs by mode (the learner takes frames as they came off the wire; `zmqrl train` hands its own replay
# whole stacks), not by algorithm.
LOCAL_CONFIGS = [CATCH_DQN, pytest.param(CATCH_IQN, marks=nightly(
    "pixels through `zmqrl local`: [catch_dqn] here; IQN distributed: "
    "tests/agents/test_iqn.py::test_local_solves_cartpole"))]
TRAIN_CONFIGS = [CATCH_DQN, pytest.param(CATCH_IQN, marks=nightly(
    "pixels in `zmqrl train`: [catch_dqn] here; IQN learning: tests/agents/test_iqn.py::test_local_solves_cartpole; "
    "IQN's update: tests/agents/test_iqn.py (the quantile loss learns a known return distribution)"))]


def _run(tmp_path: Path, procs: Procs, config: str, role_args: list[str], seed: int) -> dict:
    run_dir = tmp_path / "run"
    procs.sweep_args.append(str(run_dir))
    argv = zmqrl_argv(*role_args, "--run-dir", str(run_dir), overrides=[f"run.seed={seed}"], config=config)
    started = time.monotonic()
    proc = procs.start(role_args[0], argv)
    rc = proc.wait(540)
    logs = "\n".join(f"--- {p.name}\n{log_tail(p, 15)}" for p in sorted((run_dir / "logs").glob("*.log")))
    assert rc == 0, f"zmqrl {role_args[0]} exited with {rc}\n{procs.describe()}\n{logs}"
    summary = read_json(run_dir / "summary.json")
    assert summary is not None
    assert "stop_return" in summary["stop_reason"], (summary["stop_reason"], summary["evals"])
    # learned, not given: a random policy scores about -0.7, and the solving evaluation came after updates
    # (a run may solve at its first evaluation, 250 updates in)
    assert summary["best_eval_return"] >= 0.8 and summary["solved"]["opt_steps"] > 0, summary["evals"]
    print(f"{Path(config).name} {role_args[0]} seed {seed}: {summary['best_eval_return']:.1f} at "
          f"{summary['solved']['env_steps']} env steps, {time.monotonic() - started:.0f}s wall")
    return summary


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("config", LOCAL_CONFIGS, ids=lambda c: Path(c).stem)
def test_local_learns_catch_from_pixels(tmp_path: Path, procs: Procs, config: str) -> None:
    summary = _run(tmp_path, procs, config, ["local", "--actors", "2"], seed=0)
    assert summary["messages"]["rejected_total"] == 0 and summary["messages"]["batches_lost"] == 0
    # uint8 frames end to end: what the learner received is one byte per pixel, not four
    pixels = summary["transitions_inserted"] * 2 * 84 * 84  # obs and next_obs of every transition
    assert 0 < summary["bytes_received"] < 1.1 * pixels, (summary["bytes_received"], pixels)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("config", TRAIN_CONFIGS, ids=lambda c: Path(c).stem)
def test_train_learns_catch_from_pixels(tmp_path: Path, procs: Procs, config: str) -> None:
    summary = _run(tmp_path, procs, config, ["train"], seed=1)
    assert summary["solved"]["env_steps"] == summary["env_steps"]  # stopped at the evaluation that solved it
