"""The acting loop with a recurrent policy: a state per env, reset at every episode's start, the state
before each act handed to the sequence adder, so every item carries the state its env held at its start;
with an asynchronous pool's rows (some envs per step, resets as rows of their own) too; its state saved
and restored exactly; greedy evaluation and ``TrainedPolicy`` acting with state.

The env here shows its step count and a tag drawn at each reset, so a test can rebuild every
observation of an episode from one of them, run the numpy LSTM over them from the zero state, and
compare the state it reaches with the one an item carries.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from zmqrl import config
from zmqrl.config import Config
from zmqrl.envs.evaluator import GreedyEvaluator, greedy_actions
from zmqrl.envs.stepper import Step
from zmqrl.run import checkpoint
from zmqrl.run.acting import ActingLoop, make_task

pytestmark = pytest.mark.timeout(120)

ENV_ID = "zmqrl-test/Counting-v0"
LONGEST = 23  # episodes end (terminated) after 1..LONGEST steps; env.max_episode_steps truncates some


class Counting(gym.Env[np.ndarray, np.int64]):
    """Observation ``[t, tag]``: the episode's step and a tag drawn at reset; reward = the action taken."""

    observation_space = gym.spaces.Box(-1e6, 1e6, shape=(2,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        self.tag = float(self.np_random.uniform(-1.0, 1.0))
        self.length = int(self.np_random.integers(1, LONGEST + 1))
        return self._obs(), {}

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.tag], dtype=np.float32)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return self._obs(), float(action), self.t >= self.length, False, {}


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=Counting)


def counting_cfg(*overrides: str) -> Config:
    return config.load(None, ["agent.algo=r2d2", f"env.id={ENV_ID}", "env.num_envs=3", "env.max_episode_steps=17",
                              "replay.burn_in=3", "replay.sequence_length=6", "replay.overlap=2", "agent.hidden=[8]",
                              "agent.lstm_size=5", "agent.head_hidden=0", "agent.batch_size=8", "trainer.warmup=8",
                              "agent.gamma=0.9", *overrides])


def state_after(policy: Any, steps: int, tag: float) -> np.ndarray:
    """The state ``(2, H)`` the policy reaches from its initial state over an episode's first ``steps``
    observations ``[0, tag] .. [steps - 1, tag]``."""
    state = policy.initial_state(1)
    for t in range(steps):
        _, state = policy.greedy_recurrent(np.array([[t, tag]], np.float32), state)
    return state[0]  # type: ignore[no-any-return]


def check_items(policy: Any, items: dict[str, np.ndarray]) -> int:
    """Every item's stored state is the one its env held before acting on its first real step; returns the
    items checked (those that start after their episode's first step among them)."""
    later = 0
    for i in range(len(items["mask"])):
        real = np.flatnonzero(items["mask"][i] == 1)
        t0, tag = items["obs"][i, real[0]]
        assert np.all(items["obs"][i, real, 1] == tag), "an item crosses episodes"
        np.testing.assert_array_equal(items["obs"][i, real, 0], t0 + np.arange(real.size))
        want = state_after(policy, int(t0), float(tag))
        np.testing.assert_allclose(items["state_h"][i], want[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(items["state_c"][i], want[1], rtol=1e-5, atol=1e-6)
        later += t0 > 0
    return later


def collect(loop: ActingLoop, steps: int) -> tuple[dict[str, np.ndarray], int]:
    parts, env_steps = [], 0
    for _ in range(steps):
        acted = loop.step()
        env_steps += acted.env_steps
        if acted.transitions is not None:
            parts.append(acted.transitions)
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}, env_steps


def test_items_carry_the_state_their_env_held_at_their_start() -> None:
    cfg = counting_cfg()
    task = make_task(cfg)
    policy = task.policy(seed=4, backend="numpy")
    loop = ActingLoop(cfg, policy, task.exploration(0), seed=9)
    assert loop.recurrent is policy and not loop.prioritises
    items, env_steps = collect(loop, 400)
    assert env_steps == 400 * 3
    assert check_items(policy, items) > 50  # most items start mid-episode, from a state that is not the initial one
    assert set(task.batch_spec()) == set(items)
    assert task.batch_problem(items) is None
    # items cover every env step once their episodes are over: period 4, so at least 1200 / 4 items made
    assert len(items["mask"]) >= env_steps // 4 - 3 * 6


class AsyncCounting:
    """An asynchronous pool's stepper over Counting envs (``zmqrl.envs.pool.PoolStepper``'s contract):
    ``batch`` of the envs are handed out per step, in an order drawn at random; an env whose episode ended
    is reset on its next step, returned as a row that is not ``valid`` (its action ignored)."""

    restorable = False

    def __init__(self, num_envs: int, batch: int, seed: int) -> None:
        self.envs = [gym.wrappers.TimeLimit(Counting(), 17) for _ in range(num_envs)]
        self.rng = np.random.default_rng(seed)
        self.batch = batch
        first = [env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)]
        self.ready: collections.deque[tuple[int, tuple[Any, ...]]] = collections.deque(
            (i, (first[i], 0.0, False, False, False)) for i in range(num_envs))
        self.resetting = np.zeros(num_envs, dtype=bool)
        self.obs_of = np.zeros((num_envs, 2), np.float32)
        self.action_of = np.zeros(num_envs, np.int64)
        handed = [self.ready.popleft() for _ in range(batch)]
        self.env_ids = np.array([i for i, _ in handed])
        self.obs = np.stack([r[0] for _, r in handed])

    def step(self, action: np.ndarray) -> Step:
        for env, a in zip(self.env_ids.tolist(), np.asarray(action).tolist(), strict=True):
            self.obs_of[env], self.action_of[env] = self.obs[list(self.env_ids).index(env)], a
            if self.resetting[env]:
                result: tuple[Any, ...] = (self.envs[env].reset()[0], 0.0, False, False, False)
                self.resetting[env] = False
            else:
                obs, reward, term, trunc, _ = self.envs[env].step(a)
                result = (obs, reward, term, trunc, True)
                self.resetting[env] = term or trunc
            self.ready.append((env, result))
        pending = list(self.ready)
        picked = sorted(self.rng.choice(len(pending), size=self.batch, replace=False), reverse=True)
        rows = [pending[i] for i in picked]
        for i in picked:
            del self.ready[i]
        ids = np.array([env for env, _ in rows])
        new_obs = np.stack([r[0] for _, r in rows]).astype(np.float32)
        self.env_ids, self.obs = ids, new_obs
        term = np.array([r[2] for _, r in rows])
        trunc = np.array([r[3] for _, r in rows])
        return Step(self.obs_of[ids].copy(), self.action_of[ids].copy(), np.array([r[1] for _, r in rows], np.float32),
                    new_obs, term, trunc, [], [], valid=np.array([r[4] for _, r in rows]), env_ids=ids)

    def state(self) -> tuple[dict[str, Any], list[str]]:
        return {}, ["the test's pool"]

    def close(self) -> None:
        pass


