"""Initial priorities from the values a policy computed when acting (ReusesActingValues).

With the parameters fixed, the acting loop's priorities must be what ``Policy.priorities`` computes
with its own forward passes for the same transitions, across terminations, truncations and the
final observations of auto-resets; and the loop must emit the same transitions as without them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from procs import REPO
from zmqrl import config
from zmqrl.agents.base import constant
from zmqrl.config import Config
from zmqrl.core import ReusesActingValues
from zmqrl.run.acting import ActingLoop, make_task
from zmqrl.run.adders import ENV_ID, FIRST_VALUES, NStepBuilder

KEYS = ("obs", "action", "reward", "next_obs", "discount")
EXPLORE = constant("epsilon", 0.3)


def collect(cfg: Config, policy: Any, steps: int, priorities: bool) -> dict[str, np.ndarray]:
    """Every transition an acting loop of ``policy`` returns in ``steps`` vector steps, concatenated."""
    loop = ActingLoop(cfg, policy, EXPLORE, seed=5, priorities=priorities)
    try:
        assert loop.prioritises == priorities
        parts = [t for t in (loop.step().transitions for _ in range(steps)) if t is not None]
    finally:
        loop.close()
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


def cartpole(*overrides: str) -> Config:
    # episodes of random-ish CartPole policies end by falling (terminated) or at 10 steps (truncated)
    return config.load(REPO / "configs" / "cartpole_dqn.yaml", ["env.max_episode_steps=10", *overrides])


def catch(*overrides: str) -> Config:
    return config.load(REPO / "configs" / "catch_dqn.yaml", list(overrides))


def check_against_forward_pass(policy: Any, got: dict[str, np.ndarray]) -> None:
    assert got["priority"].dtype == np.float32 and (got["priority"] >= 0).all()
    expected = policy.priorities({key: got[key] for key in KEYS})
    np.testing.assert_allclose(got["priority"], expected, rtol=1e-5, atol=1e-5)


CASES: dict[str, Callable[[], tuple[Config, str]]] = {
    "torch-mlp": lambda: (cartpole(), "torch"),
    "torch-mlp-n1": lambda: (cartpole("agent.n_step=1"), "torch"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_reused_priorities_equal_the_forward_pass(case: str) -> None:
    cfg, backend = CASES[case]()
    policy = make_task(cfg).policy(seed=3, backend=backend)
    assert isinstance(policy, ReusesActingValues)
    got = collect(cfg, policy, 600, priorities=True)
    n, gamma = cfg.agent.n_step, cfg.agent.gamma
    discount = got["discount"]
    assert (discount == 0).sum() >= 20  # terminations
    # truncations: a bootstrap after fewer than n steps (n = 1: not told apart from full transitions)
    assert n == 1 or (discount > np.float32(gamma**n) * 1.001).sum() >= 5
    check_against_forward_pass(policy, got)


@pytest.mark.parametrize("max_steps", [None, 4])
def test_reused_priorities_of_the_nature_cnn(max_steps: int | None) -> None:
    """Catch's episodes last 6 steps: all terminated, or with a 4-step limit all truncated."""
    cfg = catch(f"env.max_episode_steps={'null' if max_steps is None else max_steps}")
    policy = make_task(cfg).policy(seed=3, backend="torch")
    got = collect(cfg, policy, 40, priorities=True)
    assert ((got["discount"] == 0).any()) == (max_steps is None)
    check_against_forward_pass(policy, got)


def test_a_bootstrap_one_step_off_would_be_caught() -> None:
    """The check can fail: values of the act call before the right one (a bootstrap from the step
    before), or no bootstrap for a truncation, give priorities that the forward pass does not."""
    cfg, backend = CASES["torch-mlp"]()
    policy: Any = make_task(cfg).policy(seed=3, backend=backend)

    class Stale:
        """The policy, but its acted values are those of the act call before the last."""

        def __init__(self) -> None:
            self.previous = self.last = np.zeros((cfg.env.num_envs, 2), np.float32)

        def act(self, obs: np.ndarray, explore: float) -> np.ndarray:
            action = policy.act(obs, explore)
            self.previous, self.last = self.last, policy.acted_values().copy()
            return action

        def acted_values(self) -> np.ndarray:
            return self.previous

        def __getattr__(self, name: str) -> Any:
            return getattr(policy, name)

    got = collect(cfg, Stale(), 200, priorities=True)
    expected = policy.priorities({key: got[key] for key in KEYS})
    assert not np.allclose(got["priority"], expected, rtol=1e-5, atol=1e-5)

    got = collect(cfg, policy, 200, priorities=True)
    truncated = got["discount"] > np.float32(cfg.agent.gamma ** cfg.agent.n_step) * 1.001
    assert truncated.sum() >= 5
    ended = {key: got[key][truncated] for key in KEYS}
    unbootstrapped = policy.priorities_from_values(ended, policy.values(ended["obs"]),
                                                   np.zeros((truncated.sum(), 2), np.float32))
    assert not np.allclose(got["priority"][truncated], unbootstrapped, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["priority"][truncated], policy.priorities(ended), rtol=1e-5, atol=1e-5)


