"""The bookkeeping shared by the single-process trainer and the distributed learner.

Counters, intervals, evaluation results, best/periodic/latest checkpoints, TensorBoard records,
the progress view and ``summary.json`` live here, once. The two trainers differ only in where
transitions come from (a local env loop or the network) and who evaluates (in-process or an
evaluator role).
"""

from __future__ import annotations

import collections
import copy
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from zmqrl.config import Config, to_flat_dict
from zmqrl.core import Agent, Recorder, ReplayBuffer
from zmqrl.replay.prioritized import PrioritizedReplay
from zmqrl.run import checkpoint
from zmqrl.run.costs import ComputeCost
from zmqrl.run.record import Progress
from zmqrl.run.resume import ResumePoint
from zmqrl.run.rundir import BEST, LATEST, RunDir, write_json_atomic
from zmqrl.run.trackers import open_recorders

if TYPE_CHECKING:
    pass

log = logging.getLogger("zmqrl")

FileWriters = Mapping[str, Callable[[Path], None]]  # extra files of a checkpoint: name -> writer(path)
EVAL_HISTORY = 1000  # evaluations kept in memory, summary.json and state.json (the newest; TensorBoard has all)


def replay_values(replay: ReplayBuffer) -> dict[str, float]:
    """TensorBoard scalars of a replay buffer: its size, its image frames per item where it keeps each
    frame once, and, for prioritized replay, the largest and mean stored priority and the raw
    priorities clamped so far (where Q values run away, the priorities show it first)."""
    values = {"perf/replay_size": float(len(replay))}
    frames = getattr(replay, "frames_held", 0)
    if frames and len(replay):  # image frames kept once: distinct frames per item held
        values["perf/replay_frames_per_item"] = frames / len(replay)
    if isinstance(replay, PrioritizedReplay) and len(replay):
        values["perf/priority_max"] = float(replay.max_priority)
        values["perf/priority_mean"] = replay.tree.total() / len(replay)
        values["perf/priorities_clamped"] = float(replay.priorities_clamped)
    return values


class Rate:
    """Events per second over the interval since the last reading."""

    def __init__(self) -> None:
        self._t = time.monotonic()
        self._n = 0

    def read(self, total: int) -> float:
        now = time.monotonic()
        rate = (total - self._n) / max(now - self._t, 1e-9)
        self._t, self._n = now, total
        return rate


class ReplayCheckpointer:
    """Puts the replay contents into ``checkpoints/latest`` as :data:`~zmqrl.run.checkpoint.REPLAY_FILE`.

    :meth:`snapshot` copies the buffer in memory (a memcpy) on the training thread and returns
    the writer of that copy, so the file can be written off the training loop; it is one of
    the files of the checkpoint directory, renamed into place with the rest, so a ``latest``
    never pairs with another checkpoint's replay. A replay on a torch device is copied through
    its own ``snapshot()``: its host side, which holds everything its file does, and nothing on the device.
    """

    def __init__(self, replay: ReplayBuffer) -> None:
        self.replay = replay
        self.saved = 0  # snapshots written

    def snapshot(self, opt_steps: int, copy_now: bool = True) -> Callable[[Path], None]:
        """The writer of the replay as it is now (a copy when ``copy_now``, else the live buffer,
        which must then not change until the writer has run)."""
        snapshot = getattr(self.replay, "snapshot", None)
        replay = (snapshot() if snapshot is not None else copy.deepcopy(self.replay)) if copy_now else self.replay

        def write(path: Path) -> None:
            replay.save(str(path), stamp={"opt_steps": opt_steps})
            self.saved += 1
        return write



@dataclass(frozen=True)
class ModelPoint:
    """Where a run was when a model was made: its optimisation step, env step and wall time (seconds)."""

    opt_steps: int
    env_steps: int
    wall_s: float


