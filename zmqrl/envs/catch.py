"""Catch on 84×84 pixels: a small image task that the CNN agents learn in minutes on a CPU.

A ball falls one row per step from a random column of a 7×7 grid; a paddle on the bottom row
moves left, stays or moves right. When the ball reaches the bottom the episode ends with +1 if
the paddle is under it and -1 if not (bsuite's catch, drawn as an Atari-sized uint8 frame of
shape (1, 84, 84) with 12×12-pixel cells). A random policy scores about -0.7; a perfect one +1.

Registered as ``zmqrl/Catch-v0``; it exercises the whole image path (uint8 frames from the env
through the wire into replay and the Nature CNN) in the tests, with no ROM or download.
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

SIZE, CELL = 7, 12  # grid cells per side, pixels per cell (7 × 12 = 84)


class Catch(gym.Env[np.ndarray, np.int64]):
    """Catch the falling ball: 3 actions (left, stay, right), one episode = 6 steps."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, render_mode: str | None = None) -> None:
        self.observation_space = gym.spaces.Box(0, 255, (1, SIZE * CELL, SIZE * CELL), np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self.render_mode = render_mode
        self.ball_row, self.ball_col, self.paddle = 0, 0, SIZE // 2

    def _obs(self) -> np.ndarray:
        frame = np.zeros((1, SIZE * CELL, SIZE * CELL), dtype=np.uint8)
        frame[0, self.ball_row * CELL:(self.ball_row + 1) * CELL, self.ball_col * CELL:(self.ball_col + 1) * CELL] = 255
        frame[0, (SIZE - 1) * CELL:, self.paddle * CELL:(self.paddle + 1) * CELL] = 255
        return frame

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.ball_row, self.ball_col = 0, int(self.np_random.integers(SIZE))
        self.paddle = SIZE // 2
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict]:
        self.paddle = int(np.clip(self.paddle + int(action) - 1, 0, SIZE - 1))
        self.ball_row += 1
        done = self.ball_row == SIZE - 1
        reward = (1.0 if self.paddle == self.ball_col else -1.0) if done else 0.0
        return self._obs(), reward, done, False, {}

    def render(self) -> np.ndarray:
        return np.repeat(self._obs()[0][:, :, None], 3, axis=2)


gym.register("zmqrl/Catch-v0", entry_point="zmqrl.envs.catch:Catch")
