"""Greedy evaluation: whole games on a vector of evaluation envs (no episodic life, rewards unclipped)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from zmqrl.config import Config, EnvConfig
from zmqrl.core import RecurrentPolicy
from zmqrl.envs.factory import make_eval_vector


def greedy_actions(policy: Any) -> Callable[[np.ndarray], np.ndarray]:
    """``policy``'s greedy actions (:class:`~zmqrl.core.Policy`) for rows of episodes that all start now.

    A :class:`~zmqrl.core.RecurrentPolicy` acts from its initial state, one per row, carried from
    call to call: make a new one for every set of episodes (:meth:`GreedyEvaluator.play` does).
    """
    if not isinstance(policy, RecurrentPolicy):
        return policy.greedy  # type: ignore[no-any-return]
    state: np.ndarray | None = None

    def act(obs: np.ndarray) -> np.ndarray:
        nonlocal state
        if state is None or len(state) != len(obs):
            state = policy.initial_state(len(obs))
        actions, state = policy.greedy_recurrent(obs, state)
        return actions

    return act


class GreedyEvaluator:
    """Runs ``episodes`` greedy episodes at once, one per env of a vector, batched forwards.

    Seeds: fresh and deterministic for each call (from ``seed``), or with ``seeds`` (one per episode)
    the same every call, so two evaluations can be compared episode by episode. With ``epsilon`` each
    action is, with that chance, one drawn from the action space instead (Atari agents are evaluated
    this way, so a greedy policy that never presses FIRE cannot stall a game for good).
    """

    def __init__(self, cfg: EnvConfig, episodes: int, seed: int, seeds: Sequence[int] = (),
                 epsilon: float = 0.0) -> None:
        if seeds and len(seeds) != episodes:
            raise ValueError(f"GreedyEvaluator: {len(seeds)} seeds for {episodes} episodes")
        self.vec = make_eval_vector(cfg, episodes)
        self.episodes = episodes
        self.seed = seed
        self.seeds = [int(s) for s in seeds]
        self.epsilon = epsilon
        self.calls = 0

    def play(self, policy: Any) -> tuple[list[float], list[int]]:
        """:meth:`run` with ``policy``'s greedy actions; a recurrent policy starts each episode from its
        initial state (:func:`greedy_actions`)."""
        return self.run(greedy_actions(policy))

    def run(self, greedy: Callable[[np.ndarray], np.ndarray]) -> tuple[list[float], list[int]]:
        """Returns and lengths of one episode per env (seeds as the class docstring says); ``greedy``
        takes every env's observation at each step, from the episodes' first on."""
        base = self.seed + 100_003 * self.calls
        self.calls += 1
        seeds = self.seeds or [base + i for i in range(self.episodes)]
        obs, _ = self.vec.reset(seed=list[int | None](seeds))
        act = self._with_epsilon(greedy, seeds) if self.epsilon > 0 else greedy
        returns = np.zeros(self.episodes)
        lengths = np.zeros(self.episodes, dtype=np.int64)
        running = np.ones(self.episodes, dtype=bool)
        while running.any():
            obs, reward, terminated, truncated, _ = self.vec.step(act(obs))
            returns += np.where(running, reward, 0.0)
            lengths += running
            running &= ~(terminated | truncated)
        return returns.tolist(), lengths.tolist()

    def _with_epsilon(self, greedy: Callable[[np.ndarray], np.ndarray],
                      seeds: list[int]) -> Callable[[np.ndarray], np.ndarray]:
        """``greedy``, each action replaced with chance ``epsilon`` by a random one (drawn from the seeds)."""
        rng = np.random.default_rng(seeds)
        space = self.vec.single_action_space
        space.seed(int(rng.integers(2**31)))

        def act(obs: np.ndarray) -> np.ndarray:
            actions = np.array(greedy(obs), copy=True)
            for i in np.flatnonzero(rng.random(len(actions)) < self.epsilon):
                actions[i] = space.sample()
            return actions

        return act

    def close(self) -> None:
        self.vec.close()


def evaluator_for(cfg: Config, seed: int) -> GreedyEvaluator:
    """The evaluation the config asks for (``trainer.eval_episodes``, ``eval_seeds``, ``eval_epsilon``)."""
    tc = cfg.trainer
    return GreedyEvaluator(cfg.env, tc.eval_episodes, seed, seeds=tc.eval_seeds, epsilon=tc.eval_epsilon)
