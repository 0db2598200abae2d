"""SequenceAdder against a brute-force reference built from whole episodes, and by hand."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zmqrl.run.adders import SequenceAdder

KEYS = ("obs", "action", "reward", "discount", "mask", "state_h", "state_c")
STATE = 2  # recurrent state size in these tests


@dataclass
class Episode:
    """One env's episode as the adder saw it: per step obs, action, reward, state held before acting."""

    obs: list[np.ndarray] = field(default_factory=list)
    action: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    state: list[np.ndarray] = field(default_factory=list)
    terminated: bool = False
    ended: bool = False


@dataclass(frozen=True)
class Shape:
    burn_in: int
    length: int
    overlap: int
    gamma: float

    @property
    def steps(self) -> int:
        return self.burn_in + self.length + 1


def simulate(num_envs: int, shape: Shape, flags: np.ndarray, rewards: np.ndarray,
             subsets: np.random.Generator | None = None, skip_after_end: bool = False
             ) -> tuple[list[dict[str, np.ndarray]], list[Episode]]:
    """Drive the adder; ``flags[t, e]`` is 0 (continue), 1 (terminate), 2 (truncate).

    Observations are (env, episode, step) triples, actions a global step id, states unique per step
    (zero at an episode's first step, as a policy's initial state). With ``subsets`` each push brings
    a random non-empty subset of the envs in random order (``env_ids``); with ``skip_after_end`` the
    row after an episode's end is no step (``valid`` False), as EnvPool resets.
    """
    adder = SequenceAdder(num_envs, shape.burn_in, shape.length, shape.overlap, shape.gamma)
    episode_no = np.zeros(num_envs, dtype=np.int64)
    t_in_ep = np.zeros(num_envs, dtype=np.int64)
    resetting = np.zeros(num_envs, dtype=bool)
    current = [Episode() for _ in range(num_envs)]
    episodes: list[Episode] = []
    out = []
    for t in range(len(flags)):
        envs = np.arange(num_envs)
        if subsets is not None:
            envs = subsets.permutation(num_envs)[: int(subsets.integers(1, num_envs + 1))]
        obs = np.stack([envs, episode_no[envs], t_in_ep[envs]], axis=1).astype(np.float32)
        action = (t * num_envs + envs).astype(np.int64)
        code = 1.0 + action.astype(np.float32) / 1000.0
        state = np.stack([np.stack([code / 10, code], axis=1)] * STATE, axis=2).reshape(len(envs), 2, STATE)
        state[t_in_ep[envs] == 0] = 0.0
        term, trunc = flags[t, envs] == 1, flags[t, envs] == 2
        valid = ~resetting[envs]
        batch = adder.push(obs, action, rewards[t, envs], term, trunc, state, valid=valid,
                           env_ids=envs if subsets is not None else None)
        if batch is not None:
            out.append(batch)
        for row, e in enumerate(envs):
            if resetting[e]:
                resetting[e] = False
                continue
            ep = current[e]
            ep.obs.append(obs[row])
            ep.action.append(int(action[row]))
            ep.reward.append(float(rewards[t, e]))
            ep.state.append(state[row])
            if term[row] or trunc[row]:
                ep.terminated, ep.ended = bool(term[row]), True
                episodes.append(ep)
                current[e] = Episode()
                episode_no[e] += 1
                t_in_ep[e] = 0
                resetting[e] = skip_after_end
            else:
                t_in_ep[e] += 1
    episodes.extend(current)
    return out, episodes


