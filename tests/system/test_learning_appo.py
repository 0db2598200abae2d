"""APPO learns CartPole-v1 through the algorithm seam: in one process and as a distributed run.

The shipped config (rl-baselines3-zoo's PPO values at 10 epochs and lr 2e-3, ``configs/cartpole_appo.yaml``) must
reach a greedy evaluation mean >= 475 over 10 episodes: ``zmqrl train`` within 40k env steps (seeds 0-4 measured:
9.5k-17.4k;
more seeds nightly, ``--all-seeds``), and ``zmqrl local --actors 2`` with the on-policy store's
accounting in its summary (segments trained, dropped for lag, pauses of a full queue). The Gaussian policy
learns Pendulum-v1 (``configs/pendulum_appo.yaml``: greedy >= -200 within 100k env steps; seeds 0-2
measured at 48k, about 20 s). With an LSTM, APPO learns CartPole without its velocities
(``configs/cartpole_pomdp_appo.yaml``: greedy 475 within 300k env steps; seeds 0-2 measured at 79k-106k
env steps, 35-46 s of ``zmqrl train``), which the feed-forward control cannot. Each ``zmqrl
train`` run is deterministic in env steps for a seed (CPU, one process); wall time is only bounded loosely.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from procs import REPO, Procs, log_tail, zmqrl_argv
from tiers import seeds
from zmqrl.run.rundir import read_json

CARTPOLE_APPO = str(REPO / "configs" / "cartpole_appo.yaml")
PENDULUM_APPO = str(REPO / "configs" / "pendulum_appo.yaml")
POMDP_APPO = str(REPO / "configs" / "cartpole_pomdp_appo.yaml")


def first_solved(summary: dict) -> dict | None:
    return next((e for e in summary["evals"] if e["return_mean"] >= 475.0), None)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", seeds(0, 1, 2))
def test_train_solves_cartpole_within_40k_env_steps(tmp_path: Path, procs: Procs, seed: int) -> None:
    run_dir = tmp_path / "run"
    argv = zmqrl_argv("train", "--run-dir", str(run_dir), overrides=[f"run.seed={seed}", "trainer.max_opts=4000"],
                      config=CARTPOLE_APPO)
    started = time.monotonic()
    train = procs.start("train", argv)
    rc = train.wait(240)
    assert rc == 0, f"zmqrl train exited with {rc}\n{train.tail()}"
    summary = read_json(run_dir / "summary.json")
    assert summary is not None
    solved = first_solved(summary)
    assert solved is not None, f"seed {seed}: no evaluation >= 475 in {summary['evals']}"
    assert solved["env_steps"] <= 40_000, solved
    assert summary["replay_item"] == "segment" and summary["store"]["dropped_lag"] == 0
    print(f"seed {seed}: eval {solved['return_mean']:.1f} at {solved['env_steps']} env steps, "
          f"{time.monotonic() - started:.0f}s wall")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_local_solves_cartpole(tmp_path: Path, procs: Procs) -> None:
    run_dir = tmp_path / "run"
    procs.sweep_args.append(str(run_dir))
    argv = zmqrl_argv("local", "--actors", "2", "--run-dir", str(run_dir), overrides=["run.seed=0"],
                      config=CARTPOLE_APPO)
    local = procs.start("local", argv)
    rc = local.wait(240)
    logs = "\n".join(f"--- {p.name}\n{log_tail(p, 15)}" for p in sorted((run_dir / "logs").glob("*.log")))
    assert rc == 0, f"zmqrl local exited with {rc}\n{procs.describe()}\n{logs}"
    summary = read_json(run_dir / "summary.json")
    assert summary is not None and first_solved(summary) is not None, summary and summary["evals"]
    assert "stop_return" in summary["stop_reason"]
    assert summary["messages"]["rejected_total"] == 0 and summary["messages"]["config_mismatches"] == 0
    store = summary["store"]
    assert store["trained"] > 0 and store["dropped_other_line"] == 0
    assert store["added"] == summary["transitions_inserted"]
    print(f"solved in {summary['wall_s']:.1f}s; policy lag {summary['policy_lag']}; store {store}")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_solves_pendulum_with_a_gaussian_policy(tmp_path: Path, procs: Procs) -> None:
    run_dir = tmp_path / "run"
    train = procs.start("train", zmqrl_argv("train", "--run-dir", str(run_dir), overrides=["run.seed=0"],
                                            config=PENDULUM_APPO))
    rc = train.wait(240)
    assert rc == 0, f"zmqrl train exited with {rc}\n{train.tail()}"
    summary = read_json(run_dir / "summary.json")
    assert summary is not None
    solved = next((e for e in summary["evals"] if e["return_mean"] >= -200.0), None)
    assert solved is not None and solved["env_steps"] <= 100_000, summary["evals"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", seeds(0, 1, 2))
def test_train_solves_cartpole_without_velocities_with_an_lstm(tmp_path: Path, procs: Procs, seed: int) -> None:
    run_dir = tmp_path / "run"
    train = procs.start("train", zmqrl_argv("train", "--run-dir", str(run_dir), overrides=[f"run.seed={seed}"],
                                            config=POMDP_APPO))
    rc = train.wait(240)
    assert rc == 0, f"zmqrl train exited with {rc}\n{train.tail()}"
    summary = read_json(run_dir / "summary.json")
    assert summary is not None
    solved = first_solved(summary)
    assert solved is not None and solved["env_steps"] <= 300_000, summary["evals"]
