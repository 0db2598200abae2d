"""Rewards at any scale (:mod:`zmqrl.run.rewards`): the learner's factor, measured once from the rewards stored
in warm-up (``env.reward_scale: auto``) or fixed, applied to every sampled batch and never to what is stored,
saved with checkpoints, sent to actors with control; a warning naming the keys where a fixed factor leaves the
rewards far from the scale the config assumes; and a shipped config that learns at ×100 as it does at ×1."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from zmqrl import config
from zmqrl.bench.reward_wrappers import SCALES
from zmqrl.config import ConfigError, EnvConfig
from zmqrl.replay import make_replay
from zmqrl.run.checkpoint import CheckpointError
from zmqrl.run.rewards import CONTROL_KEY, RewardScale, control_factor
from zmqrl.run.train import train

REPO = Path(__file__).resolve().parents[2]
CARTPOLE = REPO / "configs" / "cartpole_dqn.yaml"


def stored(rewards: np.ndarray, mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
    batch = {"reward": rewards.astype(np.float32), "obs": np.zeros((len(rewards), 4), np.float32)}
    if mask is not None:
        batch["mask"] = mask.astype(np.float32)
    return batch


def measured(scale: float, rewards: np.ndarray, **env: object) -> RewardScale:
    rs = RewardScale(EnvConfig(reward_scale="auto", reward_rms=2.0, **env))  # type: ignore[arg-type]
    rs.observe(stored(rewards * scale))
    assert rs.settle()
    return rs


def test_auto_brings_every_scale_of_the_same_rewards_to_the_same_numbers() -> None:
    rewards = np.random.default_rng(0).normal(0.3, 1.5, size=500)
    scaled = {s: measured(s, rewards) for s in (0.01, 1.0, 100.0)}
    for s, rs in scaled.items():
        batch = rs.scale(stored(rewards * s))
        np.testing.assert_allclose(batch["reward"], scaled[1.0].scale(stored(rewards))["reward"], rtol=1e-5)
        assert math.sqrt(np.mean(np.square(batch["reward"], dtype=np.float64))) == pytest.approx(2.0, rel=1e-5)
    assert scaled[0.01].factor == pytest.approx(100 * scaled[1.0].factor, rel=1e-5)


def test_scaling_a_batch_never_touches_the_stored_arrays() -> None:
    rs = measured(1.0, np.full(64, 4.0))  # factor 0.5
    batch = stored(np.full(8, 4.0))
    out = rs.scale(batch)
    np.testing.assert_array_equal(out["reward"], np.full(8, 2.0))
    np.testing.assert_array_equal(batch["reward"], np.full(8, 4.0))  # an on-policy store hands these out again
    assert out["obs"] is batch["obs"]
    fixed = RewardScale(EnvConfig(reward_scale=1.0))
    assert fixed.scale(batch) is batch  # factor 1: nothing copied


def test_padding_is_not_measured_and_a_reward_free_warm_up_waits() -> None:
    rs = RewardScale(EnvConfig(reward_scale="auto", reward_rms=1.0))
    rs.observe(stored(np.zeros(100)))
    assert not rs.settle() and rs.factor == 1.0 and rs.settle_due  # no reward paid yet: values are 0 at any scale
    rs.observe(stored(np.array([[3.0, 3.0, 50.0, 50.0]]), mask=np.array([[1, 1, 0, 0]])))
    assert rs.settle() and not rs.settle_due
    assert rs.measured_rms == pytest.approx(math.sqrt(18 / 102))  # the masked 50s are padding
    rs.observe(stored(np.full(10, 1e6)))  # measured once: later rewards do not move the factor
    assert rs.factor == pytest.approx(1 / math.sqrt(18 / 102))


def test_warm_up_priorities_are_levelled_so_every_scale_starts_alike() -> None:
    """Actors sent warm-up priorities at the env's scale (they did not know the factor): after the measurement
    every stored item has the same priority, so a task paid x100 samples as one paid x1 does."""
    leaves = {}
    for scale in (1.0, 100.0):
        replay = make_replay(256, prioritized=True, seed=3)
        rewards = np.random.default_rng(1).normal(1.0, 0.5, size=200)
        batch = {"obs": np.zeros((200, 4), np.float32), "reward": (rewards * scale).astype(np.float32)}
        replay.add(batch, priorities=np.abs(batch["reward"]) + np.arange(200) * scale)
        rs = RewardScale(EnvConfig(reward_scale="auto", reward_rms=2.0))
        rs.observe(batch)
        before = replay.tree.get(np.arange(200))
        assert rs.settle()
        rs.level_priorities(replay)
        leaves[scale] = replay.tree.get(np.arange(200))
        assert before.max() > 10 * before.min() and np.ptp(leaves[scale]) == 0.0
    np.testing.assert_array_equal(leaves[1.0], leaves[100.0])
    fixed = make_replay(16, prioritized=True, seed=3)
    fixed.add({"obs": np.zeros((4, 4), np.float32), "reward": np.ones(4, np.float32)}, priorities=np.arange(1.0, 5.0))
    kept = fixed.tree.get(np.arange(4))
    RewardScale(EnvConfig(reward_scale=0.5, reward_rms=2.0)).level_priorities(fixed)  # a fixed factor: left alone
    np.testing.assert_array_equal(fixed.tree.get(np.arange(4)), kept)


def test_a_fixed_factor_far_from_the_configs_scale_warns_naming_the_keys(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="zmqrl")
    near = RewardScale(EnvConfig(reward_scale=1.0, reward_rms=2.87))
    near.observe(stored(np.full(100, 2.5)))
    assert near.settle("learner: ") and near.factor == 1.0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # positive control: 2.5 is near 2.87
    far = RewardScale(EnvConfig(reward_scale=1.0, reward_rms=2.87))
    far.observe(stored(np.full(100, 0.025)))
    assert far.settle("learner: ") and far.factor == 1.0  # warned, not changed
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("learner: ")
    assert "env.reward_rms" in warnings[0] and "env.reward_scale: auto" in warnings[0] and "115" in warnings[0]


def test_the_factor_survives_a_checkpoint_and_a_bad_one_is_refused() -> None:
    rs = measured(100.0, np.ones(50))
    again = RewardScale(EnvConfig(reward_scale="auto", reward_rms=2.0))
    again.load_state_dict(json.loads(json.dumps(rs.state_dict())), "state.json")
    assert again.factor == rs.factor and not again.settle_due
    again.observe(stored(np.ones(10)))
    assert not again.settle() and again.factor == rs.factor  # a resumed run does not measure again
    for bad in ({"factor": -1.0}, {"factor": "x"}, {}, {"factor": float("nan")}):
        with pytest.raises(ValueError, match="state.json"):
            RewardScale(EnvConfig(reward_scale="auto")).load_state_dict(bad, "state.json")


def test_control_names_the_factor_and_a_bad_one_means_none() -> None:
    assert control_factor({CONTROL_KEY: 0.01}) == 0.01
    for bad in (None, "2", True, float("inf"), -1.0, 0.0, 1e12):
        assert control_factor({CONTROL_KEY: bad}) == 1.0
    assert control_factor({}) == 1.0


@pytest.mark.parametrize(("override", "key"), [("env.reward_scale=loud", "env.reward_scale"),
                                              ("env.reward_scale=0", "env.reward_scale"),
                                              ("env.reward_scale=.inf", "env.reward_scale"),
                                              ("env.reward_rms=-2", "env.reward_rms")])
def test_bad_reward_keys_are_refused_by_name(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        config.load(CARTPOLE, [override])


def test_train_measures_the_factor_once_and_a_resume_keeps_it(tmp_path: Path) -> None:
    """A run on CartPole paid x100: the factor is about 1/100 of the unscaled run's; the checkpoint carries it;
    a resume keeps it; a checkpoint with a bad one is refused, naming it."""
    short = ["trainer.warmup=200", "trainer.max_opts=60", "trainer.stop_return=null", "trainer.eval_interval=1000",
             "trainer.save_interval=30", "replay.capacity=2000", "env.max_episode_steps=100"]
    plain = train(config.load(CARTPOLE, short), tmp_path / "x1")
    scaled_cfg = config.load(CARTPOLE, [*short, f"env.wrappers=[{SCALES[100.0]}]"])
    scaled = train(scaled_cfg, tmp_path / "x100")
    assert plain["reward_scale"] == pytest.approx(1.0, rel=0.05)
    assert scaled["reward_scale"] == pytest.approx(plain["reward_scale"] / 100, rel=1e-4)
    state = json.loads((tmp_path / "x100" / "checkpoints" / "latest" / "state.json").read_text())
    assert state["reward_scale"]["factor"] == scaled["reward_scale"]
    resumed = train(config.load(CARTPOLE, [*short, f"env.wrappers=[{SCALES[100.0]}]", "trainer.max_opts=90"]),
                    tmp_path / "x100", resume=True)
    assert resumed["reward_scale"] == scaled["reward_scale"] and resumed["opt_steps"] == 90
    latest = tmp_path / "x100" / "checkpoints" / "latest" / "state.json"
    state = json.loads(latest.read_text())
    state["reward_scale"]["factor"] = -3
    latest.write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match="reward_scale"):
        train(scaled_cfg, tmp_path / "x100", resume=True)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("scale", [0.01, 100.0])
def test_the_shipped_cartpole_config_learns_at_another_reward_scale(scale: float, tmp_path: Path) -> None:
    """cartpole_dqn.yaml on CartPole paid x0.01 and x100 solves (greedy 475 on the game's scale) as the
    unscaled run does; the same rewards with env.reward_scale 1 are the issue this fixes (not run here)."""
    cfg = config.load(CARTPOLE, ["run.seed=0", f"env.wrappers=[{SCALES[scale]}]",
                                 f"trainer.stop_return={475 * scale!r}", "trainer.max_opts=30000"])
    summary = train(cfg, tmp_path / "run")
    assert summary["solved"], summary.get("best_eval")
    assert summary["reward_scale"] * summary["reward_rms_measured"] == pytest.approx(2.87, rel=1e-6)