def test_asynchronous_rows_and_resets_keep_each_envs_state() -> None:
    cfg = counting_cfg("env.num_envs=5")
    task = make_task(cfg)
    policy = task.policy(seed=2, backend="numpy")
    loop = ActingLoop(cfg, policy, task.exploration(1), seed=0)
    loop.stepper.close()
    loop.stepper = AsyncCounting(5, batch=2, seed=0)  # type: ignore[assignment]
    items, env_steps = collect(loop, 900)
    assert env_steps < 900 * 2  # some rows were resets
    assert check_items(policy, items) > 50
    assert task.batch_problem(items) is None


def test_a_restored_loop_makes_the_same_items_as_one_never_stopped(tmp_path: Path) -> None:
    cfg = counting_cfg()
    task = make_task(cfg)

    def fresh() -> ActingLoop:
        return ActingLoop(cfg, task.policy(seed=4, backend="numpy"), task.exploration(None), seed=9)

    whole, stopped = fresh(), fresh()
    collect(whole, 37)
    collect(stopped, 37)
    stopped.snapshot()(tmp_path / "env_state.npz")
    saved = checkpoint.read_tree(tmp_path / "env_state.npz")
    assert saved["recurrent"]["states"].shape == (3, 2, 5) and np.any(saved["recurrent"]["states"] != 0)
    resumed = fresh()
    resumed.policy.rng.bit_generator.state = stopped.policy.rng.bit_generator.state  # type: ignore[attr-defined]
    assert resumed.restore(tmp_path / "env_state.npz", stopped.env_steps) == []
    np.testing.assert_array_equal(resumed.states, stopped.states)
    a, _ = collect(whole, 60)
    b, _ = collect(resumed, 60)
    assert set(a) == set(b)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_evaluation_and_trained_policies_act_from_the_initial_state_and_keep_it() -> None:
    """A policy that presses 1 only while its state has counted the episode's steps exactly: a state
    never reset, or not carried, loses reward."""

    class Counter:
        def initial_state(self, n: int) -> np.ndarray:
            return np.zeros((n, 2, 1), np.float32)

        def act_recurrent(self, obs: np.ndarray, explore: Any, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            raise AssertionError("evaluation acts greedily")

        def greedy_recurrent(self, obs: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            right = state[:, 0, 0] == obs[:, 0]
            return right.astype(np.int64), state + 1

        def greedy(self, obs: np.ndarray) -> np.ndarray:
            raise TypeError("recurrent")

    evaluator = GreedyEvaluator(counting_cfg().env, episodes=4, seed=3)
    for _ in range(2):  # each evaluation starts from the initial state again
        returns, lengths = evaluator.play(Counter())
        assert returns == lengths and sum(lengths) > 4
    act = greedy_actions(Counter())
    obs = np.array([[0, 0.5], [0, 0.1]], np.float32)
    assert act(obs).tolist() == [1, 1] and act(obs).tolist() == [0, 0]  # the second call sees the state moved on