def reference(episodes: list[Episode], shape: Shape) -> dict[str, np.ndarray]:
    """Every item the adder must have sent, built directly from whole episodes (item format of
    :mod:`zmqrl.agents.r2d2`)."""
    b, length, steps = shape.burn_in, shape.length, shape.steps
    period = length - shape.overlap
    items = []
    for ep in episodes:
        last = len(ep.action) - 1
        for start in range(0, last + 1, period):
            complete = start + length <= last
            if not complete and not (ep.ended and (ep.terminated or start < last)):
                continue  # still open when the simulation stopped, or a truncated episode's last step alone
            item: dict[str, np.ndarray] = {"obs": np.zeros((steps, 3), np.float32), "action": np.zeros(steps, np.int64),
                    "reward": np.zeros(steps, np.float32), "discount": np.zeros(steps, np.float32),
                    "mask": np.zeros(steps, np.float32)}
            for row in range(steps):
                u = start - b + row
                if 0 <= u <= min(last, start + length):
                    item["obs"][row] = ep.obs[u]
                    item["action"][row] = ep.action[u]
                    item["reward"][row] = ep.reward[u]
                    item["discount"][row] = 0.0 if (ep.terminated and u == last) else shape.gamma
                    item["mask"][row] = 1.0
            state = ep.state[max(start - b, 0)]
            item["state_h"], item["state_c"] = state[0], state[1]
            items.append(item)
    return sort_items([{k: v[None] for k, v in item.items()} for item in items], b)


def sort_items(batches: list[dict[str, np.ndarray]], burn_in: int) -> dict[str, np.ndarray]:
    """Items of all batches in one batch, ordered by the action of their first trained step (unique)."""
    if not batches:
        return {}
    merged = {k: np.concatenate([batch[k] for batch in batches]) for k in KEYS}
    order = np.argsort(merged["action"][:, burn_in], kind="stable")
    return {k: v[order] for k, v in merged.items()}


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    if not want:
        return
    assert len(got["action"]) == len(want["action"])
    for key in KEYS:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def run_against_reference(num_envs: int, shape: Shape, flags: np.ndarray, rewards: np.ndarray,
                          subsets: np.random.Generator | None = None, skip_after_end: bool = False) -> None:
    batches, episodes = simulate(num_envs, shape, flags, rewards, subsets, skip_after_end)
    for batch in batches:
        assert batch["obs"].shape[1:] == (shape.steps, 3) and batch["obs"].dtype == np.float32
        assert batch["action"].dtype == np.int64
        for key in ("reward", "discount", "mask", "state_h", "state_c"):
            assert batch[key].dtype == np.float32, key
    assert_same(sort_items(batches, shape.burn_in), reference(episodes, shape))


@pytest.mark.parametrize("shape", [Shape(2, 4, 2, 0.9), Shape(0, 3, 0, 0.5), Shape(5, 3, 2, 0.99), Shape(1, 6, 5, 1.0)],
                         ids=str)
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_brute_force_reference(shape: Shape, seed: int) -> None:
    rng = np.random.default_rng(seed)
    num_envs, steps = 4, 300
    flags = rng.choice([0, 1, 2], size=(steps, num_envs), p=[0.9, 0.05, 0.05])
    rewards = rng.normal(size=(steps, num_envs)).astype(np.float32)
    run_against_reference(num_envs, shape, flags, rewards)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pushes_of_some_envs_with_skipped_rows_match_the_reference(seed: int) -> None:
    """``env_ids`` and ``valid``: whichever envs an asynchronous pool returns, in any order, resetting
    rows skipped, each env's items are those of its own steps."""
    rng = np.random.default_rng(seed)
    num_envs, steps = 5, 400
    flags = rng.choice([0, 1, 2], size=(steps, num_envs), p=[0.9, 0.05, 0.05])
    rewards = rng.normal(size=(steps, num_envs)).astype(np.float32)
    run_against_reference(num_envs, Shape(3, 5, 2, 0.97), flags, rewards, subsets=np.random.default_rng(seed + 10),
                          skip_after_end=True)


@settings(max_examples=60, deadline=None)
@given(num_envs=st.integers(1, 3), burn_in=st.integers(0, 4), length=st.integers(1, 5), data=st.data(),
       gamma=st.sampled_from([0.0, 0.5, 0.99, 1.0]), some_envs=st.booleans(), skip_after_end=st.booleans())
