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
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from zmqrl import checkpoint
from zmqrl.config import Config, ConfigError, dump, to_flat_dict
from zmqrl.core import Agent
from zmqrl.record import Progress, TensorBoardRecorder
from zmqrl.replay import make_replay

if TYPE_CHECKING:
    import torch

log = logging.getLogger("zmqrl")

STACKING_WRAPPERS = ("atari", "frame_stack")  # wrappers that stack env.frame_stack frames on axis 0


def make_replay_from(cfg: Config, spec: Mapping[str, tuple[np.dtype, tuple[int, ...]]] | None = None) -> Any:
    """The configured replay; image frames are stored once unless ``replay.dedup_frames`` is off.

    ``spec`` (the algorithm's batch spec) fixes the stored arrays before any batch arrives.
    Torch-free, so the learner can build its replay and start inserting before torch has loaded.
    """
    r = cfg.replay
    stacked = any(w in STACKING_WRAPPERS for w in cfg.env.wrappers)
    frame_stack = 0 if not r.dedup_frames else cfg.env.frame_stack if stacked else 1
    return make_replay(r.capacity, r.prioritized, r.alpha, r.beta0, r.beta_steps, r.priority_eps,
                       seed=cfg.run.seed + 7, frame_stack=frame_stack, schema=spec)


def require_checkpoint(run_dir: str | Path | None, resume: bool) -> None:
    """Before touching anything: ``--resume`` needs a run directory with a readable latest checkpoint."""
    if not resume:
        return
    if not run_dir:
        raise ConfigError("--resume needs --run-dir (the run directory to continue)")
    checkpoint.resolve(Path(run_dir) / "checkpoints" / "latest")


def restore_replay(book: Bookkeeper, replay: Any, state: dict[str, Any]) -> None:
    """On resume: the saved replay contents when there are any (``trainer.checkpoint_replay``),
    else an empty buffer that keeps the sampling RNG, beta schedule and max priority."""
    if book.replay_ckpt is not None and book.replay_ckpt.restore():
        return
    if "replay" in state:
        replay.load_state_dict({**state["replay"], "ptr": 0, "size": 0})


