"""A trained policy from a run directory, acting greedily: ``zmqrl enjoy`` and :func:`zmqrl.load_policy`.

The policy is built from the run's own ``config.yaml`` through the algorithm seam
(``make_task(cfg).policy(...)``) and given the policy parameters that every checkpoint stores,
so this works for any registered algorithm and any checkpoint: ``best``, ``latest`` or a
numbered one. Episodes run one at a time in a single env (episode ``i`` resets with seed
``seed + i``); with a video directory each one is recorded to an MP4 through gymnasium's
``RecordVideo`` (needs moviepy).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from zmqrl.config import Config, ConfigError
from zmqrl.run import user_callables
from zmqrl.run.checkpoint import CheckpointError, checkpoint_dir, load_policy_params, policy_file
from zmqrl.run.rundir import run_config


@dataclass
class Episodes:
    """Returns and lengths of played episodes, and the videos written (if any)."""

    returns: list[float]
    lengths: list[int]
    videos: list[Path]

    def describe(self) -> str:
        r, n = np.asarray(self.returns), np.asarray(self.lengths)
        return (f"return {r.mean():.1f} ± {r.std():.1f} over {len(r)} episode{'s' if len(r) != 1 else ''} "
                f"(min {r.min():.1f}, max {r.max():.1f}); length {n.mean():.1f} ± {n.std():.1f}")


class TrainedPolicy:
    """The greedy policy of one checkpoint of a run.

    ``act(obs)`` takes one observation (the env's observation shape) or a batch of them and
    returns the greedy action(s) in the form the env takes. A recurrent policy (R2D2's LSTM) keeps
    its state from one ``act`` to the next, a row per observation: call :meth:`reset` when new
    episodes start (:meth:`play` does). ``cfg`` is the run's config, ``checkpoint`` the directory
    read and ``state`` its ``state.json`` (counters, evaluations).
    """

    def __init__(self, run_dir: str | Path, checkpoint: str | int = "best", backend: str = "auto") -> None:
        from zmqrl.run.acting import make_task

        self.run_dir = Path(run_dir)
        self.cfg: Config = user_callables.resolve(run_config(self.run_dir), self.run_dir)  # callables/ of the run
        self.checkpoint = checkpoint_dir(self.run_dir, checkpoint)
        self.name = str(checkpoint)
        params, self.state = load_policy_params(self.checkpoint)
        self.task = make_task(self.cfg)
        self.obs_space, self.action_space = self.task.obs_space, self.task.action_space
        self.policy = self.task.policy(seed=self.cfg.run.seed, backend=backend)
        try:
            self.policy.load_params(params)
        except (KeyError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{policy_file(self.checkpoint)}: its policy parameters do not fit "
                                  f"the run's config.yaml (agent.algo={self.cfg.agent.algo}): {exc}") from None
        self.reset()

    def reset(self) -> None:
        """New episodes start: the next ``act`` plays their first observations (a recurrent policy from
        its initial state; a feed-forward one has nothing to forget)."""
        from zmqrl.envs.evaluator import greedy_actions

        self._greedy = greedy_actions(self.policy)

    def act(self, obs: Any) -> Any:
        """Greedy action for one observation, or an array of actions for a batch."""
        shape = tuple(self.obs_space.shape or ())
        x = np.asarray(obs, dtype=self.obs_space.dtype)
        if x.shape == shape:
            return self._greedy(x[None])[0]
        if x.shape[1:] == shape:
            return self._greedy(x)
        raise ValueError(f"act: observation shape {x.shape} is neither {shape} (one) nor (N, *{shape}) (a batch) "
                         f"for {self.cfg.env.id}")

    def describe(self) -> str:
        """One line: which checkpoint, at what point of training, with what evaluation."""
        s = self.state
        parts = [f"opt step {s.get('opt_steps', '?')}", f"env step {s.get('env_steps', '?')}"]
        if s.get("eval_return") is not None:
            parts.append(f"its evaluation {float(s['eval_return']):.1f}")
        elif s.get("best_eval") is not None:
            parts.append(f"best evaluation so far {float(s['best_eval']):.1f}")
        return f"{self.cfg.agent.algo} on {self.cfg.env.id}, checkpoint {self.checkpoint} ({', '.join(parts)})"

    def play(self, episodes: int = 10, seed: int = 0, video_dir: str | Path | None = None,
             on_episode: Callable[[int, float, int], None] | None = None) -> Episodes:
        """Run ``episodes`` greedy episodes; episode ``i`` resets with seed ``seed + i``."""
        import gymnasium as gym

        if episodes < 1:
            raise ConfigError(f"--episodes must be >= 1, got {episodes}")
        env = self._env(video_dir)
        returns: list[float] = []
        lengths: list[int] = []
        try:
            for i in range(episodes):
                obs, _ = env.reset(seed=seed + i)
                self.reset()
                total, steps, done = 0.0, 0, False
                while not done:
                    obs, reward, terminated, truncated, _ = env.step(self.act(obs))
                    total += float(reward)
                    steps += 1
                    done = bool(terminated or truncated)
                returns.append(total)
                lengths.append(steps)
                if on_episode is not None:
                    on_episode(i, total, steps)
        except gym.error.DependencyNotInstalled as exc:  # rendering for --video needs the env's extras
            raise ConfigError(f"--video: {self.cfg.env.id} cannot render here ({exc}); for classic-control envs: "
                              "pip install 'zmqrl[video]'") from None
        finally:
            env.close()  # RecordVideo writes the last file here
        videos = sorted(Path(video_dir).glob(f"{self._video_prefix}*.mp4")) if video_dir is not None else []
        return Episodes(returns, lengths, videos)

    @property
    def _video_prefix(self) -> str:
        return f"{self.cfg.run.name}-{self.name}"

    def _env(self, video_dir: str | Path | None) -> Any:
        import gymnasium as gym

        from zmqrl.envs.factory import make_env

        if video_dir is None:
            return make_env(self.cfg.env, training=False)
        for var in ("SDL_VIDEODRIVER", "SDL_AUDIODRIVER"):  # classic-control envs draw with pygame; rgb_array
            os.environ.setdefault(var, "dummy")            # frames need no display or sound device
        os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
        env_cfg = replace(self.cfg.env, kwargs={**self.cfg.env.kwargs, "render_mode": "rgb_array"})
        env = make_env(env_cfg, training=False)
        try:
            return gym.wrappers.RecordVideo(env, str(video_dir), episode_trigger=lambda _: True,
                                           name_prefix=self._video_prefix, disable_logger=True)
        except gym.error.DependencyNotInstalled as exc:
            env.close()
            raise ConfigError(f"--video needs moviepy: pip install 'zmqrl[video]' ({exc})") from None


def load_policy(run_dir: str | Path, checkpoint: str | int = "best", backend: str = "auto") -> TrainedPolicy:
    """The greedy policy of checkpoint ``best``, ``latest`` or N of a run directory.

    Raises :class:`~zmqrl.config.ConfigError` for a path that is not a run directory (or a bad
    checkpoint name) and :class:`~zmqrl.run.checkpoint.CheckpointError` for a missing or unreadable
    checkpoint, each naming the path.
    """
    return TrainedPolicy(run_dir, checkpoint, backend)