def test_property_matches_reference(num_envs: int, burn_in: int, length: int, data: st.DataObject, gamma: float,
                                    some_envs: bool, skip_after_end: bool) -> None:
    overlap = data.draw(st.integers(0, length - 1))
    steps = data.draw(st.integers(0, 30))
    flags = np.array(data.draw(st.lists(st.sampled_from([0, 0, 0, 1, 2]), min_size=steps * num_envs,
                                        max_size=steps * num_envs)), dtype=np.int64).reshape(steps, num_envs)
    rewards = np.asarray(data.draw(st.lists(st.floats(-10, 10, width=32), min_size=steps * num_envs,
                                            max_size=steps * num_envs)), dtype=np.float32).reshape(steps, num_envs)
    subsets = np.random.default_rng(data.draw(st.integers(0, 2**16))) if some_envs else None
    run_against_reference(num_envs, Shape(burn_in, length, overlap, gamma), flags, rewards, subsets, skip_after_end)


def push_one(adder: SequenceAdder, t: int, reward: float, term: bool = False, trunc: bool = False,
             state: float | None = None) -> dict[str, np.ndarray] | None:
    s = np.full((1, 2, STATE), float(t) if state is None else state, np.float32)
    return adder.push(np.array([[t]], np.float32), np.array([t]), np.array([reward], np.float32), np.array([term]),
                      np.array([trunc]), s)


