"""Tests for the single-process trainer: the run directory contract, determinism, resume, learning."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from zmqrl import config
from zmqrl.agents.base import linear
from zmqrl.config import Config
from zmqrl.run import checkpoint
from zmqrl.run.train import train

REPO = Path(__file__).resolve().parents[2]
SHORT_RUN = ["trainer.max_opts=300", "trainer.warmup=200", "trainer.eval_interval=100", "trainer.save_interval=100",
             "trainer.eval_episodes=2", "trainer.record_interval=50", "trainer.stop_return=null",
             "env.max_episode_steps=200"]


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def scalar_tags(tb_dir: Path) -> dict[str, list[int]]:
    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [event.step for event in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Config, Path, dict[str, Any]]:
    """One 300-step run shared by the tests below: (config before, config after, run dir, summary)."""
    cfg = config.load(REPO / "configs" / "cartpole_dqn.yaml", SHORT_RUN)
    before = copy.deepcopy(cfg)
    run_dir = tmp_path_factory.mktemp("train") / "run"
    summary = train(cfg, run_dir)
    return before, cfg, run_dir, summary


def test_linear_epsilon() -> None:
    def linear_epsilon(step: int, start: float, end: float, decay: int) -> float:
        return linear("epsilon", start, end, decay)(step)

    assert linear_epsilon(0, 1.0, 0.1, 100) == 1.0
    assert linear_epsilon(50, 1.0, 0.1, 100) == pytest.approx(0.55)
    assert linear_epsilon(100, 1.0, 0.1, 100) == pytest.approx(0.1)
    assert linear_epsilon(10_000, 1.0, 0.1, 100) == pytest.approx(0.1)
    assert linear_epsilon(5, 1.0, 0.1, 0) == 0.1


def test_run_dir_config_yaml_is_what_ran(short_run: tuple[Config, Config, Path, dict[str, Any]]) -> None:
    before, used, run_dir, _ = short_run
    saved = config.load(run_dir / "config.yaml")
    assert saved == used
    assert saved.run.run_dir == str(run_dir)
    before.run.run_dir = str(run_dir)  # the only field the trainer fills in
    assert saved == before
    assert saved.trainer.max_opts == 300 and saved.trainer.stop_return is None


def test_run_dir_summary(short_run: tuple[Config, Config, Path, dict[str, Any]]) -> None:
    _, _, run_dir, returned = short_run
    summary = read_json(run_dir / "summary.json")
    assert summary == json.loads(json.dumps(returned))
    assert summary["opt_steps"] == 300
    assert summary["env_steps"] > 0 and summary["env_steps"] % 4 == 0  # four envs step together
    assert summary["episodes"] > 0
    assert summary["stop_reason"] == "reached max_opts=300"
    assert summary["solved"] is None
    assert [e["opt_steps"] for e in summary["evals"]] == [100, 200, 300]
    assert all(e["episodes"] == 2 for e in summary["evals"])
    assert summary["best_eval_return"] == max(e["return_mean"] for e in summary["evals"])
    assert summary["last_eval_return"] == summary["evals"][-1]["return_mean"]
    assert summary["wall_s"] > 0 and summary["opt_steps_per_s"] > 0
    assert 200 <= summary["replay_size"] <= summary["env_steps"]
    assert summary["replay_samples_per_s"] == pytest.approx(300 * 64 / summary["wall_s"], rel=1e-3)
    cost = summary["compute_cost"]
    assert set(cost) == {"act", "insert", "sample", "update", "priorities", "evaluate", "other"}, cost
    assert 0.99 <= sum(cost.values()) <= 1.01 and cost["update"] > 0 and cost["act"] > 0, cost


def test_run_dir_checkpoints(short_run: tuple[Config, Config, Path, dict[str, Any]]) -> None:
    _, _, run_dir, summary = short_run
    ckpts = run_dir / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["100", "200", "300", "best", "latest"]
    for name, opt_steps in (("100", 100), ("200", 200), ("300", 300), ("latest", 300)):
        agent_state, state = checkpoint.load(ckpts / name)
        assert state["opt_steps"] == opt_steps, name
        assert agent_state["opt_steps"] == opt_steps, name
        assert {"q", "target", "optimizer", "rng"} <= set(agent_state)
    params, best = checkpoint.load_policy_params(ckpts / "best")  # best is the policy alone, as in zmqrl local
    assert sorted(p.name for p in (ckpts / "best").iterdir()) == ["policy.npz", "state.json"]
    assert best["eval_return"] == summary["best_eval_return"] and best["training_state"] is False
    assert best["opt_steps"] in (100, 200, 300)
    at_best = next(e for e in summary["evals"] if e["return_mean"] == summary["best_eval_return"])
    assert best["opt_steps"] == at_best["opt_steps"]
    trained, _ = checkpoint.load(ckpts / str(best["opt_steps"]))
    assert params.keys() == trained[checkpoint.POLICY_KEY].keys()
    assert all((params[k] == trained[checkpoint.POLICY_KEY][k].numpy()).all() for k in params)
    _, latest = checkpoint.load(ckpts / "latest")
    assert latest["env_steps"] == summary["env_steps"]
    assert len(latest["evals"]) == 3


def test_run_dir_tensorboard(short_run: tuple[Config, Config, Path, dict[str, Any]]) -> None:
    _, _, run_dir, _ = short_run
    tags = scalar_tags(run_dir / "tb")
    for family in ("train/", "eval/", "perf/"):
        assert any(tag.startswith(family) for tag in tags), (family, sorted(tags))
    assert tags["eval/return_mean"] == [100, 200, 300]
    assert tags["train/loss"] == [50, 100, 150, 200, 250, 300]
    for tag in ("train/epsilon", "train/q_mean", "perf/env_steps_per_s", "perf/opt_steps_per_s", "perf/priority_max"):
        assert tag in tags


def test_same_seed_same_run(short_run: tuple[Config, Config, Path, dict[str, Any]], tmp_path: Path) -> None:
    _, _, _, first = short_run
    again = train(config.load(REPO / "configs" / "cartpole_dqn.yaml", SHORT_RUN), tmp_path / "again")
    for key in ("env_steps", "episodes", "best_eval_return", "train_return_recent", "replay_size"):
        assert again[key] == first[key], key
    assert [e["return_mean"] for e in again["evals"]] == [e["return_mean"] for e in first["evals"]]


def test_resume_continues_the_counters(short_run: tuple[Config, Config, Path, dict[str, Any]],
                                       tmp_path: Path) -> None:
    _, _, first_dir, first = short_run
    run_dir = tmp_path / "run"
    shutil.copytree(first_dir, run_dir)
    cfg = config.load(REPO / "configs" / "cartpole_dqn.yaml", [*SHORT_RUN, "trainer.max_opts=400"])
    summary = train(cfg, run_dir, resume=True)
    assert summary["opt_steps"] == 400
    assert summary["env_steps"] > first["env_steps"]
    assert summary["episodes"] >= first["episodes"]
    assert summary["stop_reason"] == "reached max_opts=400"
    assert [e["opt_steps"] for e in summary["evals"]] == [100, 200, 300, 400]
    assert summary["evals"][:3] == first["evals"]
    assert summary["best_eval_return"] >= first["best_eval_return"]
    assert read_json(run_dir / "summary.json")["opt_steps"] == 400
    ckpts = run_dir / "checkpoints"
    assert (ckpts / "400").is_dir()
    agent_state, state = checkpoint.load(ckpts / "latest")
    assert state["opt_steps"] == 400 and agent_state["opt_steps"] == 400
    # the replay is not saved: after a resume it holds only transitions collected since
    assert summary["replay_size"] <= summary["env_steps"] - first["env_steps"]


def test_resume_with_uniform_replay_holds_only_real_transitions(tmp_path: Path) -> None:
    """A resumed uniform replay must not claim (and sample) transitions it never stored."""
    overrides = [*SHORT_RUN, "replay.prioritized=false", "trainer.max_opts=100"]
    first = train(config.load(REPO / "configs" / "cartpole_dqn.yaml", overrides), tmp_path)
    assert first["opt_steps"] == 100
    cfg = config.load(REPO / "configs" / "cartpole_dqn.yaml", [*overrides, "trainer.max_opts=150"])
    summary = train(cfg, tmp_path, resume=True)
    assert summary["opt_steps"] == 150
    new_steps = summary["env_steps"] - first["env_steps"]
    assert new_steps >= 200  # warmup is collected again before optimisation resumes
    # n-step transitions still pending at the checkpoint (at most n_step - 1 per env) come back with
    # the envs' state and enter the new replay: real transitions, made before the resume
    pending = cfg.env.num_envs * (cfg.agent.n_step - 1)
    assert summary["replay_size"] <= new_steps + pending


def test_resume_with_checkpoint_replay_restores_its_contents(tmp_path: Path) -> None:
    """With trainer.checkpoint_replay the resumed run starts with the stored transitions, no new warm-up."""
    overrides = [*SHORT_RUN, "trainer.max_opts=100", "trainer.checkpoint_replay=true"]
    first = train(config.load(REPO / "configs" / "cartpole_dqn.yaml", overrides), tmp_path)
    saved = tmp_path / "checkpoints" / "latest" / "replay.npz"  # part of latest, written with it
    assert saved.is_file() and first["replay_size"] > 200
    assert not (tmp_path / "checkpoints" / "replay.npz").exists()
    cfg = config.load(REPO / "configs" / "cartpole_dqn.yaml", [*overrides, "trainer.max_opts=150"])
    summary = train(cfg, tmp_path, resume=True)
    assert summary["opt_steps"] == 150
    new_steps = summary["env_steps"] - first["env_steps"]
    assert new_steps < 200  # optimisation resumed at once: no second warm-up
    # Everything stored before plus the new steps, give or take those pending in n-step windows
    # (the windows are saved with the checkpoint, so steps pending at the stop complete after it).
    pending = cfg.env.num_envs * (cfg.agent.n_step - 1)
    assert abs(summary["replay_size"] - (first["replay_size"] + new_steps)) <= pending


@pytest.mark.slow
def test_cartpole_learns(tmp_path: Path) -> None:
    """The shipped config solves CartPole-v1 (greedy evaluation mean >= 475) well inside four minutes."""
    run_dir = tmp_path / "cartpole"
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "zmqrl.cli", "train", "configs/cartpole_dqn.yaml", "--run-dir", str(run_dir),
         "--set", "run.seed=1"],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = read_json(run_dir / "summary.json")
    assert summary["best_eval_return"] >= 475, (summary["best_eval_return"], elapsed)
    assert summary["solved"] is not None and summary["solved"]["return_mean"] >= 475
    assert summary["stop_reason"].startswith("evaluation reached stop_return")
    best = run_dir / "checkpoints" / "best"
    assert best.is_dir()
    _, state = checkpoint.load_policy_params(best)
    assert state["eval_return"] == summary["best_eval_return"]


@pytest.mark.slow
def test_cli_train_short_run(tmp_path: Path, cartpole_cfg: Callable[..., Config]) -> None:
    """The command line runs the same trainer and exits 0."""
    cfg = cartpole_cfg(*SHORT_RUN, "trainer.max_opts=100")
    cfg_path = tmp_path / "short.yaml"
    config.dump(cfg, cfg_path)
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "zmqrl.cli", "train", str(cfg_path), "--run-dir", str(run_dir),
                           "--set", "run.seed=3"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = read_json(run_dir / "summary.json")
    assert summary["opt_steps"] == 100 and summary["seed"] == 3
    assert config.load(run_dir / "config.yaml").run.seed == 3
