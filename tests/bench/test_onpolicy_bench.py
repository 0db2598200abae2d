"""The on-policy bench group and the APPO rows of the solve group.

The group's smoke run starts a real ``zmqrl local`` APPO job for a few seconds: its figures mean
nothing, but every row must come back with positive figures whose ratios hold what the rows claim
(the job's env steps/s in two rows, a share of segments at most 1, the lag bound of the config).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench_rows import check_schema, check_verdict, positive_finite
from zmqrl import bench
from zmqrl.bench import harness, onpolicy, registry, solve

REPO = Path(__file__).resolve().parents[2]
APPO = REPO / "configs" / "cartpole_appo.yaml"


def test_onpolicy_is_a_group_and_appo_a_solve_config() -> None:
    assert registry.group("onpolicy") is onpolicy.run
    assert "cartpole_appo.yaml" in solve.CONFIGS and onpolicy.CONFIG == APPO.name
    cfg = harness.load_config(APPO)
    assert cfg.agent.algo == "appo" and cfg.trainer.stop_return is not None
    assert (cfg.agent.algo, cfg.env.id) in solve.SB3_PEERS


def test_the_ppo_peer_has_its_own_cadence_envs_and_goal() -> None:
    ppo = solve.SB3_PEERS[("appo", "CartPole-v1")]
    assert ppo.algo == "PPO" and ppo.n_envs == 8 and ppo.steps == 100_000
    assert ppo.kwargs["learning_rate"] == f"{solve.LINEAR}1e-3" and ppo.kwargs["clip_range"] == f"{solve.LINEAR}0.2"
    assert solve.sb3_cadences(ppo, 100) == [solve.SB3_EVAL_EVERY, 8192]  # its own, whatever zmqrl's interval
    assert all(every % ppo.n_envs == 0 for every in solve.sb3_cadences(ppo, 100))  # reached at a vector step
    with pytest.raises(harness.BenchError, match="train_freq"):
        ppo.eval_every_matched(100)  # PPO trains on rollouts: no matched cadence
    assert ppo.goal == 0.7
    for key in (("dqn", "CartPole-v1"), ("sac", "Pendulum-v1")):  # unchanged: SB3_GOAL, one env, matched cadence
        peer = solve.SB3_PEERS[key]
        assert peer.goal == solve.SB3_GOAL == 0.5 and peer.n_envs == 1 and peer.eval_every is None


def test_solve_rows_judge_against_the_peers_goal() -> None:
    sb3 = [solve.SolveRun("sb3", seed, w, {"env_steps": 1}) for seed, w in enumerate([8.0, 10.0, 12.0])]
    local = [solve.SolveRun("local", seed, w, {"env_steps": 1}) for seed, w in enumerate([5.0, 6.0, 9.0])]
    default, slowest = solve.sb3_rows("t", local, sb3, "")
    assert (default.ratio, default.goal, default.met) == (0.6, "<= 0.5", False) and slowest.met is True
    ppo, _ = solve.sb3_rows("t", local, sb3, "", solve.SB3_PEERS[("appo", "CartPole-v1")].goal)
    assert (ppo.ratio, ppo.goal, ppo.met) == (0.6, "<= 0.7", True)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_onpolicy_rows(tmp_path: Path) -> None:
    out = tmp_path / "onpolicy.json"
    assert bench.main(["--only", "onpolicy", "--smoke", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    names = ["local_vs_bare", "local_vs_update_rate", "kept_under_lag_bound", "trained_lag", "1epoch_local_vs_bare"]
    assert [r["name"] for r in rows] == [f"onpolicy_cartpole_appo_{n}" for n in names]
    by_name = {r["name"].removeprefix("onpolicy_cartpole_appo_"): r for r in rows}
    for row in rows:
        check_schema(row)
        check_verdict(row)
        assert positive_finite(row["measured"]) and positive_finite(row["baseline"]), row
        assert positive_finite(row["ratio"]), row
    job = by_name["local_vs_bare"]
    assert job["goal"] == ">= 0.8" and job["met"] is not None and job["unit"] == "env steps/s"
    assert "--no-evaluator" in job["note"] and "NumpyActorCriticPolicy" in job["note"]
    assert len(re.findall(r"actor-\d [\d,]+/s, paused \d+% of the run", job["note"])) == 2, job["note"]
    assert all(r["goal"] is None and r["met"] is None for r in rows[1:4])  # reported only
    one = by_name["1epoch_local_vs_bare"]  # the same job, one pass a batch: against the same bare loop
    assert one["goal"] == ">= 0.8" and one["baseline"] == job["baseline"] and "agent.epochs=1" in one["note"]
    room = by_name["local_vs_update_rate"]
    assert room["measured"] == job["measured"] and "updates/s" in room["note"]
    assert room["ratio"] < 1.5, room  # the actors cannot outrun what the learner takes in by much (queue, overflow)
    kept = by_name["kept_under_lag_bound"]
    assert kept["unit"] == "segments" and kept["ratio"] <= 1.0 and "dropped for lag" in kept["note"]
    lag = by_name["trained_lag"]
    assert lag["baseline"] == harness.load_config(APPO).trainer.max_policy_lag and lag["unit"] == "versions"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_appo_solve_rows_without_sb3(tmp_path: Path) -> None:
    """The solve group on the APPO config alone (smoke: too short to solve), SB3 asked for but missing: the
    SB3 rows are skipped and carry the PPO peer's goal."""
    out = tmp_path / "solve.json"
    assert bench.main(["--only", "solve", "--smoke", "--config", str(APPO), "--sb3", "--sb3-python", "/bin/false",
                       "--json", str(out)]) == 0
    rows = {r["name"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {f"solve_cartpole_appo_{n}" for n in ("local_vs_train", "env_steps_local_vs_train",
                                                               "local_vs_sb3", "local_slowest_vs_sb3")}
    for row in rows.values():
        check_schema(row)
        check_verdict(row)
    assert positive_finite(rows["solve_cartpole_appo_local_vs_train"]["ratio"])
    skipped = rows["solve_cartpole_appo_local_vs_sb3"]
    assert skipped["goal"] == "<= 0.7" and skipped["met"] is None and "not installed" in skipped["note"]
    assert rows["solve_cartpole_appo_local_slowest_vs_sb3"]["goal"] == "<= 1"
