"""Atari through ale-py: the preprocessing of the DQN papers, with no dependency beyond numpy.

The env chain the ``atari`` wrapper builds, innermost first (Machado et al. 2018; the same steps
as gymnasium's ``AtariPreprocessing``, which needs OpenCV for its resize):

- :class:`AtariFrames`: up to 30 no-op actions at reset, each action repeated 4 times with the
  last two frames max-pooled (ALE flickers), grayscale read from ALE, area-averaged to 84×84
  uint8;
- :class:`GameStats`: the full game's return and length, unclipped, handed to the acting loop as
  ``info["game_return"]``/``info["game_length"]`` when the game ends;
- :class:`EpisodicLife` (training only): a lost life ends the episode for the learner; the next
  reset continues the same game instead of starting a new one;
- reward clipping to {-1, 0, 1} (training only, the ``clip_reward`` wrapper);
- a stack of the last ``env.frame_stack`` frames.

Evaluation and ``zmqrl enjoy`` build the same chain without the training-only wrappers, so they
score full games with the game's own points.
"""

from __future__ import annotations

import functools
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from zmqrl.config import ConfigError

GAME_RETURN, GAME_LENGTH = "game_return", "game_length"  # info keys at the end of a game


def register(env_id: str = "ALE/...") -> None:
    """Make ``ALE/...`` ids known to gymnasium (ale-py ships the ROMs)."""
    try:
        import ale_py
    except ImportError:
        raise ConfigError(f"env.id: {env_id!r} needs ale-py, which is not installed: pip install "
                          "'zmqrl[atari]'") from None
    gym.register_envs(ale_py)


@functools.lru_cache(maxsize=8)
def _edges(src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each of ``dst`` output pixels starts and ends along ``src`` input pixels: whole
    pixel index and fraction of each of the ``dst + 1`` edges, and that index clamped."""
    edges = np.arange(dst + 1) * (src / dst)
    whole = np.floor(edges).astype(np.int64)
    return whole, (edges - whole).astype(np.float32), np.minimum(whole, src - 1)


def _shrink_rows(x: np.ndarray, dst: int) -> np.ndarray:
    """Area average along axis 0: the integral of the pixels between two edges over their distance."""
    src = x.shape[0]
    whole, frac, clamped = _edges(src, dst)
    cumulative = np.zeros((src + 1, *x.shape[1:]), dtype=np.float32)
    np.cumsum(x, axis=0, dtype=np.float32, out=cumulative[1:])
    at_edges = cumulative[whole] + frac[:, None] * x[clamped]
    return (at_edges[1:] - at_edges[:-1]) * np.float32(dst / src)


def resize_area(frame: np.ndarray, size: int) -> np.ndarray:
    """A 2-D uint8 frame area-averaged to ``size``×``size`` (OpenCV's INTER_AREA for a shrink),
    rounded to uint8. Cumulative sums, not a matrix product: BLAS threads cost more than they give here."""
    rows = _shrink_rows(frame, size)
    out = _shrink_rows(np.ascontiguousarray(rows.T), size).T
    return np.rint(out).astype(np.uint8)


def _ale(env: gym.Env) -> Any:
    """The ALE interface under an env's wrappers."""
    return env.unwrapped.ale  # type: ignore[attr-defined]


class AtariFrames(gym.Wrapper):
    """No-op starts, frame skip with max-pooling, grayscale and an area resize to ``size``×``size``.

    Needs the ALE env made with ``frameskip=1`` (the repetition happens here, so the last two
    frames can be max-pooled).
    """

    def __init__(self, env: gym.Env, noop_max: int = 30, frame_skip: int = 4, size: int = 84) -> None:
        super().__init__(env)
        ale = getattr(env.unwrapped, "ale", None)
        if ale is None:
            raise ConfigError(f"env.wrappers: atari needs an ALE env (ALE/Pong-v5, ...), got {env.spec}")
        if getattr(env.unwrapped, "_frameskip", 1) != 1:
            raise ConfigError("env.kwargs: the atari wrapper repeats each action itself (max-pooling the last two "
                              "frames); make the env with `frameskip: 1` in env.kwargs")
        height, width = ale.getScreenDims()
        self.noop_max, self.frame_skip, self.size = noop_max, frame_skip, size
        self.frames = np.zeros((2, height, width), dtype=np.uint8)  # the last two screens
        self.observation_space = gym.spaces.Box(0, 255, (size, size), np.uint8)

    def _grab(self, slot: int) -> None:
        _ale(self.env).getScreenGrayscale(self.frames[slot])

    def _obs(self) -> np.ndarray:
        frame = self.frames[0]
        if self.frame_skip > 1:
            frame = np.maximum(self.frames[0], self.frames[1])
        return resize_area(frame, self.size)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        _, info = self.env.reset(seed=seed, options=options)
        noops = int(self.env.unwrapped.np_random.integers(1, self.noop_max + 1)) if self.noop_max > 0 else 0
        for _ in range(noops):
            _, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                _, info = self.env.reset()
        self._grab(0)
        self.frames[1] = 0
        return self._obs(), info

    def step(self, action: Any) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict]:
        total, terminated, truncated = 0.0, False, False
        info: dict[str, Any] = {}
        for t in range(self.frame_skip):
            _, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if t == self.frame_skip - 2:
                self._grab(1)
            if terminated or truncated:
                break
        self._grab(0)
        return self._obs(), total, terminated, truncated, info


class GameStats(gym.Wrapper):
    """Counts the game's own return and length across lives; adds them to ``info`` at the game's end."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.game_return, self.game_length = 0.0, 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        self.game_return, self.game_length = 0.0, 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_return += float(reward)
        self.game_length += 1
        if terminated or truncated:
            info = {**info, GAME_RETURN: self.game_return, GAME_LENGTH: self.game_length}
        return obs, reward, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """A lost life ends the learner's episode (terminated); the reset that follows goes on with the
    same game (one no-op step) unless the game itself is over."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def _lives(self) -> int:
        return int(_ale(self.env).lives())

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = bool(terminated or truncated)
        lives = self._lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        if self.game_over or seed is not None:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the no-op ended the game
                obs, info = self.env.reset(options=options)
        self.game_over = False
        self.lives = self._lives()
        return obs, info


def wrap(env: gym.Env, frame_stack: int, training: bool) -> gym.Env:
    """The whole Atari chain (see the module docstring)."""
    env = GameStats(AtariFrames(env))
    if training:
        env = EpisodicLife(env)
        env = gym.wrappers.TransformReward(env, _sign)
    return gym.wrappers.FrameStackObservation(env, frame_stack)


def _sign(reward: SupportsFloat) -> float:
    return float(np.sign(float(reward)))
