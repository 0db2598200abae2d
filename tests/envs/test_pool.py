"""Atari through EnvPool (``env.backend: envpool``), held to the gymnasium chain of zmqrl.envs.atari."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from zmqrl.config import ConfigError, EnvConfig
from zmqrl.envs import atari, pool
from zmqrl.envs.evaluator import GreedyEvaluator
from zmqrl.envs.factory import make_env, make_stepper
from zmqrl.envs.stepper import VectorStepper
from zmqrl.run.adders import NStepBuilder

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

pytest.importorskip("ale_py")
pytest.importorskip("envpool")


def _config(game: str, backend: str = "envpool", sticky: float = 0.0) -> EnvConfig:
    return EnvConfig(id=f"ALE/{game}-v5", kwargs={"frameskip": 1, "repeat_action_probability": sticky},
                     wrappers=["atari"], frame_stack=4, backend=backend)


def _gymnasium_chain(game: str) -> gym.Env:
    """The evaluation chain with exactly one no-op frame at reset (EnvPool's fewest)."""
    atari.register()
    env = gym.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=0.0)
    return gym.wrappers.FrameStackObservation(atari.GameStats(atari.AtariFrames(env, noop_max=1)), 4)


@pytest.mark.parametrize("game, steps", [("Pong", 1200), ("Seaquest", 1000)])
@pytest.mark.slow
def test_both_backends_give_the_same_game_for_the_same_actions(game: str, steps: int) -> None:
    """Sticky actions and random no-ops off: the same rewards and terminals step by step, frames
    within one grey level (EnvPool resizes with OpenCV, the chain with its own area average)."""
    chain = _gymnasium_chain(game)
    envpool_env = pool.make_pool(_config(game), [0], training=False, noop_max=1)
    expected, _ = chain.reset(seed=0)
    got, _ = envpool_env.reset()
    assert got.shape == (1, *expected.shape) and got.dtype == expected.dtype == np.uint8
    rng = np.random.default_rng(1)
    worst, rewards, nonzero = 0, 0.0, 0
    for t in range(steps):
        action = int(rng.integers(chain.action_space.n))
        expected, reward, terminated, truncated, _ = chain.step(action)
        got, pool_reward, pool_terminated, pool_truncated, info = envpool_env.step(np.array([action]))
        assert (reward, terminated, truncated) == (pool_reward[0], pool_terminated[0], pool_truncated[0]), t
        assert info["reward"][0] == reward
        worst = max(worst, int(np.abs(expected.astype(np.int16) - got[0].astype(np.int16)).max()))
        rewards += float(reward)
        nonzero += reward != 0
        if terminated or truncated:
            break
    chain.close()
    envpool_env.close()
    assert worst <= 1
    assert nonzero >= 2, "the comparison should cover scoring, not only an idle screen"


def test_auto_picks_envpool_for_atari_and_gymnasium_otherwise() -> None:
    assert pool.uses_pool(_config("Pong", backend="auto"))
    assert not pool.uses_pool(_config("Pong", backend="gymnasium"))
    assert not pool.uses_pool(EnvConfig(id="CartPole-v1", backend="auto"))
    framestack = EnvConfig(id="ALE/Pong-v5", kwargs={"frameskip": 1}, wrappers=["atari", "frame_stack"])
    assert not pool.uses_pool(framestack)  # a chain EnvPool cannot run stays gymnasium's
    with pytest.raises(ConfigError, match="env.backend: envpool runs Atari ids"):
        pool.uses_pool(EnvConfig(id="CartPole-v1", backend="envpool"))
    with pytest.raises(ConfigError, match="env.kwargs: 'obs_type'"):
        pool.pool_options(EnvConfig(id="ALE/Pong-v5", kwargs={"frameskip": 1, "obs_type": "rgb"},
                                    wrappers=["atari"], backend="envpool"), training=True)
    with pytest.raises(ConfigError, match="frameskip: 1"):
        pool.pool_options(EnvConfig(id="ALE/Pong-v5", kwargs={"frameskip": 4}, wrappers=["atari"],
                                    backend="envpool"), training=True)


