"""Tests for NStepBuilder against hand-computed and brute-force references."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zmqrl.run.adders import NStepBuilder

KEYS = ("obs", "action", "reward", "next_obs", "discount")


@dataclass
class Episode:
    """One env's episode: per-step obs, action, reward, next_obs, and how it ended."""

    obs: list[np.ndarray] = field(default_factory=list)
    action: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    next_obs: list[np.ndarray] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False


def simulate(
    num_envs: int, n: int, gamma: float, steps: int, flags: np.ndarray, rewards: np.ndarray,
    subsets: np.random.Generator | None = None,
) -> tuple[list[dict[str, np.ndarray]], list[Episode]]:
    """Drive the builder; ``flags[t, e]`` is 0 (continue), 1 (terminate), 2 (truncate).

    Observations are (env, episode, step) triples so every one is unique; actions
    are a global step id. Returns the emitted batches and all episodes. With ``subsets``, each
    push brings a random non-empty subset of the envs in random order (``env_ids``), as an
    asynchronous pool does.
    """
    builder = NStepBuilder(num_envs, n, gamma)
    episode_no = np.zeros(num_envs, dtype=np.int64)
    t_in_ep = np.zeros(num_envs, dtype=np.int64)
    current = [Episode() for _ in range(num_envs)]
    episodes: list[Episode] = []
    out = []
    for t in range(steps):
        envs = np.arange(num_envs)
        if subsets is not None:
            envs = subsets.permutation(num_envs)[: int(subsets.integers(1, num_envs + 1))]
        obs = np.stack([envs, episode_no[envs], t_in_ep[envs]], axis=1).astype(np.float32)
        next_obs = np.stack([envs, episode_no[envs], t_in_ep[envs] + 1], axis=1).astype(np.float32)
        action = t * num_envs + envs
        term, trunc = flags[t, envs] == 1, flags[t, envs] == 2
        if subsets is None:
            batch = builder.push(obs, action, rewards[t], next_obs, term, trunc)
        else:
            batch = builder.push(obs, action, rewards[t, envs], next_obs, term, trunc, env_ids=envs)
        if batch is not None:
            out.append(batch)
        for row, e in enumerate(envs):
            ep = current[e]
            ep.obs.append(obs[row])
            ep.action.append(int(action[row]))
            ep.reward.append(float(rewards[t, e]))
            ep.next_obs.append(next_obs[row])
            if term[row] or trunc[row]:
                ep.terminated, ep.truncated = bool(term[row]), bool(trunc[row])
                episodes.append(ep)
                current[e] = Episode()
                episode_no[e] += 1
                t_in_ep[e] = 0
            else:
                t_in_ep[e] += 1
    episodes.extend(current)
    return out, episodes


def reference(episodes: list[Episode], n: int, gamma: float) -> dict[str, np.ndarray]:
    """Expected transitions computed directly from complete trajectories."""
    rows: list[tuple] = []
    for ep in episodes:
        length = len(ep.reward)
        ended = ep.terminated or ep.truncated
        for t in range(length):
            k = min(n, length - t)
            if k < n and not ended:
                continue  # still pending when the simulation stopped
            ret = sum(gamma**i * ep.reward[t + i] for i in range(k))
            reaches_end = t + k == length
            discount = 0.0 if (ep.terminated and reaches_end) else gamma**k
            rows.append((ep.obs[t], ep.action[t], ret, ep.next_obs[t + k - 1], discount))
    return to_sorted_batch(rows)


def to_sorted_batch(rows: list[tuple]) -> dict[str, np.ndarray]:
    rows = sorted(rows, key=lambda r: r[1])
    if not rows:
        return {k: np.zeros(0) for k in KEYS}
    return {k: np.array([r[i] for r in rows]) for i, k in enumerate(KEYS)}


