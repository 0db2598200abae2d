"""R2D2 learns what only memory can tell: a cue shown at an episode's first step must be named at its last.

The pieces phase 1 builds, put together in miniature: envs acted on by the numpy policy (random
actions, but its own LSTM states, refreshed from the learner every round), sequence items from the
:class:`~zmqrl.run.adders.SequenceAdder`, a FIFO of items, and the torch agent's updates.

Episodes of 10 steps, items of burn-in 4 and 10 trained steps, one every 4 steps: the decision
step is trained in three items of each episode, one holding the whole episode from its zero state,
one that sees the cue during its burn-in, and one that starts after the cue, from the state the
actor stored. The checks: greedy play names the cue, and the learner's Q on fresh items of the last
kind (the cue nowhere in them) names it too, so the stored state and the burn-in carry it.

A feed-forward Q-network cannot beat chance: the decision step's observation is the same whichever
cue was shown (asserted below), so its greedy answer is right for one cue and wrong for the other.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from tiers import seeds
from zmqrl.agents.r2d2.agent import R2D2Agent
from zmqrl.agents.r2d2.config import R2D2Config
from zmqrl.agents.r2d2.numpy_policy import NumpyR2D2Policy
from zmqrl.agents.r2d2.sequences import Layout, inverse_rescale
from zmqrl.run.adders import SequenceAdder

DELAY = 8  # blank steps between the cue and the decision: episodes of DELAY + 2 steps
STEPS = DELAY + 2
OBS = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
ACT = gym.spaces.Discrete(2)
LAYOUT = Layout(burn_in=4, length=10, overlap=6)  # items at the episode's steps 0, 4 and 8
ENVS = 16


class CueRecall:
    """``n`` episodes at a time: step 0 shows a cue of +1 or -1 in ``obs[0]``, then DELAY blank steps, then
    the decision step (``obs[1] = 1``) where action 1 for +1 (0 for -1) earns +1, the other -1; it ends
    there (terminated). No other step has a reward."""

    def __init__(self, n: int, rng: np.random.Generator) -> None:
        self.n, self.rng = n, rng
        self.t = np.zeros(n, dtype=np.int64)
        self.cue = rng.choice([-1.0, 1.0], size=n)

    def obs(self) -> np.ndarray:
        """The observations of the envs' current steps."""
        obs = np.zeros((self.n, 2), np.float32)
        obs[:, 0] = np.where(self.t == 0, self.cue, 0.0)
        obs[:, 1] = self.t == DELAY + 1
        return obs

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rewards and terminations; ended episodes restart with a fresh cue."""
        decision = self.t == DELAY + 1
        right = action == (self.cue > 0)
        reward = np.where(decision, np.where(right, 1.0, -1.0), 0.0).astype(np.float32)
        self.t += 1
        self.t[decision] = 0
        self.cue[decision] = self.rng.choice([-1.0, 1.0], size=int(decision.sum()))
        return reward, decision


def play(envs: CueRecall, actor: NumpyR2D2Policy, adder: SequenceAdder, explore: float
         ) -> list[dict[str, np.ndarray]]:
    """One episode of every env (they run in step), acted on with ``explore``; the items it made."""
    state = actor.initial_state(envs.n)
    items: list[dict[str, np.ndarray]] = []
    for _ in range(STEPS):
        obs = envs.obs()
        action, after = actor.act_recurrent(obs, explore, state)
        reward, ended = envs.step(action)
        out = adder.push(obs, action.astype(np.int64), reward, ended, np.zeros(envs.n, bool), state)
        state = after
        if out is not None:
            items.extend({k: v[i] for k, v in out.items()} for i in range(len(out["mask"])))
    assert ended.all()
    return items


def train(seed: int, rounds: int = 60, updates_per_round: int = 8) -> tuple[R2D2Agent, NumpyR2D2Policy]:
    """Alternate acting (an episode of each env, epsilon 1) and learning; the actor takes the learner's
    parameters after every round, as a distributed actor takes each new model."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    cfg = R2D2Config(hidden=[32], lstm_size=32, head_hidden=0, gamma=0.9, n_step=3, lr=3e-3, adam_eps=1e-8,
                     target_update_interval=40, batch_size=32)
    agent = R2D2Agent(cfg, LAYOUT, OBS, ACT, seed=seed)
    actor = NumpyR2D2Policy(cfg, LAYOUT, OBS, ACT, seed=seed)
    envs = CueRecall(ENVS, rng)
    adder = SequenceAdder(ENVS, LAYOUT.burn_in, LAYOUT.length, LAYOUT.overlap, cfg.gamma)
    replay: list[dict[str, np.ndarray]] = []
    for _ in range(rounds):
        actor.load_params(agent.params())
        replay.extend(play(envs, actor, adder, explore=1.0))
        del replay[:-1500]
        for _ in range(updates_per_round):
            picks = rng.integers(len(replay), size=cfg.batch_size)
            metrics, _ = agent.update({k: np.stack([replay[i][k] for i in picks]) for k in replay[0]})
            assert metrics["skipped"] == 0.0
    actor.load_params(agent.params())
    return agent, actor


