"""Atari through ale-py (real ROMs shipped with the package) and the Catch image task."""

from __future__ import annotations

import numpy as np
import pytest

from zmqrl.config import ConfigError, EnvConfig
from zmqrl.envs.atari import AtariFrames, EpisodicLife, GameStats, resize_area
from zmqrl.envs.catch import Catch
from zmqrl.envs.evaluator import GreedyEvaluator
from zmqrl.envs.factory import make_env, make_vector_env
from zmqrl.envs.stepper import VectorStepper

pytest.importorskip("ale_py")

INVADERS = EnvConfig(id="ALE/SpaceInvaders-v5", kwargs={"frameskip": 1, "repeat_action_probability": 0.0},
                     wrappers=["atari"], frame_stack=4, backend="gymnasium")


def _layers(env):  # type: ignore[no-untyped-def]
    out = [env]
    while hasattr(out[-1], "env"):
        out.append(out[-1].env)
    return out


def _area_reference(src: int, dst: int) -> np.ndarray:
    """Area weights by brute force: how much of input pixel j output pixel i covers."""
    scale, weights = src / dst, np.zeros((dst, src))
    for i in range(dst):
        lo, hi = i * scale, (i + 1) * scale
        for j in range(src):
            weights[i, j] = max(0.0, min(hi, j + 1) - max(lo, j))
    return weights / weights.sum(axis=1, keepdims=True)


def test_resize_area_averages_what_each_output_pixel_covers() -> None:
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (210, 160), dtype=np.uint8)
    want = _area_reference(210, 84) @ frame.astype(np.float64) @ _area_reference(160, 84).T
    got = resize_area(frame, 84)
    assert got.shape == (84, 84) and got.dtype == np.uint8
    assert np.abs(got.astype(np.float64) - want).max() <= 0.5 + 1e-3  # rounding only
    blocks = rng.integers(0, 256, (168, 168), dtype=np.uint8)  # an integer factor: plain 2x2 block means
    assert np.array_equal(resize_area(blocks, 84), np.rint(blocks.reshape(84, 2, 84, 2).mean(axis=(1, 3))))
    assert np.all(resize_area(np.full((210, 160), 77, np.uint8), 84) == 77)


def test_atari_chain_gives_stacked_uint8_frames_and_training_only_wrappers() -> None:
    train, evaluate = make_env(INVADERS), make_env(INVADERS, training=False)
    try:
        obs, _ = train.reset(seed=1)
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8 and train.observation_space.shape == (4, 84, 84)
        names = [type(layer).__name__ for layer in _layers(train)]
        assert names[:5] == ["FrameStackObservation", "TransformReward", "EpisodicLife", "GameStats", "AtariFrames"]
        eval_names = [type(layer).__name__ for layer in _layers(evaluate)]
        assert "EpisodicLife" not in eval_names and "TransformReward" not in eval_names and "GameStats" in eval_names
    finally:
        train.close()
        evaluate.close()


def test_atari_wrapper_refuses_an_env_that_skips_frames_itself() -> None:
    with pytest.raises(ConfigError, match="frameskip: 1"):
        make_env(EnvConfig(id="ALE/Pong-v5", wrappers=["atari"], backend="gymnasium"))


def test_frame_skip_max_pools_the_last_two_frames() -> None:
    env = AtariFrames(make_env(EnvConfig(id="ALE/Pong-v5", kwargs={"frameskip": 1})), noop_max=0)
    try:
        env.reset(seed=0)
        moved = 0
        for _ in range(100):
            obs, *_ = env.step(0)
            assert np.array_equal(obs, resize_area(np.maximum(env.frames[0], env.frames[1]), 84))
            moved += not np.array_equal(env.frames[0], env.frames[1])
        assert moved > 50  # the ball and paddles move between the last two frames of a step
    finally:
        env.close()


def test_a_lost_life_ends_the_episode_not_the_game_and_games_are_scored_unclipped() -> None:
    """SpaceInvaders: 3 lives, aliens worth 5-30 points. Training episodes end at each lost life
    with rewards clipped to 1; the game goes on across them, and its return is the sum of the
    game's own points (what evaluation scores)."""
    env = make_env(INVADERS)
    rng = np.random.default_rng(0)
    try:
        env.reset(seed=3)
        stats = next(layer for layer in _layers(env) if isinstance(layer, GameStats))
        life = next(layer for layer in _layers(env) if isinstance(layer, EpisodicLife))
        episodes, clipped, games = 0, [], []
        for _ in range(20_000):
            _, reward, terminated, truncated, info = env.step(int(rng.integers(6)))
            clipped.append(float(reward))
            if terminated or truncated:
                episodes += 1
                if "game_return" in info:
                    games.append((info["game_return"], episodes))
                    if len(games) == 2:
                        break
                lives_before = stats.env.unwrapped.ale.lives()
                env.reset()
                if "game_return" not in info:  # the same game goes on: no life came back
                    assert stats.env.unwrapped.ale.lives() == lives_before == life.lives
        assert len(games) == 2, "two random games of SpaceInvaders end within 20,000 steps"
        assert set(clipped) <= {-1.0, 0.0, 1.0} and 1.0 in clipped
        assert games[0][1] == 3 and games[1][1] == 6  # three lives, three episodes per game
        assert games[0][0] > sum(1 for r in clipped if r > 0) / 2  # points, not clipped counts
    finally:
        env.close()


