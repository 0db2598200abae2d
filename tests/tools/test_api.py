"""The Python API: a light ``import zmqrl``, configs with overrides, training runs that return their summary,
and a trained policy that acts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import zmqrl
from zmqrl.config import ConfigError
from zmqrl.run.checkpoint import CheckpointError

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
CARTPOLE = REPO / "configs" / "cartpole_dqn.yaml"
SHORT = ["trainer.max_opts=200", "trainer.warmup=100", "trainer.eval_interval=100", "trainer.save_interval=100",
         "trainer.eval_episodes=2", "trainer.record_interval=50", "trainer.stop_return=null",
         "env.max_episode_steps=100"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    run_dir = tmp_path_factory.mktemp("api") / "run"
    cfg = zmqrl.load_config(CARTPOLE, overrides=SHORT)
    summary = zmqrl.run_train(cfg, run_dir=run_dir)
    assert cfg.run.run_dir == str(run_dir)
    return run_dir, summary


@pytest.mark.slow
def test_import_zmqrl_loads_neither_torch_nor_gymnasium() -> None:
    code = ("import sys, zmqrl\n"
            "zmqrl.load_config, zmqrl.load_policy, zmqrl.run_local, zmqrl.ConfigError, zmqrl.CheckpointError\n"
            "heavy = ('torch', 'gymnasium', 'matplotlib', 'zmq', 'tensorboard')\n"
            "print(sorted(m for m in heavy if m in sys.modules))\n"
            "cfg = zmqrl.load_config(None, ['agent.lr=3e-4'])\n"
            "print(sorted(m for m in heavy if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "['gymnasium']"], out.stderr  # the agent: schema needs gymnasium


def test_load_config_applies_overrides_and_checks_them() -> None:
    cfg = zmqrl.load_config(CARTPOLE, overrides=["agent.lr=3e-4", "agent.hidden=[128, 128]"])
    assert cfg.agent.lr == 3e-4 and cfg.agent.hidden == [128, 128] and cfg.env.id == "CartPole-v1"  # type: ignore
    assert zmqrl.load_config().trainer.max_opts == 50_000  # the defaults
    with pytest.raises(zmqrl.ConfigError, match="did you mean 'capacity'.*`zmqrl config` lists every key"):
        zmqrl.load_config(CARTPOLE, overrides=["replay.capacty=10"])
    assert zmqrl.ConfigError is ConfigError and zmqrl.CheckpointError is CheckpointError


def test_train_returns_the_summary_it_writes(trained: tuple[Path, dict]) -> None:
    run_dir, summary = trained
    assert summary == json.loads((run_dir / "summary.json").read_text())
    assert summary["opt_steps"] == 200 and summary["stop_reason"] == "reached max_opts=200"
    assert [e["opt_steps"] for e in summary["evals"]] == [100, 200]


def test_run_train_and_run_local_are_the_api() -> None:
    from zmqrl.tools.api import run_local, run_train

    assert zmqrl.run_train is run_train and zmqrl.run_local is run_local


def test_load_policy_acts_on_one_observation_or_a_batch(trained: tuple[Path, dict]) -> None:
    run_dir, _ = trained
    policy = zmqrl.load_policy(run_dir, checkpoint="best")
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    action = policy.act(obs)
    assert env.action_space.contains(action)
    env.step(action)
    env.close()
    batch = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    actions = policy.act(batch)
    assert actions.shape == (64,) and set(actions.tolist()) <= {0, 1}
    assert [policy.act(o) for o in batch] == actions.tolist()
    torch_actions = zmqrl.load_policy(run_dir, checkpoint="best", backend="torch").act(batch)
    assert (torch_actions == actions).mean() >= 0.98  # numpy and torch forwards agree (bar float ties)
    with pytest.raises(ValueError, match=r"observation shape \(3,\)"):
        policy.act(np.zeros(3))


def test_load_policy_of_each_checkpoint_differs_where_training_changed_it(trained: tuple[Path, dict]) -> None:
    run_dir, _ = trained
    batch = np.random.default_rng(1).normal(size=(256, 4)).astype(np.float32)
    first = zmqrl.load_policy(run_dir, checkpoint=100)
    last = zmqrl.load_policy(run_dir, checkpoint="latest")
    assert first.state["opt_steps"] == 100 and last.state["opt_steps"] == 200
    q_first, q_last = first.policy.q_values(batch), last.policy.q_values(batch)  # type: ignore[attr-defined]
    assert not np.allclose(q_first, q_last)


def test_load_policy_errors_name_the_path(trained: tuple[Path, dict], tmp_path: Path) -> None:
    run_dir, _ = trained
    with pytest.raises(ConfigError, match=f"{tmp_path}: not a run directory"):
        zmqrl.load_policy(tmp_path)
    with pytest.raises(CheckpointError, match="checkpoints/7: no such checkpoint"):
        zmqrl.load_policy(run_dir, checkpoint=7)


@pytest.mark.slow
def test_run_local_returns_the_learners_summary(tmp_path: Path) -> None:
    cfg = zmqrl.load_config(CARTPOLE, overrides=[*SHORT, "trainer.min_samples_per_insert=0", "actor.n_buffer=32"])
    summary = zmqrl.run_local(cfg, actors=1, run_dir=tmp_path / "run")
    assert summary == json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["role"] == "learner" and summary["opt_steps"] >= 200
    assert summary["stop_reason"] == "reached max_opts=200"
    assert list(summary["actors"]) == ["actor-0"] and summary["transitions_inserted"] >= 100
    assert cfg.run.run_dir == str(tmp_path / "run") and cfg.actor.num_actors == 1
    assert (tmp_path / "run" / "checkpoints" / "latest" / "agent.pt").is_file()