def test_sticky_actions_follow_the_env_version() -> None:
    ale_task, ale_sticky = pool.pool_options(EnvConfig(id="ALE/Seaquest-v5", wrappers=["atari"]), training=True)
    v4_task, v4_sticky = pool.pool_options(EnvConfig(id="SeaquestNoFrameskip-v4", wrappers=["atari"]), training=True)
    assert ale_task == v4_task == "Seaquest-v5"
    assert ale_sticky["repeat_action_probability"] == 0.25 and v4_sticky["repeat_action_probability"] == 0.0
    assert ale_sticky["episodic_life"] and ale_sticky["reward_clip"]
    _, evaluation = pool.pool_options(EnvConfig(id="ALE/Seaquest-v5", wrappers=["atari"]), training=False)
    assert not evaluation["episodic_life"] and not evaluation["reward_clip"]


def test_spaces_are_those_of_the_gymnasium_chain() -> None:
    """A model trained on one backend plays on the other."""
    envpool_env = make_env(_config("Pong"), training=False)
    chain = make_env(_config("Pong", backend="gymnasium"), training=False)
    assert isinstance(envpool_env, pool.PoolEnv)
    assert envpool_env.observation_space == chain.observation_space
    assert envpool_env.action_space == chain.action_space
    envpool_env.close()
    chain.close()


def test_a_lost_life_ends_the_episode_the_next_row_is_a_reset_and_games_are_scored_unclipped() -> None:
    """Training view on Breakout (5 lives): every lost life is a terminal the learner sees; the
    env's next row took no step (``valid`` false) and is the next life's first observation; the
    game's own score comes out once, when the game is over, unclipped."""
    stepper = make_stepper(_config("Breakout"), 2, seed=3)
    assert isinstance(stepper, pool.PoolStepper) and stepper.games
    rng = np.random.default_rng(0)
    terminals, invalid_after_terminal, clipped, games = 0, 0, 0.0, []
    was_done = np.zeros(2, dtype=bool)
    for _ in range(3000):
        step = stepper.step(rng.integers(0, 4, 2))
        assert step.valid is not None
        assert np.array_equal(step.valid, ~was_done)
        invalid_after_terminal += int((~step.valid).sum())
        assert not (step.terminated & ~step.valid).any() and np.all(step.reward[~step.valid] == 0)
        assert set(np.unique(step.reward)) <= {-1.0, 0.0, 1.0}
        terminals += int(step.terminated.sum())
        clipped += float(step.reward.sum())
        games += step.episode_returns
        was_done = step.terminated | step.truncated
        if len(games) >= 2:
            break
    stepper.close()
    assert len(games) >= 2
    assert terminals >= 5 * len(games)  # five lives a game: one terminal each, not one per game
    assert invalid_after_terminal >= terminals - 2


def test_nstep_builder_skips_rows_of_envs_that_were_resetting() -> None:
    builder = NStepBuilder(2, 2, 0.5)
    obs = np.arange(2, dtype=np.float32)[:, None]
    step = dict(action=np.zeros(2, np.int64), reward=np.ones(2), next_obs=obs + 10,
                terminated=np.array([True, False]), truncated=np.zeros(2, bool))
    out = builder.push(obs, **step)
    assert out is not None and len(out["reward"]) == 1  # env 0 ended after one step
    skipped = builder.push(obs + 20, np.zeros(2, np.int64), np.array([7.0, 1.0]), obs + 30,
                           np.array([True, False]), np.zeros(2, bool), valid=np.array([False, True]))
    assert skipped is not None and len(skipped["reward"]) == 1  # env 1's first 2-step transition only
    assert skipped["reward"][0] == pytest.approx(1.5) and skipped["obs"][0, 0] == 1.0
    assert builder.pending.tolist() == [0, 2]
    with pytest.raises(ValueError, match="pending steps skipped"):
        builder.push(obs, np.zeros(2, np.int64), np.ones(2), obs, np.zeros(2, bool), np.zeros(2, bool),
                     valid=np.array([True, False]))


