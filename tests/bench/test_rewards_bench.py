"""The rewards group (``zmqrl bench --only rewards``): the shipped CartPole DQN config run by ``zmqrl local`` on
CartPole as shipped and paid x0.01 and x100, each to its scaled stop return; the rows compare the times, and
the runs' own summaries show the learner's factor follows the scale exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench_rows import check_schema, check_verdict
from zmqrl import bench
from zmqrl.run.rundir import read_json

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_rewards_rows_of_the_cartpole_config(tmp_path: Path) -> None:
    out, work = tmp_path / "bench.json", tmp_path / "work"
    code = bench.main(["--quick", "--only", "rewards", "--config", str(REPO / "configs" / "cartpole_dqn.yaml"),
                       "--json", str(out), "--keep", str(work)])
    rows = {r["name"]: r for r in json.loads(out.read_text())}
    assert code == 0 and set(rows) == {"rewards_cartpole_dqn_x0.01_vs_x1", "rewards_cartpole_dqn_x100_vs_x1"}, rows
    for row in rows.values():
        check_schema(row)
        check_verdict(row)
        assert row["goal"] == "<= 1.5" and row["measured"] > 0 and row["baseline"] > 0, row
        assert "unsolved" not in row["note"], row  # each run reached its own scale's 475
    summaries = {scale: read_json(next(work.glob(f"**/rewards-cartpole_dqn-x{scale}-0/summary.json")))
                 for scale in ("1", "0.01", "100")}
    factors = {scale: s["reward_scale"] for scale, s in summaries.items() if s is not None}
    # each run's warm-up is its own (actors and learner interleave as the OS schedules them): within 5%
    assert factors["0.01"] / factors["1"] == pytest.approx(100, rel=0.05), factors
    assert factors["100"] / factors["1"] == pytest.approx(0.01, rel=0.05), factors
    assert summaries["100"]["best_eval_return"] >= 47_500  # evaluations on the paid scale
