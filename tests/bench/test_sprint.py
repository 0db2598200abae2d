"""``zmqrl sprint`` (launch/gpu_sprint.sh): the GPU host's one prepared command, run here on CPU.

The real command on Catch with a tiny budget: the captured-update tests (all skipped without CUDA),
the cnn bench group (smoke), ``zmqrl local`` for the time the budget leaves, then the files and the
report. It must stop inside its budget, stop the run by the run's own wall-time limit, and write every
file the GPU host's run brings back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench_rows import check_schema, check_skipped_cuda, check_verdict, positive_finite
from zmqrl.bench.sprint import actor_rates

REPO = Path(__file__).resolve().parents[2]
CATCH = REPO / "configs" / "catch_dqn.yaml"
TRAIN_S = 25.0  # of training, enough for updates, evaluations and the wire's figures
BUDGET_S = 240.0  # an upper bound: the CUDA tests get 0.15 of it (36 s; all skipped here, ~10 s alone but 16-20 s
# beside another heavy test of the suite, past the 19.5 s that a 130 s budget gave them), the bench 0.35;
# the training is capped by TRAIN_S, so the sprint takes 70-90 s


def sprint(out: Path, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(["bash", str(REPO / "launch" / "gpu_sprint.sh"), str(out), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_sprint_on_catch_writes_every_file_inside_its_budget(tmp_path: Path) -> None:
    out = tmp_path / "sprint"
    done = sprint(out, "--config", str(CATCH), "--budget-s", str(BUDGET_S), "--actors", "1", "--device", "cpu",
                  "--bench", "smoke", "--train-s", str(TRAIN_S), "--set", "trainer.stop_return=null")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in ("report.txt", "sprint.json", "summary.json", "config.yaml", "curve.png", "bench_cnn.json",
                 "tests_cuda.log"):
        assert (out / name).is_file(), name
    assert (out / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    found = json.loads((out / "sprint.json").read_text())
    assert found["elapsed_s"] <= BUDGET_S, found["elapsed_s"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == f"reached max_seconds={found['train_seconds']:.1f}"
    assert found["train_seconds"] == TRAIN_S  # (the budget left more)
    assert summary["opt_steps"] > 0 and summary["env_steps"] > 0 and summary["evals"]
    ran = yaml.safe_load((out / "config.yaml").read_text())
    assert ran["run"]["device"] == "cpu"
    assert ran["trainer"]["max_seconds"] == pytest.approx(found["train_seconds"], abs=1)
    assert found["actors"]["actors"] == 1 and found["actors"]["env_steps_per_s_per_actor"] > 0
    assert 6000 < found["actors"]["wire_bytes_per_transition"] < 30000  # two 84x84 frames, and headers
    rows = json.loads((out / "bench_cnn.json").read_text())  # (the bench's one smoke run of the cnn group)
    for row in rows:
        check_schema(row)
        check_verdict(row)
        if not check_skipped_cuda(row):
            assert positive_finite(row["ratio"]) and positive_finite(row["measured"]), row
    names = [row["name"] for row in rows]
    batches = (32, 256, 512)
    assert names == ["cnn_learner_b32_cpu", "cnn_update_b32_cpu_static",
                     *[f"cnn_replay_b{b}_cpu_torch" for b in batches], "cnn_learner_b32_cpu_torch_replay",
                     *[f"cnn_sum_tree_b{b}_cpu" for b in batches], *[f"cnn_learner_b{b}_cuda_pinned" for b in batches],
                     *[f"cnn_update_b{b}_cuda_graph" for b in batches],
                     *[f"cnn_learner_b{b}_cuda_device_replay" for b in batches],
                     *[f"cnn_sum_tree_b{b}_cuda" for b in batches]]
    tests = found["cuda_tests"]  # run (the pytest plumbing), each one skipped without CUDA
    assert tests["ran"] and tests["exit"] == 0 and tests["skipped"] >= 5 and "passed" not in tests, tests
    report = (out / "report.txt").read_text()
    assert report == done.stdout[done.stdout.index("zmqrl sprint:"):]  # the printed report is the file's
    assert f"best {summary['best_eval_return']:.2f}" in report and "env steps/s each" in report
    assert f"cuda tests       {tests['summary']}" in report
    assert "replay on host" in report  # (the learner on the CPU: replay.device auto keeps replay there)
    assert "bench cnn_replay_b256_cpu_torch" in report and "12 rows not measured here" in report
    alone = next(r for r in json.loads((out / "bench_cnn.json").read_text()) if r["name"] == "cnn_learner_b32_cpu")
    assert f"learner alone    {alone['measured']:.2f} updates/s (cnn_learner_b32_cpu); in the job" in report \
        or f"learner alone    {alone['measured']:,.0f} updates/s (cnn_learner_b32_cpu); in the job" in report, report
    assert "intake thread" in report and "controls" in report


@pytest.mark.slow
def test_sprint_refuses_a_bad_key_before_running_anything(tmp_path: Path) -> None:
    done = sprint(tmp_path / "o", "--config", str(CATCH), "--set", "agent.nope=1", timeout=120)
    assert done.returncode == 2 and "agent.nope" in done.stderr
    assert not (tmp_path / "o" / "run").exists()
    done = sprint(tmp_path / "o", "--config", str(CATCH), "--train-s", "0", timeout=120)
    assert done.returncode == 2 and "--train-s must be positive" in done.stderr
    assert not (tmp_path / "o" / "run").exists()


def test_actor_rates_per_core_paused_share_and_wire_bytes() -> None:
    summary = {"wall_s": 100.0, "transitions_inserted": 1000,
               "actors": {"actor-0": {"env_steps_per_s": 600.0, "paused_s": 50.0},
                          "actor-1": {"env_steps_per_s": 400.0, "paused_s": 50.0}},
               "proxies": {"proxy": {"bytes": 5_000_000}}}
    rates = actor_rates(summary, cores=16)
    assert rates["env_steps_per_s_per_actor"] == 500.0 and rates["env_steps_per_s_total"] == 1000.0
    assert rates["paused_share"] == 0.5 and rates["env_steps_per_s_per_actor_unpaused"] == 1000.0
    assert rates["wire_bytes_per_transition"] == 5000.0
