"""The cheetah bench group: its config, SB3 peer and rows (no training runs here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from zmqrl.bench import cheetah, harness, registry

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / cheetah.CONFIG


def _summary(last: float, best: float) -> dict[str, Any]:
    evals = [{"wall_s": 30.0, "env_steps": 1000, "return_mean": best}, {"wall_s": 60.0, "env_steps": 2000,
                                                                         "return_mean": last}]
    return {"last_eval_return": last, "best_eval_return": best, "env_steps": 2000, "opt_steps": 40, "wall_s": 60.0,
            "launcher_s": 64.0, "evals": evals, "evals_total": 2}


def test_cheetah_is_a_group_with_an_appo_halfcheetah_config() -> None:
    assert registry.group("cheetah") is cheetah.run
    cfg = harness.load_config(CONFIG)
    assert (cfg.agent.algo, cfg.env.id) == ("appo", cheetah.ENV_ID)
    assert cfg.trainer.stop_return is None  # the rows compare returns after a fixed time
    assert cfg.env.reward_scale == "auto" and cfg.env.reward_rms is not None


def test_the_peer_is_rl_zoos_halfcheetah_ppo() -> None:
    kwargs = cheetah.SB3_KWARGS
    assert (kwargs["n_steps"], kwargs["batch_size"], kwargs["n_epochs"]) == (512, 64, 20)
    assert (kwargs["gamma"], kwargs["gae_lambda"], kwargs["clip_range"]) == (0.98, 0.92, 0.1)
    assert kwargs["policy_kwargs"]["net_arch"] == {"pi": [256, 256], "vf": [256, 256]}
    assert "VecNormalize" in cheetah._SB3_SCRIPT and "deterministic=True" in cheetah._SB3_SCRIPT
    assert "training=False" in cheetah._SB3_SCRIPT and "norm_reward=False" in cheetah._SB3_SCRIPT


def test_the_evaluation_interval_scales_down_with_the_budget() -> None:
    assert cheetah.eval_interval(100, cheetah.FULL_S) == 100
    assert cheetah.eval_interval(100, 2 * cheetah.FULL_S) == 100
    assert cheetah.eval_interval(100, 60.0) == 10
    assert cheetah.eval_interval(100, 1.0) == 1


def test_rows_judge_last_and_best_against_sb3() -> None:
    sb3 = {"return_mean": 1000.0, "returns": [1000.0] * 5, "env_steps": 3000, "trained_s": 60.0}
    last, best, steps = cheetah.cheetah_rows(_summary(1400.0, 1600.0), sb3, "n")
    assert (last.ratio, last.goal, last.met) == (1.4, ">= 1.5", False)
    assert (best.ratio, best.goal, best.met) == (1.6, ">= 1.5", True)
    assert steps.goal is None and steps.baseline == 3000 and steps.measured == 2000


def test_no_ratio_while_sb3_is_not_positive() -> None:
    sb3 = {"return_mean": -50.0, "returns": [-50.0] * 5, "env_steps": 3000, "trained_s": 60.0}
    last, best, _ = cheetah.cheetah_rows(_summary(100.0, 200.0), sb3, "n")
    assert last.ratio is None and last.met is None and "not positive" in last.note
    assert best.ratio is None and best.met is None


@pytest.mark.slow
def test_nothing_runs_without_sb3_and_rows_are_skipped_without_its_interpreter(tmp_path: Path) -> None:
    assert cheetah.run(harness.Context(harness.Settings.preset("smoke"), tmp_path)) == []
    settings = harness.Settings.preset("smoke", sb3=True, sb3_python="/bin/false")
    rows = cheetah.run(harness.Context(settings, tmp_path))
    assert [r.name for r in rows] == ["cheetah_appo_last_vs_sb3", "cheetah_appo_best_vs_sb3",
                                      "cheetah_appo_env_steps_vs_sb3"]
    assert all(r.met is None and "not installed" in r.note for r in rows)
    assert rows[0].goal == ">= 1.5" and rows[2].goal is None


def test_notes_carry_every_evaluation() -> None:
    note = cheetah.describe_local(_summary(1400.0, 1600.0), 7, 8)
    assert "2,000 env steps" in note and "40 updates (320 gradient steps)" in note
    assert "30 s: 1600" in note and "60 s: 1400" in note