@pytest.mark.slow
def test_vector_stepper_and_evaluation_report_whole_games() -> None:
    stepper = VectorStepper(make_vector_env(INVADERS, 2, seed=5), seed=5)
    rng = np.random.default_rng(1)
    try:
        assert stepper.games
        returns: list[float] = []
        lengths: list[int] = []
        terminals = 0
        for _ in range(6000):
            step = stepper.step(rng.integers(6, size=2))
            terminals += int(step.terminated.sum())
            returns += step.episode_returns
            lengths += step.episode_lengths
            if len(returns) >= 2:
                break
        assert len(returns) >= 2 and terminals >= 3 * len(returns)  # lives ended episodes; games were reported
        assert all(r >= 5 and r % 5 == 0 for r in returns), returns  # the game's own points
        assert all(n > 50 for n in lengths), lengths
    finally:
        stepper.close()
    scores, lengths = GreedyEvaluator(INVADERS, 2, seed=0).run(lambda obs: rng.integers(6, size=len(obs)))
    assert len(scores) == 2 and all(s % 5 == 0 and s >= 5 for s in scores) and min(lengths) > 50


def test_catch_rewards_the_ball_caught() -> None:
    env = make_env(EnvConfig(id="zmqrl/Catch-v0"))
    try:
        assert env.observation_space.shape == (1, 84, 84) and env.action_space.n == 3
        rng = np.random.default_rng(0)
        perfect, random_ = [], []
        for episode in range(60):
            obs, _ = env.reset(seed=episode)
            done, total, steps = False, 0.0, 0
            while not done:
                if episode % 2:
                    ball = int(np.argmax(obs[0, :72].max(axis=0))) // 12  # column of the ball
                    paddle = int(np.argmax(obs[0, 72:].max(axis=0))) // 12
                    action = 1 + int(np.sign(ball - paddle))
                else:
                    action = int(rng.integers(3))
                obs, reward, done, truncated, _ = env.step(action)
                total += float(reward)
                steps += 1
                assert obs.dtype == np.uint8 and not truncated
            assert steps == 6
            (perfect if episode % 2 else random_).append(total)
        assert perfect == [1.0] * 30
        assert np.mean(random_) < 0.0
    finally:
        env.close()
    assert isinstance(env.unwrapped, Catch)


@pytest.mark.slow
def test_an_atari_vector_resumes_exactly_from_its_saved_state(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The emulator's state (and its RNG: sticky actions) is saved with the rest of the env state,
    through the checkpoint's plain-data file; a fresh vector given it steps exactly as the original."""
    from zmqrl.envs.state import capture_vector, plan_restore_vector
    from zmqrl.run.checkpoint import read_tree, write_tree

    sticky = EnvConfig(id="ALE/SpaceInvaders-v5", kwargs={"frameskip": 1, "repeat_action_probability": 0.25},
                       backend="gymnasium",
                       wrappers=["atari"], frame_stack=4)
    rng = np.random.default_rng(0)
    original = make_vector_env(sticky, 2, seed=1)
    original.reset(seed=[1, 2])
    for _ in range(200):
        original.step(rng.integers(6, size=2))
    saved, missed = capture_vector(original)
    assert missed == []  # the emulator used to be named here: AtariEnv.ale (ALEInterface)
    write_tree(tmp_path / "env_state.npz", saved)
    fresh = make_vector_env(sticky, 2, seed=99)
    fresh.reset(seed=[7, 8])
    for step in plan_restore_vector(fresh, read_tree(tmp_path / "env_state.npz")):
        step()
    actions = rng.integers(6, size=(400, 2))
    a = [original.step(x) for x in actions]
    b = [fresh.step(x) for x in actions]
    for (obs_a, rew_a, term_a, trunc_a, _), (obs_b, rew_b, term_b, trunc_b, _) in zip(a, b, strict=True):
        np.testing.assert_array_equal(obs_a, obs_b)
        assert (rew_a == rew_b).all() and (term_a == term_b).all() and (trunc_a == trunc_b).all()
    # the positive control: without the restore the same actions give other frames
    other = make_vector_env(sticky, 2, seed=99)
    other.reset(seed=[7, 8])
    assert any(not np.array_equal(other.step(x)[0], step[0]) for x, step in zip(actions[:50], a, strict=True))


def test_a_damaged_emulator_state_is_refused_naming_where() -> None:
    from zmqrl.envs.state import capture_vector, plan_restore_vector

    vec = make_vector_env(INVADERS, 1, seed=0)
    vec.reset(seed=[0])
    saved, _ = capture_vector(vec)
    for layer in saved["envs"][0]:
        if "ale" in layer["attrs"]:
            layer["attrs"]["ale"]["value"] = np.zeros(10, np.uint8)
    with pytest.raises(ValueError, match=r"sub-env 0 AtariEnv.*emulator state"):
        plan_restore_vector(vec, saved)