def test_hand_computed_items_of_a_terminated_episode() -> None:
    """Burn-in 2, 3 trained steps, overlap 1 (an item every 2 steps), a 6-step episode ending in a termination."""
    adder = SequenceAdder(1, burn_in=2, sequence_length=3, overlap=1, gamma=0.5)
    got = [push_one(adder, t, reward=10.0 + t, state=0.0 if t == 0 else None) for t in range(5)]
    assert got[:3] == [None, None, None]
    first = got[3]  # trained steps 0..2, bootstrap step 3, complete once step 3 is in
    assert first is not None and len(first["obs"]) == 1
    np.testing.assert_array_equal(first["mask"], [[0, 0, 1, 1, 1, 1]])
    np.testing.assert_array_equal(first["obs"][0, :, 0], [0, 0, 0, 1, 2, 3])
    np.testing.assert_array_equal(first["reward"], [[0, 0, 10, 11, 12, 13]])
    np.testing.assert_array_equal(first["discount"], [[0, 0, 0.5, 0.5, 0.5, 0.5]])
    np.testing.assert_array_equal(first["state_h"], [[0, 0]])  # the state before the episode's first step
    assert got[4] is None
    last = push_one(adder, 5, reward=15.0, term=True)
    assert last is not None  # the item at step 2 (complete: steps 0..5) and the one at step 4 (padded)
    np.testing.assert_array_equal(last["mask"], [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    np.testing.assert_array_equal(last["obs"][:, :, 0], [[0, 1, 2, 3, 4, 5], [2, 3, 4, 5, 0, 0]])
    np.testing.assert_array_equal(last["discount"], [[0.5] * 5 + [0], [0.5, 0.5, 0.5, 0, 0, 0]])
    np.testing.assert_array_equal(last["state_h"], [[0, 0], [2, 2]])  # held before steps 0 and 2
    np.testing.assert_array_equal(adder.episode_steps, [0])


def test_a_truncated_episode_sends_no_item_whose_only_trained_step_is_its_last() -> None:
    """The last step of a truncated episode has no next observation in the item: alone, no target."""
    adder = SequenceAdder(1, burn_in=1, sequence_length=2, overlap=0, gamma=0.5)
    assert push_one(adder, 0, 1.0) is None
    assert push_one(adder, 1, 1.0) is None
    out = push_one(adder, 2, 1.0, trunc=True)  # items at steps 0 (complete) and 2 (its last step alone: none)
    assert out is not None
    np.testing.assert_array_equal(out["obs"][:, :, 0], [[0, 0, 1, 2]])
    np.testing.assert_array_equal(out["mask"], [[0, 1, 1, 1]])
    np.testing.assert_array_equal(out["discount"], [[0, 0.5, 0.5, 0.5]])
    adder = SequenceAdder(1, burn_in=1, sequence_length=2, overlap=0, gamma=0.5)
    push_one(adder, 0, 1.0)
    push_one(adder, 1, 1.0)
    out = push_one(adder, 2, 1.0, term=True)  # terminated: the last step's own reward is its target
    assert out is not None
    np.testing.assert_array_equal(out["mask"], [[0, 1, 1, 1], [1, 1, 0, 0]])
    np.testing.assert_array_equal(out["discount"][1], [0.5, 0, 0, 0])


def test_image_observations_keep_their_dtype_and_outputs_do_not_alias_the_rings() -> None:
    adder = SequenceAdder(2, burn_in=1, sequence_length=1, overlap=0, gamma=0.99)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (3, 2, 4, 84, 84), dtype=np.uint8)
    state = np.zeros((2, 2, 8), np.float32)
    outs = [adder.push(frames[t], np.array([t, t]), np.ones(2, np.float32), np.zeros(2, bool), np.zeros(2, bool),
                       state) for t in range(3)]
    first = outs[1]
    assert first is not None and first["obs"].dtype == np.uint8 and first["obs"].shape == (2, 3, 4, 84, 84)
    np.testing.assert_array_equal(first["obs"][0, 1:], frames[:2, 0])
    assert not first["obs"][:, 0].any()  # padding before the episode's start
    kept = first["obs"].copy()
    adder.push(frames[0], np.array([9, 9]), np.ones(2, np.float32), np.zeros(2, bool), np.zeros(2, bool), state)
    np.testing.assert_array_equal(first["obs"], kept)


def test_input_validation() -> None:
    adder = SequenceAdder(2, burn_in=1, sequence_length=2, overlap=1, gamma=0.9)
    ok: dict[str, Any] = {
        "obs": np.zeros((2, 3), np.float32), "action": np.zeros(2, np.int64), "reward": np.zeros(2, np.float32),
        "terminated": np.zeros(2, bool), "truncated": np.zeros(2, bool), "state": np.zeros((2, 2, 4), np.float32)}
    adder.push(**ok)
    with pytest.raises(ValueError, match="valid"):
        adder.push(**ok, valid=np.array([True, False]))  # env 1 is in the middle of an episode
    with pytest.raises(ValueError, match="env_ids"):
        adder.push(**ok, env_ids=np.array([1, 1]))
    with pytest.raises(ValueError, match="env_ids"):
        adder.push(**ok, env_ids=np.array([0, 2]))
    with pytest.raises(ValueError, match="reward"):
        adder.push(**{**ok, "reward": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="state"):
        adder.push(**{**ok, "state": np.zeros((2, 4), np.float32)})
    with pytest.raises(ValueError, match="state"):
        adder.push(**{**ok, "state": np.zeros((2, 2, 5), np.float32)})
    with pytest.raises(ValueError, match="obs"):
        adder.push(**{**ok, "obs": np.zeros((2, 3), np.float64)})
    for bad in ({"sequence_length": 0}, {"overlap": 2}, {"burn_in": -1}, {"gamma": 1.5}):
        layout: dict[str, Any] = {"burn_in": 1, "sequence_length": 2, "overlap": 1, "gamma": 0.9, **bad}
        with pytest.raises(ValueError):
            SequenceAdder(2, **layout)


def test_reset_drops_running_episodes() -> None:
    adder = SequenceAdder(1, burn_in=0, sequence_length=2, overlap=0, gamma=0.9)
    push_one(adder, 0, 1.0)
    adder.reset()
    np.testing.assert_array_equal(adder.episode_steps, [0])
    assert push_one(adder, 1, 1.0) is None
    assert push_one(adder, 2, 1.0) is None
    out = push_one(adder, 3, 1.0)
    assert out is not None
    np.testing.assert_array_equal(out["obs"][0, :, 0], [1, 2, 3])