def prepare_run_dir(cfg: Config, run_dir: str | Path | None) -> Path:
    """Create the run directory (DESIGN §4) and write the resolved ``config.yaml``."""
    if not run_dir:
        run_dir = cfg.run.run_dir or f"runs/{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = Path(run_dir)
    (path / "checkpoints").mkdir(parents=True, exist_ok=True)
    (path / "tb").mkdir(exist_ok=True)
    cfg.run.run_dir = str(path)
    dump(cfg, path / "config.yaml")
    return path


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
    """Saves replay contents next to ``checkpoints/latest`` without holding up training.

    The buffer is copied in memory (a memcpy) on the training thread, then written by a
    background thread through a temporary file and a rename. One write at a time: a save
    requested while the previous one is still running is skipped.
    """

    FILE = "replay.npz"

    def __init__(self, replay: Any, ckpt_dir: Path) -> None:
        self.replay = replay
        self.path = ckpt_dir / self.FILE
        self._thread: threading.Thread | None = None
        self.saved = 0

    def save(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        snapshot = copy.deepcopy(self.replay)
        self._thread = threading.Thread(target=self._write, args=(snapshot,), name="replay-save", daemon=True)
        self._thread.start()

    def _write(self, snapshot: Any) -> None:
        try:
            snapshot.save(str(self.path))
            self.saved += 1
        except OSError as exc:
            log.error("could not save replay to %s: %s", self.path, exc)

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def restore(self) -> bool:
        """Load saved replay contents if present; returns whether it did."""
        if not self.path.is_file():
            return False
        try:
            self.replay.load(str(self.path))
        except (OSError, ValueError, KeyError) as exc:
            raise checkpoint.CheckpointError(f"{self.path}: unreadable replay checkpoint: {exc}") from None
        log.info("restored %d transitions from %s", len(self.replay), self.path)
        return True


class Bookkeeper:
    """Counts steps, decides when to record, evaluate, save and stop, and writes the run directory.

    Nothing here needs torch until the first checkpoint or record: the agent may be attached
    later (the learner counts incoming batches while torch loads), and the TensorBoard writer
    is opened on first use (or ahead of time with :meth:`open_recorder`, off the main thread).
    """

    def __init__(self, cfg: Config, run_dir: Path, agent: Agent | None,
                 extra_state: Callable[[], dict[str, Any]] | None = None, replay: Any = None) -> None:
        self.cfg = cfg
        self.tc = cfg.trainer
        self.dir = run_dir
        self.ckpt_dir = run_dir / "checkpoints"
        self.agent = agent
        self.extra_state = extra_state or (lambda: {})
        self._recorder: TensorBoardRecorder | None = None
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
        self.evals: list[dict[str, Any]] = []
        self.solved: dict[str, Any] | None = None
        self.recent_returns: collections.deque[float] = collections.deque(maxlen=100)
        self.recent_lengths: collections.deque[int] = collections.deque(maxlen=100)
        self._metrics: dict[str, list[float]] = collections.defaultdict(list)
        self._env_rate, self._opt_rate = Rate(), Rate()
        self.stop_reason = ""
        self._last_latest = time.monotonic()
        self.replay_ckpt = ReplayCheckpointer(replay, self.ckpt_dir) if replay is not None and \
            cfg.trainer.checkpoint_replay else None

    # --- records (TensorBoard) ----------------------------------------------------------------
    @property
    def recorder(self) -> TensorBoardRecorder:
        """The TensorBoard writer (imports torch's SummaryWriter on first use)."""
        return self._recorder or self.open_recorder()

    def open_recorder(self) -> TensorBoardRecorder:
        """Open the TensorBoard writer now (safe from any thread) and write the config text once."""
        with self._recorder_lock:
            if self._recorder is None:
                recorder = TensorBoardRecorder(self.dir / "tb")
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

    def opt_step(self, metrics: Mapping[str, float], perf: Callable[[], Mapping[str, float]] | None = None) -> None:
        """Count one optimisation step; record and save when their intervals come up."""
        self.opt_steps += 1
        for key, value in metrics.items():
            self._metrics[key].append(value)
        if self.opt_steps % self.tc.record_interval == 0:
            self.record(perf() if perf else {})
        if self.tc.save_interval and self.opt_steps % self.tc.save_interval == 0:
            self.save(str(self.opt_steps))
            self.save("latest")
        elif self.tc.latest_interval_s and time.monotonic() - self._last_latest >= self.tc.latest_interval_s:
            self.save("latest")

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
        values["perf/env_steps"] = float(self.env_steps)
        values["perf/wall_s"] = self.wall_s
        values.update(extra)
        self.recorder.scalars(self.opt_steps, values)
        self.progress.update(self.opt_steps, {
            "env": self.env_steps, "ret": self.train_return(), "eval": self.last_eval,
            "best": self.best_eval if self.evals else None,
            "env/s": round(values["perf/env_steps_per_s"]), "opt/s": round(values["perf/opt_steps_per_s"]),
        })

    def evaluation(self, returns: list[float], lengths: list[int], version: int | None = None,
                   save_best: bool = True) -> bool:
        """Take a greedy evaluation; returns whether it is a new best."""
        mean = float(np.mean(returns))
        self.last_eval = mean
        entry = {"opt_steps": self.opt_steps, "env_steps": self.env_steps, "wall_s": round(self.wall_s, 2),
                 "version": self.version if version is None else version, "return_mean": mean,
                 "return_std": float(np.std(returns)), "episodes": len(returns)}
        self.evals.append(entry)
        self.recorder.scalars(self.opt_steps, {
            "eval/return_mean": mean, "eval/return_std": entry["return_std"],
            "eval/length_mean": float(np.mean(lengths)), "eval/env_steps": float(self.env_steps)})
        improved = mean > self.best_eval
        if improved:
            self.best_eval = mean
            if save_best:
                self.save("best", extra={"eval_return": mean})
        log.info("eval at opt %d (env %d, %.1fs): return %.1f ± %.1f over %d episodes%s", self.opt_steps,
                 self.env_steps, self.wall_s, mean, entry["return_std"], len(returns),
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
                "elapsed_s": self.wall_s, "evals": self.evals, **self.extra_state()}

    def _attached(self) -> Agent:
        if self.agent is None:
            raise RuntimeError("Bookkeeper: no agent attached yet")
        return self.agent

    def save(self, name: str, extra: dict[str, Any] | None = None) -> Path:
        import torch

        agent = self._attached()
        agent_state = dict(agent.state_dict())
        agent_state["torch_rng"] = torch.get_rng_state()
        agent_state[checkpoint.POLICY_KEY] = checkpoint.policy_tensors(agent.params())
        path = checkpoint.save(self.ckpt_dir / name, agent_state, {**self.state(), **(extra or {})})
        if name == "latest":
            self._last_latest = time.monotonic()
            if self.replay_ckpt is not None:
                self.replay_ckpt.save()
        return path

    def restore(self, name: str = "latest") -> dict[str, Any]:
        """Load ``checkpoints/NAME`` into the agent and counters; returns its state for the caller."""
        import torch

        agent_state, state = checkpoint.load(self.ckpt_dir / name, map_location=self.agent_device())
        torch_rng = agent_state.pop("torch_rng", None)
        agent_state.pop(checkpoint.POLICY_KEY, None)
        try:
            self._attached().load_state_dict(agent_state)
        except (KeyError, RuntimeError, ValueError) as exc:
            raise checkpoint.CheckpointError(
                f"{checkpoint.resolve(self.ckpt_dir / name) / checkpoint.AGENT_FILE}: does not fit this "
                f"config's agent: {exc}") from None
        if torch_rng is not None:
            torch.set_rng_state(torch_rng.cpu())
        for key in ("env_steps", "opt_steps", "episodes", "version"):
            setattr(self, key, int(state.get(key, 0)))
        self.elapsed_before = float(state.get("elapsed_s", 0.0))
        self.start = time.monotonic()
        self.evals = list(state.get("evals", []))
        if state.get("best_eval") is not None:
            self.best_eval = float(state["best_eval"])
        self._env_rate, self._opt_rate = Rate(), Rate()
        self._env_rate.read(self.env_steps)
        self._opt_rate.read(self.opt_steps)
        return state

    def agent_device(self) -> torch.device:
        import torch

        return getattr(self.agent, "device", torch.device("cpu"))

    # --- the end ----------------------------------------------------------------------------
    def summary(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        wall = self.wall_s
        return {
            "name": self.cfg.run.name, "env_id": self.cfg.env.id, "seed": self.cfg.run.seed,
            "env_steps": self.env_steps, "opt_steps": self.opt_steps, "episodes": self.episodes,
            "model_version": self.version, "wall_s": round(wall, 3),
            "env_steps_per_s": self.env_steps / max(wall, 1e-9),
            "opt_steps_per_s": self.opt_steps / max(wall, 1e-9),
            "samples_per_s": self.opt_steps * self.cfg.agent.batch_size / max(wall, 1e-9),
            "best_eval_return": self.best_eval if self.evals else None,
            "last_eval_return": self.last_eval, "train_return_recent": self.train_return(),
            "solved": self.solved, "stop_reason": self.stop_reason, "evals": self.evals,
            **(extra or {}),
        }

    def write_summary(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        summary = self.summary(extra)
        checkpoint.write_json_atomic(self.dir / "summary.json", summary)
        return summary

    def finish(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Final record, ``checkpoints/latest``, hyperparameter table, ``summary.json``."""
        self.progress.close()
        self.save("latest")
        if self.replay_ckpt is not None:
            self.replay_ckpt.wait(timeout=60)
        summary = self.write_summary(extra)
        metrics = {"best_eval_return": summary["best_eval_return"] or float("nan"),
                   "env_steps": float(self.env_steps), "wall_s": float(summary["wall_s"])}
        self.recorder.hparams(to_flat_dict(self.cfg), metrics)
        self.recorder.close()
        return summary