def concat_sorted(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if not batches:
        return {k: np.zeros(0) for k in KEYS}
    merged = {k: np.concatenate([b[k] for b in batches]) for k in KEYS}
    order = np.argsort(merged["action"], kind="stable")
    return {k: v[order] for k, v in merged.items()}


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert len(got["action"]) == len(want["action"])
    np.testing.assert_array_equal(got["action"], want["action"])  # also: no duplicates
    np.testing.assert_array_equal(got["obs"], want["obs"])
    np.testing.assert_array_equal(got["next_obs"], want["next_obs"])
    np.testing.assert_allclose(got["reward"], want["reward"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got["discount"], want["discount"], rtol=1e-6, atol=1e-6)


def run_against_reference(num_envs: int, n: int, gamma: float, flags: np.ndarray, rewards: np.ndarray) -> None:
    batches, episodes = simulate(num_envs, n, gamma, len(flags), flags, rewards)
    for b in batches:
        assert b["reward"].dtype == np.float32 and b["discount"].dtype == np.float32
        assert b["obs"].dtype == np.float32 and b["action"].dtype == np.int64
    assert_same(concat_sorted(batches), reference(episodes, n, gamma))


@pytest.mark.parametrize("n", [1, 3, 5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pushes_of_some_envs_at_a_time_match_the_reference(n: int, seed: int) -> None:
    """``env_ids``: whichever envs an asynchronous pool returns, in any order, each env's
    transitions are those of its own steps."""
    rng = np.random.default_rng(seed)
    num_envs, steps = 5, 400
    flags = rng.choice([0, 1, 2], size=(steps, num_envs), p=[0.8, 0.1, 0.1])
    rewards = rng.normal(size=(steps, num_envs))
    batches, episodes = simulate(num_envs, n, 0.9, steps, flags, rewards, subsets=np.random.default_rng(seed + 10))
    assert_same(concat_sorted(batches), reference(episodes, n, 0.9))


def test_env_ids_on_every_push_or_on_none() -> None:
    builder = NStepBuilder(2, 2, 0.9)
    one = dict(reward=np.zeros(1), next_obs=np.zeros((1, 3), np.float32), terminated=np.zeros(1, bool),
               truncated=np.zeros(1, bool))
    builder.push(np.zeros((1, 3), np.float32), np.zeros(1, np.int64), env_ids=np.array([1]), **one)
    with pytest.raises(ValueError, match="env_ids"):
        builder.push(np.zeros((2, 3), np.float32), np.zeros(2, np.int64), np.zeros(2), np.zeros((2, 3), np.float32),
                     np.zeros(2, bool), np.zeros(2, bool))
    with pytest.raises(ValueError, match="distinct env indices"):
        builder.push(np.zeros((1, 3), np.float32), np.zeros(1, np.int64), env_ids=np.array([2]), **one)


@pytest.mark.parametrize("n", [1, 3, 5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_brute_force_reference(n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    num_envs, steps = 4, 300
    flags = rng.choice([0, 1, 2], size=(steps, num_envs), p=[0.8, 0.1, 0.1])
    rewards = rng.normal(size=(steps, num_envs))
    run_against_reference(num_envs, n, 0.9, flags, rewards)


@settings(max_examples=50, deadline=None)
@given(
    num_envs=st.integers(1, 3),
    n=st.integers(1, 5),
    gamma=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
    data=st.data(),
)
def test_property_matches_reference(num_envs: int, n: int, gamma: float, data) -> None:
    steps = data.draw(st.integers(0, 25))
    flags = np.array(
        data.draw(
            st.lists(
                st.lists(st.sampled_from([0, 1, 2]), min_size=num_envs, max_size=num_envs),
                min_size=steps,
                max_size=steps,
            )
        ),
        dtype=np.int64,
    ).reshape(steps, num_envs)
    rewards = np.asarray(
        data.draw(st.lists(st.floats(-10, 10), min_size=steps * num_envs, max_size=steps * num_envs)),
        dtype=np.float64,
    ).reshape(steps, num_envs)
    run_against_reference(num_envs, n, gamma, flags, rewards)


def single_env_push(
    builder: NStepBuilder, t: int, r: float, term: bool = False, trunc: bool = False
) -> dict[str, np.ndarray] | None:
    return builder.push(
        np.array([[t]], np.float32),
        np.array([t]),
        np.array([r]),
        np.array([[t + 1]], np.float32),
        np.array([term]),
        np.array([trunc]),
    )


def test_hand_computed_termination() -> None:
    b = NStepBuilder(1, 3, 0.5)
    assert single_env_push(b, 0, 1.0) is None
    assert single_env_push(b, 1, 2.0) is None
    out = single_env_push(b, 2, 4.0, term=True)
    assert out is not None
    np.testing.assert_allclose(out["reward"], [3.0, 4.0, 4.0])  # 1+1+1, 2+2, 4
    np.testing.assert_array_equal(out["discount"], [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(out["obs"][:, 0], [0, 1, 2])
    np.testing.assert_array_equal(out["next_obs"][:, 0], [3, 3, 3])
    np.testing.assert_array_equal(b.pending, [0])


def test_hand_computed_truncation() -> None:
    b = NStepBuilder(1, 3, 0.5)
    single_env_push(b, 0, 1.0)
    single_env_push(b, 1, 2.0)
    out = single_env_push(b, 2, 4.0, trunc=True)
    assert out is not None
    np.testing.assert_allclose(out["reward"], [3.0, 4.0, 4.0])
    np.testing.assert_allclose(out["discount"], [0.125, 0.25, 0.5])
    np.testing.assert_array_equal(out["next_obs"][:, 0], [3, 3, 3])


def test_hand_computed_sliding_window() -> None:
    b = NStepBuilder(1, 3, 0.5)
    single_env_push(b, 0, 1.0)
    single_env_push(b, 1, 2.0)
    out = single_env_push(b, 2, 4.0)
    assert out is not None
    np.testing.assert_allclose(out["reward"], [3.0])
    np.testing.assert_allclose(out["discount"], [0.125])
    np.testing.assert_array_equal(out["obs"][:, 0], [0])
    np.testing.assert_array_equal(out["next_obs"][:, 0], [3])
    out = single_env_push(b, 3, 8.0, term=True)  # window [2, 4, 8] then flush
    assert out is not None
    np.testing.assert_allclose(out["reward"], [2 + 2 + 2, 4 + 4, 8])
    np.testing.assert_array_equal(out["discount"], [0, 0, 0])
    np.testing.assert_array_equal(out["action"], [1, 2, 3])


def test_one_step_transitions() -> None:
    b = NStepBuilder(2, 1, 0.9)
    out = b.push(
        np.zeros((2, 3), np.float32),
        np.array([4, 5]),
        np.array([1.5, -2.0]),
        np.ones((2, 3), np.float32),
        np.array([False, True]),
        np.array([False, False]),
    )
    assert out is not None
    np.testing.assert_array_equal(out["action"], [4, 5])
    np.testing.assert_allclose(out["reward"], [1.5, -2.0])
    np.testing.assert_allclose(out["discount"], [0.9, 0.0])
    np.testing.assert_array_equal(out["next_obs"], np.ones((2, 3)))


def test_dtypes_kept_for_images_and_continuous_actions() -> None:
    b = NStepBuilder(3, 2, 0.99)
    rng = np.random.default_rng(0)
    out = None
    for _ in range(2):
        out = b.push(
            rng.integers(0, 255, (3, 4, 4, 2), dtype=np.uint8),
            rng.random((3, 2), dtype=np.float32),
            rng.random(3, dtype=np.float32),
            rng.integers(0, 255, (3, 4, 4, 2), dtype=np.uint8),
            np.zeros(3, bool),
            np.zeros(3, bool),
        )
    assert out is not None
    assert out["obs"].dtype == np.uint8 and out["obs"].shape == (3, 4, 4, 2)
    assert out["next_obs"].dtype == np.uint8
    assert out["action"].dtype == np.float32 and out["action"].shape == (3, 2)
    assert out["reward"].dtype == np.float32 and out["discount"].dtype == np.float32


def test_reset_clears_windows() -> None:
    b = NStepBuilder(1, 2, 0.5)
    single_env_push(b, 0, 1.0)
    b.reset()
    np.testing.assert_array_equal(b.pending, [0])
    assert single_env_push(b, 1, 2.0) is None
    out = single_env_push(b, 2, 4.0)
    assert out is not None
    np.testing.assert_array_equal(out["action"], [1])
    np.testing.assert_allclose(out["reward"], [2.0 + 0.5 * 4.0])


def test_outputs_do_not_alias_internal_buffers() -> None:
    b = NStepBuilder(1, 1, 0.5)
    out = single_env_push(b, 0, 1.0)
    assert out is not None
    single_env_push(b, 7, 1.0)
    assert out["obs"][0, 0] == 0 and out["action"][0] == 0


def test_input_validation() -> None:
    b = NStepBuilder(2, 2, 0.9)
    ok: dict[str, np.ndarray] = {
        "obs": np.zeros((2, 3), np.float32),
        "action": np.zeros(2, np.int64),
        "reward": np.zeros(2),
        "next_obs": np.zeros((2, 3), np.float32),
        "terminated": np.zeros(2, bool),
        "truncated": np.zeros(2, bool),
    }
    b.push(**ok)
    with pytest.raises(ValueError, match="reward"):
        b.push(**{**ok, "reward": np.zeros(3)})
    with pytest.raises(ValueError, match="obs"):
        b.push(**{**ok, "obs": np.zeros((3, 3), np.float32)})
    with pytest.raises(ValueError, match="next_obs"):
        b.push(**{**ok, "next_obs": np.zeros((2, 3), np.float64)})
    with pytest.raises(ValueError, match="action"):
        b.push(**{**ok, "action": np.zeros((2, 1), np.int64)})
    with pytest.raises(ValueError):
        NStepBuilder(2, 0, 0.9)
