"""The one start-up of a run, shared by ``zmqrl train`` and the learner (:func:`open_run`)."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zmqrl.agents.base import algorithm
from zmqrl.config import Config, ConfigError, dump
from zmqrl.core import Agent, ReplayBuffer
from zmqrl.replay import make_replay
from zmqrl.run import checkpoint, user_callables
from zmqrl.run.bookkeeping import Bookkeeper, FileWriters
from zmqrl.run.resume import ResumePoint, read_resume_point, require_checkpoint
from zmqrl.run.rewards import RewardScale
from zmqrl.run.rundir import RunDir
from zmqrl.run.trackers import check_trackers

log = logging.getLogger("zmqrl")

STACKING_WRAPPERS = ("atari", "frame_stack")  # wrappers that stack env.frame_stack frames on axis 0


@dataclass
class Run:
    """A run opened for training (:func:`open_run`)."""

    dir: Path
    replay: ReplayBuffer
    book: Bookkeeper
    agent: Agent | None  # the agent, when it was built here (``make_agent``) or given
    point: ResumePoint | None  # the checkpoint it continues from, with ``--resume``
    rewards: RewardScale  # the factor on stored rewards at every update (saved with checkpoints)


def open_run(cfg: Config, run_dir: str | Path | None, spec: Mapping[str, tuple[np.dtype, tuple[int, ...]]], *,
             resume: bool = False, agent: Agent | Callable[[], Agent] | None = None,
             restore: Callable[[ResumePoint], None] | None = None,
             extra_state: Callable[[], dict[str, Any]] | None = None,
             extra_files: Callable[[], FileWriters] | None = None, label: str = "") -> Run:
    """Start a run: what ``zmqrl train`` and the learner both do before their loops.

    0. The trackers ``run.trackers`` names are installed (and MLflow has a server).
    1. With ``resume``, check that the run directory holds a readable ``checkpoints/latest``, before
       anything slow or anything written.
    2. The replay the config asks for (``spec``, the algorithm's batch spec, fixes its arrays).
    3. The agent: given, or built by ``agent()`` (torch loads here); None leaves it to the caller
       (the learner builds it in the background while data comes in), which attaches it to the
       bookkeeping later. With ``resume`` an agent is needed: the checkpoint is loaded into it and
       the replay, and ``restore`` takes the caller's own parts of it (loop counters, env state,
       the rate limiter); every part is checked before anything is written.
    4. The run directory and its ``config.yaml``.
    5. The bookkeeping, taking the checkpoint's counters, evaluations and RNG; what is not exact
       about the resume is logged (``label``, e.g. ``learner``, starts its lines). Checkpoints carry
       the reward factor (:mod:`zmqrl.run.rewards`) beside ``extra_state``'s parts.
    """
    target = run_dir or cfg.run.run_dir
    check_trackers(cfg)
    require_checkpoint(target, resume)
    replay = make_replay_from(cfg, spec)
    built = agent() if callable(agent) else agent
    rewards = RewardScale(cfg.env)
    point = None
    if resume:
        if built is None:
            raise ValueError("open_run: resuming needs the agent (or a function that builds it)")
        assert target  # checked by require_checkpoint
        point = read_resume_point(cfg, target, built, replay)
        if restore is not None:
            restore(point)
        if "reward_scale" in point.state:
            try:
                rewards.load_state_dict(point.state["reward_scale"], str(point.directory / checkpoint.STATE_FILE))
            except ValueError as exc:
                raise checkpoint.CheckpointError(str(exc)) from None
        elif rewards.auto:
            point.notes.append("the checkpoint holds no reward factor (written by an earlier version): it is "
                               "measured again once replay is warm")

    def state() -> dict[str, Any]:
        return {**(extra_state() if extra_state is not None else {}), "reward_scale": rewards.state_dict()}

    path = prepare_run_dir(cfg, run_dir)
    book = Bookkeeper(cfg, path, built, extra_state=state, replay=replay, extra_files=extra_files)
    if point is not None:
        book.resume(point)
        who = f"{label}: " if label else ""
        log.info("%sresumed from %s at opt step %d (%d env steps, model version %d) with %d transitions in replay",
                 who, point.directory, book.opt_steps, book.env_steps, book.version, len(replay))
        if point.notes:
            log.warning("%sthe resume is not exact: %s", who, "; ".join(point.notes))
        else:
            log.info("%sthe resume is exact: agent, RNGs, envs, pending n-step transitions and replay restored", who)
    return Run(path, replay, book, built, point, rewards)


def make_replay_from(cfg: Config, spec: Mapping[str, tuple[np.dtype, tuple[int, ...]]] | None = None, *,
                     torch_device: str | None = None, sum_tree: str = "host") -> ReplayBuffer:
    """The configured replay; image frames are stored once unless ``replay.dedup_frames`` is off. An
    algorithm that keeps its items otherwise makes its own store instead
    (:meth:`~zmqrl.agents.base.Algorithm.make_store`: an on-policy FIFO of segments).

    ``spec`` (the algorithm's batch spec) fixes the stored arrays before any batch arrives. On the host
    (``replay.device`` cpu, or auto with the learner off CUDA) it is torch-free, so the learner can build its
    replay and start inserting before torch has loaded; on a torch device (:func:`replay_device`) it is
    :mod:`zmqrl.replay.device`'s, the one place that module is imported. ``torch_device`` puts it on that
    torch device whatever the config says (the bench's torch replay on the CPU), ``sum_tree`` (host or
    device) is where its prioritized sampling searches.
    """
    store = algorithm(cfg.agent.algo).make_store(cfg, spec or {})
    if store is not None:  # the algorithm keeps its items otherwise (an on-policy FIFO of segments)
        return store
    r = cfg.replay
    stacked = any(w in STACKING_WRAPPERS for w in cfg.env.wrappers)
    frame_stack = 0 if not r.dedup_frames else cfg.env.frame_stack if stacked else 1
    options = {"alpha": r.alpha, "beta0": r.beta0, "beta_steps": r.beta_steps, "eps": r.priority_eps}
    device = torch_device or replay_device(cfg)
    if device is None:
        return make_replay(r.capacity, r.prioritized, seed=cfg.run.seed + 7, frame_stack=frame_stack, schema=spec,
                           compress=r.compress, **options)
    from zmqrl.replay.device import make_device_replay

    replay = make_device_replay(device, r.capacity, r.prioritized, seed=cfg.run.seed + 7, frame_stack=frame_stack,
                                schema=spec, compress=r.compress, sum_tree=sum_tree, **options)
    log.info("replay on %s (%s): %.2f GiB there for %s transitions", device,
             f"replay.device={r.device}" if torch_device is None else "asked for", replay.planned_nbytes() / 2**30,
             f"{r.capacity:,}")
    return replay


def replay_device(cfg: Config) -> str | None:
    """The torch device ``replay.device`` keeps replay on, or None for host memory (numpy).

    ``auto`` is the learner's device (``run.device``) where that is CUDA, and the host otherwise, and for
    algorithms that read their sampled items on the host (sequences: R2D2); without a GPU driver on this
    host it decides so without importing torch. ``cuda`` is the learner's CUDA device; a ConfigError naming
    ``replay.device`` where there is none.
    """
    setting, learner = cfg.replay.device, cfg.run.device
    if setting == "cpu" or (setting == "auto" and (type(cfg.agent).SEQUENCES or learner == "cpu"
                                                   or (learner == "auto" and not _gpu_driver_here()))):
        return None
    import torch

    from zmqrl.agents.torch_util import resolve_device

    if setting == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"replay.device: cuda requested but no CUDA device is available here (run.device={learner})"
                          "; set replay.device to auto or cpu")
    device = resolve_device(learner)
    if device.type == "cuda":
        return str(device)
    if setting == "auto":
        return None
    raise ConfigError(f"replay.device: cuda keeps replay on the learner's CUDA device, but run.device={learner} is "
                      f"{device}; set run.device to cuda, or replay.device to auto or cpu")


def _gpu_driver_here() -> bool:
    """Whether this host may have a CUDA device: torch, if loaded, says; otherwise a GPU driver's device node
    (NVIDIA's, or ROCm's for torch on AMD) and a ``CUDA_VISIBLE_DEVICES`` that leaves a device."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return bool(torch.cuda.is_available())
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return any(os.path.exists(node) for node in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd"))


def prepare_run_dir(cfg: Config, run_dir: str | Path | None) -> Path:
    """Create the run directory and write the resolved ``config.yaml``."""
    if not run_dir:
        run_dir = cfg.run.run_dir or f"runs/{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run = RunDir(run_dir)
    run.checkpoints.mkdir(parents=True, exist_ok=True)
    run.tb.mkdir(exist_ok=True)
    cfg.run.run_dir = str(run.path)
    dump(user_callables.portable(cfg, run.path), run.config)  # callables files named relative to the run directory
    return run.path