@pytest.mark.slow
def test_acting_counts_only_the_env_steps_taken_and_evaluation_plays_whole_games(tmp_path: Path) -> None:
    from zmqrl.config import load
    from zmqrl.run.acting import ActingLoop, make_task

    cfg = load(CONFIGS / "pong_dqn.yaml", ["env.id=ALE/Breakout-v5", "env.backend=envpool", "env.num_envs=2"])
    task = make_task(cfg)
    loop = ActingLoop(cfg, task.policy(0, backend="torch"), task.exploration(0), seed=0, priorities=True)
    taken, rows, transitions = 0, 0, 0
    while loop.env_steps < 1500:
        acted = loop.step()
        taken += acted.env_steps
        rows += loop.num_envs
        if acted.transitions is not None:
            transitions += len(acted.transitions["reward"])
            assert np.all(np.isfinite(acted.transitions["priority"]))
    assert loop.env_steps == taken < rows  # resetting rows are not env steps
    assert taken - 2 * cfg.agent.n_step <= transitions <= taken
    assert loop.stepper.restorable is False
    loop.snapshot()(tmp_path / "state.npz")
    resumed = ActingLoop(cfg, task.policy(0, backend="torch"), task.exploration(0), seed=1, priorities=True)
    why = resumed.restore(tmp_path / "state.npz", loop.env_steps)
    assert resumed.env_steps == loop.env_steps and why and "EnvPool" in why[0]  # new episodes, said so
    assert resumed.nstep.pending.sum() == 0
    resumed.close()
    loop.close()

    evaluator = GreedyEvaluator(cfg.env, 2, seed=5, epsilon=1.0)
    returns, lengths = evaluator.run(lambda obs: np.zeros(len(obs), dtype=np.int64))
    again, lengths_again = evaluator.run(lambda obs: np.zeros(len(obs), dtype=np.int64))
    evaluator.close()
    assert all(length > 100 for length in lengths)  # whole games of five lives, not one life
    assert lengths != lengths_again  # fresh seeds each call


def test_the_gymnasium_stepper_is_unchanged_for_other_envs() -> None:
    stepper = make_stepper(EnvConfig(id="CartPole-v1"), 2, seed=0)
    assert isinstance(stepper, VectorStepper) and stepper.restorable
    assert stepper.step(np.zeros(2, dtype=np.int64)).valid is None
    stepper.close()


@pytest.mark.parametrize("batch", [0, 3])
@pytest.mark.slow
def test_acting_in_batches_of_ready_envs_keeps_each_envs_transitions_its_own(batch: int) -> None:
    """env.batch: the policy acts for whichever envs the pool hands out. With 1-step transitions
    every next_obs is its obs's stack shifted by one frame (rows of different envs mixed up would
    not be), every env step gives one transition, and the priorities built from the acting values
    are those a fresh forward pass gives (the bootstrap values came from the right env)."""
    from zmqrl.config import load
    from zmqrl.run.acting import ActingLoop, make_task

    cfg = load(CONFIGS / "pong_dqn.yaml", ["env.id=ALE/Breakout-v5", "env.backend=envpool", "env.num_envs=6",
                                           f"env.batch={batch}", "agent.n_step=1", "actor.eps_per_env=true",
                                           "actor.eps=1.0", "actor.eps_decay_steps=0"])  # random: lives get lost
    task = make_task(cfg)
    policy = task.policy(0, backend="torch")
    loop = ActingLoop(cfg, policy, task.exploration(1), seed=0, priorities=True)
    assert (loop.stepper.env_ids is None) == (batch == 0)
    parts, seen = [], set()
    while loop.env_steps < 1200:
        if loop.stepper.env_ids is not None:
            assert len(loop.stepper.env_ids) == batch
            seen.update(loop.stepper.env_ids.tolist())
        acted = loop.step()
        if acted.transitions is not None:
            parts.append(acted.transitions)
    loop.close()
    got = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    assert batch == 0 or seen == set(range(6))
    assert loop.env_steps - 6 <= len(got["reward"]) <= loop.env_steps
    np.testing.assert_array_equal(got["next_obs"][:, :3], got["obs"][:, 1:])
    assert (got["discount"] == 0).sum() >= 5  # lost lives: terminals seen
    fresh = policy.priorities({k: v for k, v in got.items() if k != "priority"})
    np.testing.assert_allclose(got["priority"], fresh, rtol=1e-4, atol=1e-5)