def greedy_answers(actor: NumpyR2D2Policy, seed: int, n: int = 200) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Greedy play of ``n`` fresh episodes from the zero state: each one's cue, its answer and Q at the decision."""
    envs = CueRecall(n, np.random.default_rng(10_000 + seed))
    cue = envs.cue.copy()
    state = actor.initial_state(n)
    for _ in range(STEPS - 1):
        _, state = actor.greedy_recurrent(envs.obs(), state)
        envs.step(np.zeros(n, np.int64))
    decision_obs = envs.obs()
    assert (decision_obs == decision_obs[0]).all()  # the same observation whichever cue was shown
    q, _ = actor.step(decision_obs, state)
    return cue, q.argmax(axis=1), q


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", seeds(0, 1, 2))
@pytest.mark.slow
def test_r2d2_remembers_a_cue_through_its_stored_state_and_burn_in(seed: int) -> None:
    agent, actor = train(seed)
    cue, answer, q = greedy_answers(actor, seed)
    right = answer == (cue > 0)
    assert right.mean() >= 0.95, f"greedy answers right for {right.mean():.0%} of cues (chance: 50%)"
    value = inverse_rescale(q.astype(np.float64), agent.cfg.rescale_eps)
    named = value[np.arange(len(cue)), (cue > 0).astype(int)]
    other = value[np.arange(len(cue)), (cue <= 0).astype(int)]
    assert named.mean() > 0.6 and other.mean() < -0.6, (named.mean(), other.mean())  # the rewards: +1, -1

    envs = CueRecall(64, np.random.default_rng(20_000 + seed))
    adder = SequenceAdder(64, LAYOUT.burn_in, LAYOUT.length, LAYOUT.overlap, agent.cfg.gamma)
    items = play(envs, actor, adder, explore=1.0)
    late = [item for item in items if item["mask"][0] == 1 and not item["obs"][:, 0].any()]  # no cue in them
    assert len(late) == 64
    batch = {k: np.stack([item[k] for item in late]) for k in late[0]}
    decision_row = int(np.flatnonzero(batch["obs"][0, :, 1])[0])
    q_items = agent.sequence_q(batch["obs"], batch["state_h"], batch["state_c"], batch["mask"])
    answers = q_items[:, decision_row].argmax(axis=1)
    earned = batch["reward"][:, decision_row]  # +1 where the random action named the cue, else -1
    acted = batch["action"][:, decision_row]
    item_right = np.where(earned > 0, acted, 1 - acted)  # the answer that names each item's cue
    assert (answers == item_right).mean() >= 0.95, f"Q from stored states names {(answers == item_right).mean():.0%}"