class Bookkeeper:
    """Counts steps, decides when to record, evaluate, save and stop, and writes the run directory.

    Nothing here needs torch until the first checkpoint or record: the agent may be attached
    later (the learner counts incoming batches while torch loads), and the TensorBoard writer
    is opened on first use (or ahead of time with :meth:`open_recorder`, off the main thread).
    """

    def __init__(self, cfg: Config, run_dir: Path, agent: Agent | None,
                 extra_state: Callable[[], dict[str, Any]] | None = None, replay: ReplayBuffer | None = None,
                 extra_files: Callable[[], FileWriters] | None = None) -> None:
        self.cfg = cfg
        self.cost = ComputeCost()  # where the loop's time goes (it times its own parts)
        self.tc = cfg.trainer
        self.dir = run_dir
        self.run = RunDir(run_dir)
        self.agent = agent
        self.extra_state = extra_state or (lambda: {})
        self.extra_files = extra_files or (lambda: {})  # taken on the training thread at every save
        self._recorder: Recorder | None = None
        self._recorder_lock = threading.Lock()
        self.progress = Progress(self.tc.max_opts)
        self.env_steps = 0
        self.opt_steps = 0
        self.episodes = 0
        self.version = 0
        self.elapsed_before = 0.0
        self.start = time.monotonic()
        self.best_eval = -math.inf
        self.last_eval: float | None = None
        self.evals: list[dict[str, Any]] = []  # the last EVAL_HISTORY evaluations
        self.evals_total = 0
        self.solved: dict[str, Any] | None = None
        self.recent_returns: collections.deque[float] = collections.deque(maxlen=100)
        self.recent_lengths: collections.deque[int] = collections.deque(maxlen=100)
        self._metrics: dict[str, list[float]] = collections.defaultdict(list)
        self._env_rate, self._opt_rate = Rate(), Rate()
        self.stop_reason = ""
        self._last_latest = time.monotonic()
        self.replay_ckpt = ReplayCheckpointer(replay) if replay is not None and \
            cfg.trainer.checkpoint_replay else None
        self._latest_writer: threading.Thread | None = None  # writes checkpoints/latest with the replay
        self.latest_skipped = 0  # refreshes of latest skipped because the previous one was still being written

    # --- records (run.trackers) --------------------------------------------------------------
    @property
    def recorder(self) -> Recorder:
        """The trackers ``run.trackers`` names, behind one recorder (TensorBoard imports torch's
        SummaryWriter on first use)."""
        return self._recorder or self.open_recorder()

    def open_recorder(self) -> Recorder:
        """Open the trackers now (safe from any thread) and write the config text once."""
        with self._recorder_lock:
            if self._recorder is None:
                recorder = open_recorders(self.cfg, self.dir)
                recorder.text("config", "```\n" + "\n".join(f"{k}: {v}" for k, v in to_flat_dict(self.cfg).items())
                              + "\n```")
                self._recorder = recorder
            return self._recorder

    # --- counters ---------------------------------------------------------------------------
    @property
    def wall_s(self) -> float:
        return self.elapsed_before + time.monotonic() - self.start

    def add_env_steps(self, n: int) -> None:
        self.env_steps += n

    def add_episodes(self, returns: list[float], lengths: list[int]) -> None:
        self.episodes += len(returns)
        self.recent_returns.extend(returns)
        self.recent_lengths.extend(lengths)

    def opt_step(self, metrics: Mapping[str, float], perf: Callable[[], Mapping[str, float]] | None = None,
                 save: bool = True) -> None:
        """Count one optimisation step; record and (unless ``save`` is False: call :meth:`save_due`
        once the step's work is done) save when their intervals come up."""
        self.opt_steps += 1
        for key, value in metrics.items():
            self._metrics[key].append(value)
        if self.opt_steps % self.tc.record_interval == 0:
            self.record(perf() if perf else {})
        if save:
            self.save_due()

    def save_due(self) -> None:
        """The numbered checkpoint and ``latest`` when their intervals have come up."""
        if self.tc.save_interval and self.opt_steps % self.tc.save_interval == 0:
            self.save(str(self.opt_steps))
            self.save(LATEST)
        elif self.tc.latest_interval_s and time.monotonic() - self._last_latest >= self.tc.latest_interval_s:
            self.save(LATEST)

    def save_due_at(self, opt_steps: int) -> bool:
        """Whether :meth:`save_due` would write a checkpoint once ``opt_steps`` steps are counted (the
        time-based ``latest`` as of now)."""
        tc = self.tc
        return bool(tc.save_interval and opt_steps % tc.save_interval == 0) or bool(
            tc.latest_interval_s and time.monotonic() - self._last_latest >= tc.latest_interval_s)

    def eval_due(self) -> bool:
        return self.opt_steps % self.tc.eval_interval == 0

    # --- records ----------------------------------------------------------------------------
    def train_return(self) -> float | None:
        return float(np.mean(self.recent_returns)) if self.recent_returns else None

    def record(self, extra: Mapping[str, float]) -> None:
        """Write ``train/`` and ``perf/`` scalars for the interval just ended, and the progress line."""
        values: dict[str, float] = {f"train/{k}": float(np.mean(v)) for k, v in self._metrics.items() if v}
        self._metrics.clear()
        if self.recent_returns:
            values["train/episode_return"] = float(np.mean(self.recent_returns))
            values["train/episode_length"] = float(np.mean(self.recent_lengths))
        values["train/episodes"] = float(self.episodes)
        values["perf/env_steps_per_s"] = self._env_rate.read(self.env_steps)
        values["perf/opt_steps_per_s"] = self._opt_rate.read(self.opt_steps)
        values["perf/replay_samples_per_s"] = values["perf/opt_steps_per_s"] * self.cfg.agent.batch_size
        values["perf/env_steps"] = float(self.env_steps)
        values["perf/wall_s"] = self.wall_s
        values.update(self.cost.interval())
        values.update(extra)
        self.recorder.scalars(self.opt_steps, values)
        self.progress.update(self.opt_steps, {
            "env": self.env_steps, "ret": self.train_return(), "eval": self.last_eval,
            "best": self.best_eval if self.evals else None,
            "env/s": round(values["perf/env_steps_per_s"]), "opt/s": round(values["perf/opt_steps_per_s"]),
        })

    def point(self) -> ModelPoint:
        """Where the run is now: the point of a model made now."""
        return ModelPoint(self.opt_steps, self.env_steps, round(self.wall_s, 2))

    def evaluation(self, returns: list[float], lengths: list[int], version: int | None = None,
                   save_best: bool = True, at: ModelPoint | None = None) -> bool:
        """Take a greedy evaluation of the model made at ``at`` (by default: now); returns whether it
        is a new best. It is recorded at that model's optimisation step, env step and wall time --
        wherever the run has got to by the time the report arrives (``arrived_opt_steps``)."""
        at = at or self.point()
        mean = float(np.mean(returns))
        self.last_eval = mean
        entry = {"opt_steps": at.opt_steps, "env_steps": at.env_steps, "wall_s": round(at.wall_s, 2),
                 "version": self.version if version is None else version, "return_mean": mean,
                 "return_std": float(np.std(returns)), "episodes": len(returns)}
        if at.opt_steps != self.opt_steps:
            entry["arrived_opt_steps"] = self.opt_steps
        self.evals.append(entry)
        self.evals_total += 1
        if len(self.evals) > EVAL_HISTORY:
            del self.evals[:-EVAL_HISTORY]
        self.recorder.scalars(at.opt_steps, {
            "eval/return_mean": mean, "eval/return_std": entry["return_std"],
            "eval/length_mean": float(np.mean(lengths)), "eval/env_steps": float(at.env_steps),
            "eval/wall_s": float(at.wall_s)})
        improved = mean > self.best_eval
        if improved:
            self.best_eval = mean
            if save_best:
                self.save_best(mean, at)
        late = f", reported at opt {self.opt_steps}" if at.opt_steps != self.opt_steps else ""
        log.info("eval at opt %d (env %d, %.1fs%s): return %.1f ± %.1f over %d episodes%s", at.opt_steps,
                 at.env_steps, at.wall_s, late, mean, entry["return_std"], len(returns),
                 "  (new best)" if improved else "")
        target = self.tc.stop_return
        if self.solved is None and target is not None and mean >= target:
            self.solved = {k: entry[k] for k in ("opt_steps", "env_steps", "wall_s", "return_mean")}
        return improved

    def should_stop(self) -> bool:
        if self.opt_steps >= self.tc.max_opts:
            self.stop_reason = f"reached max_opts={self.tc.max_opts}"
        elif self.tc.max_seconds and self.wall_s >= self.tc.max_seconds:
            self.stop_reason = f"reached max_seconds={self.tc.max_seconds}"
        elif self.solved is not None:
            self.stop_reason = f"evaluation reached stop_return={self.tc.stop_return}"
        return bool(self.stop_reason)

    # --- checkpoints ------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Counters and schedules for ``state.json``."""
        return {"env_steps": self.env_steps, "opt_steps": self.opt_steps, "episodes": self.episodes,
                "version": self.version, "best_eval": self.best_eval if self.evals else None,
                "elapsed_s": self.wall_s, "evals": self.evals,
                "evals_total": self.evals_total, "recent_returns": list(self.recent_returns),
                "recent_lengths": list(self.recent_lengths), **self.extra_state()}

    def save_best(self, eval_return: float, at: ModelPoint) -> Path:
        """``checkpoints/best``: the policy that earned the best evaluation so far, alone (``policy.npz``),
        as the evaluator keeps it in a distributed run; the training state lives in ``latest`` and the
        numbered checkpoints."""
        state = {**self.state(), "opt_steps": at.opt_steps, "env_steps": at.env_steps, "eval_return": eval_return,
                 "source": "train", "training_state": False}
        state.pop("evals", None)
        return checkpoint.save_policy(self.run.checkpoint(BEST), self._attached().params(), state)

    def _attached(self) -> Agent:
        if self.agent is None:
            raise RuntimeError("Bookkeeper: no agent attached yet")
        return self.agent

    def save(self, name: str, extra: dict[str, Any] | None = None, background: bool = True) -> Path:
        """Write ``checkpoints/NAME`` with the agent, :meth:`state` and the extra files.

        ``latest`` also holds the replay contents with ``trainer.checkpoint_replay``. Everything
        is taken here, on the training thread (the replay as an in-memory copy); with
        ``background`` that checkpoint is then written by a thread, renamed into place only once
        every file is complete. A refresh asked for while the previous one is still being
        written is skipped, which leaves that one's files together; a save with ``background``
        False waits for it first.
        """
        import torch

        latest_with_replay = name == LATEST and self.replay_ckpt is not None
        in_background = latest_with_replay and background
        if name == LATEST:
            if in_background and self.saving():
                self.latest_skipped += 1
                return self.run.checkpoint(name)
            self.wait_saves()
            self._last_latest = time.monotonic()
        agent = self._attached()
        agent_state = dict(agent.state_dict())
        if in_background:
            agent_state = copy.deepcopy(agent_state)  # the tensors move on while the thread writes
        agent_state["torch_rng"] = torch.get_rng_state()
        agent_state[checkpoint.POLICY_KEY] = checkpoint.policy_tensors(agent.params())
        state = {**self.state(), **(extra or {})}
        files = dict(self.extra_files())
        if latest_with_replay:
            assert self.replay_ckpt is not None
            files[checkpoint.REPLAY_FILE] = self.replay_ckpt.snapshot(self.opt_steps, copy_now=in_background)
        path = self.run.checkpoint(name)
        if not in_background:
            return checkpoint.save(path, agent_state, state, extra_files=files)
        self._latest_writer = threading.Thread(target=self._write_latest, args=(path, agent_state, state, files),
                                               name="latest-save", daemon=True)
        self._latest_writer.start()
        return path

    def _write_latest(self, path: Path, agent_state: dict[str, Any], state: dict[str, Any],
                      files: FileWriters) -> None:
        try:
            checkpoint.save(path, agent_state, state, extra_files=files)
        except Exception as exc:  # the previous latest stays whole; the next refresh tries again
            log.error("could not write %s: %s: %s", path, type(exc).__name__, exc)

    def saving(self) -> bool:
        """Whether a ``latest`` is being written in the background."""
        return self._latest_writer is not None and self._latest_writer.is_alive()

    def wait_saves(self, timeout: float | None = None) -> None:
        """Wait for a ``latest`` being written in the background."""
        if self._latest_writer is not None:
            self._latest_writer.join(timeout)

    def resume(self, point: ResumePoint) -> None:
        """Take the counters, evaluations and torch's RNG of a checkpoint read by :func:`read_resume_point`."""
        import torch

        state = point.state
        if point.torch_rng is not None:
            torch.set_rng_state(point.torch_rng.cpu())
        for key in ("env_steps", "opt_steps", "episodes", "version"):
            setattr(self, key, int(state.get(key, 0)))
        self.elapsed_before = float(state.get("elapsed_s", 0.0))
        self.start = time.monotonic()
        self.evals = list(state.get("evals", []))[-EVAL_HISTORY:]
        self.evals_total = int(state.get("evals_total", len(self.evals)))
        if state.get("best_eval") is not None:
            self.best_eval = float(state["best_eval"])
        if self.evals:
            self.last_eval = float(self.evals[-1]["return_mean"])
        self.recent_returns.extend(float(r) for r in state.get("recent_returns", []))
        self.recent_lengths.extend(int(n) for n in state.get("recent_lengths", []))
        self._env_rate, self._opt_rate = Rate(), Rate()
        self._env_rate.read(self.env_steps)
        self._opt_rate.read(self.opt_steps)


    # --- the end ----------------------------------------------------------------------------
    def summary(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        wall = self.wall_s
        return {
            "name": self.cfg.run.name, "env_id": self.cfg.env.id, "seed": self.cfg.run.seed,
            "env_steps": self.env_steps, "opt_steps": self.opt_steps, "episodes": self.episodes,
            "model_version": self.version, "wall_s": round(wall, 3),
            "env_steps_per_s": self.env_steps / max(wall, 1e-9),
            "opt_steps_per_s": self.opt_steps / max(wall, 1e-9),
            "replay_samples_per_s": self.opt_steps * self.cfg.agent.batch_size / max(wall, 1e-9),
            "compute_cost": self.cost.run(),
            "best_eval_return": self.best_eval if self.evals else None,
            "last_eval_return": self.last_eval, "train_return_recent": self.train_return(),
            "solved": self.solved, "stop_reason": self.stop_reason, "evals": self.evals,
            "evals_total": self.evals_total,
            **(extra or {}),
        }

    def write_summary(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        summary = self.summary(extra)
        write_json_atomic(self.run.summary, summary)
        return summary

    def finish(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Final record, ``checkpoints/latest``, hyperparameter table, ``summary.json``."""
        self.progress.close()
        self.save(LATEST, background=False)
        summary = self.write_summary(extra)
        metrics = {"best_eval_return": summary["best_eval_return"] or float("nan"),
                   "env_steps": float(self.env_steps), "wall_s": float(summary["wall_s"])}
        self.recorder.hparams(to_flat_dict(self.cfg), metrics)
        self.recorder.artifacts(self.dir)
        self.recorder.close()
        return summary

    def close_recorder(self, failed: bool) -> None:
        """Close the trackers of a run that ends without :meth:`finish` (``failed``: it ended in an error)."""
        if self._recorder is not None:
            self._recorder.close(failed=failed)