def rows(batch: dict[str, np.ndarray]) -> Counter[bytes]:
    return Counter(b"".join(np.ascontiguousarray(batch[k][i]).tobytes() for k in KEYS)
                   for i in range(len(batch["reward"])))


def test_the_same_transitions_come_out_with_and_without_priorities() -> None:
    """Same seeds, same transitions: with priorities those of going-on episodes come one step later,
    so the loop without them has at most one step's worth more after as many steps."""
    cfg, backend = CASES["torch-mlp"]()
    task = make_task(cfg)
    plain = collect(cfg, task.policy(seed=3, backend=backend), 300, priorities=False)
    assert "priority" not in plain
    reused = collect(cfg, task.policy(seed=3, backend=backend), 300, priorities=True)
    lost = rows(plain) - rows(reused)
    assert not rows(reused) - rows(plain)
    assert 0 < sum(lost.values()) <= cfg.env.num_envs


@pytest.mark.parametrize("config_name, backend", [("cartpole_iqn.yaml", "auto"), ("cartpole_iqn.yaml", "torch"),
                                                  ("cartpole_dqn.yaml", "numpy")])
def test_a_policy_without_reusable_values_leaves_priorities_to_the_actor(config_name: str, backend: str) -> None:
    """IQN, and DQN's numpy policy, keep their own forward pass for priorities: the loop hands
    their transitions on at once, bare."""
    cfg = config.load(REPO / "configs" / config_name)
    policy = make_task(cfg).policy(seed=3, backend=backend)
    assert not isinstance(policy, ReusesActingValues)
    loop = ActingLoop(cfg, policy, EXPLORE, seed=5, priorities=True)
    try:
        assert not loop.prioritises
        out = [t for t in (loop.step().transitions for _ in range(30)) if t is not None]
        assert out and all(set(t) == set(KEYS) for t in out)
    finally:
        loop.close()


def test_an_actor_sends_the_priorities_of_its_acting_loop(cartpole_cfg: Callable[..., Config]) -> None:
    """End to end: every batch carries priorities, those of the policy's own forward pass (one model)."""
    from rigs import Rig, check_stream

    rig = Rig(cartpole_cfg("actor.nice=0", "actor.n_buffer=32", "net.peer_wait_s=20", "actor.backend=torch"))
    try:
        assert rig.actor.loop.prioritises
        rig.actor.send_linger_s = 0.0
        rig.start()
        rig.actor.run(rig.stop, max_env_steps=2000)
        msgs = rig.received()
        check_stream(msgs, rig)
        sent = {key: np.concatenate([m.arrays[key] for m in msgs]) for key in (*KEYS, "priority")}
        assert (sent["discount"] == 0).any()
        check_against_forward_pass(rig.actor.policy, sent)
    finally:
        rig.close()


def test_the_builder_gives_each_transition_the_values_of_its_first_step() -> None:
    """Values ride in a ring next to the observations and come out with the step they belong to."""
    num_envs, n = 3, 3
    builder = NStepBuilder(num_envs, n, 0.9)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((num_envs, 2)).astype(np.float32)
    seen = 0
    for _ in range(60):
        values = np.stack([obs.sum(axis=1), -obs[:, 0]], axis=1) * 10  # a function of the observation
        next_obs = rng.standard_normal((num_envs, 2)).astype(np.float32)
        flags = rng.random(num_envs)
        out = builder.push(obs, rng.integers(0, 2, num_envs), rng.random(num_envs), next_obs, flags < 0.1,
                           (flags >= 0.1) & (flags < 0.2), values=values)
        obs = next_obs
        if out is None:
            continue
        seen += len(out["reward"])
        expected = np.stack([out["obs"].sum(axis=1), -out["obs"][:, 0]], axis=1) * 10
        np.testing.assert_array_equal(out[FIRST_VALUES], expected)
        assert out[ENV_ID].dtype == np.int64 and ((out[ENV_ID] >= 0) & (out[ENV_ID] < num_envs)).all()
    assert seen > 100
    with pytest.raises(ValueError, match="values"):
        builder.push(obs, np.zeros(num_envs, np.int64), np.zeros(num_envs), obs, np.zeros(num_envs, bool),
                     np.zeros(num_envs, bool))
    fresh = NStepBuilder(num_envs, n, 0.9)
    fresh.push(obs, np.zeros(num_envs, np.int64), np.zeros(num_envs), obs, np.zeros(num_envs, bool),
               np.zeros(num_envs, bool))
    with pytest.raises(ValueError, match="values"):
        fresh.push(obs, np.zeros(num_envs, np.int64), np.zeros(num_envs), obs, np.zeros(num_envs, bool),
                   np.zeros(num_envs, bool), values=np.zeros((num_envs, 2)))
    assert "_values" not in vars(fresh)  # a builder without values saves the state it always did
