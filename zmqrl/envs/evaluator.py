"""Greedy evaluation: whole games on a vector of evaluation envs (no episodic life, rewards unclipped)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from zmqrl.config import EnvConfig
from zmqrl.envs.factory import make_env


class GreedyEvaluator:
    """Runs ``episodes`` greedy episodes at once, one per env of a vector, batched forwards."""

    def __init__(self, cfg: EnvConfig, episodes: int, seed: int) -> None:
        self.vec = SyncVectorEnv([lambda: make_env(cfg, training=False) for _ in range(episodes)],
                                 autoreset_mode=AutoresetMode.SAME_STEP)
        self.episodes = episodes
        self.seed = seed
        self.calls = 0

    def run(self, greedy: Callable[[np.ndarray], np.ndarray]) -> tuple[list[float], list[int]]:
        """Returns and lengths of one episode per env; each call uses fresh, deterministic seeds."""
        base = self.seed + 100_003 * self.calls
        self.calls += 1
        obs, _ = self.vec.reset(seed=[base + i for i in range(self.episodes)])
        returns = np.zeros(self.episodes)
        lengths = np.zeros(self.episodes, dtype=np.int64)
        running = np.ones(self.episodes, dtype=bool)
        while running.any():
            obs, reward, terminated, truncated, _ = self.vec.step(greedy(obs))
            returns += np.where(running, reward, 0.0)
            lengths += running
            running &= ~(terminated | truncated)
        return returns.tolist(), lengths.tolist()

    def close(self) -> None:
        self.vec.close()
