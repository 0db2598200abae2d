"""Single-process training: the same agents, replay and configs as a distributed run, no sockets.

The loop is border's ``Trainer``: step the envs, turn steps into n-step transitions, and once
``trainer.warmup`` transitions are stored, run one optimisation step every
``trainer.opt_interval`` transitions. Evaluation, checkpoints, records and the summary come
from :class:`zmqrl.bookkeeping.Bookkeeper`, shared with the learner.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from zmqrl import checkpoint
from zmqrl.agents import make_agent, resolve_device
from zmqrl.bookkeeping import Bookkeeper, make_replay_from, prepare_run_dir
from zmqrl.config import Config, ConfigError
from zmqrl.envs import GreedyEvaluator, VectorStepper, check_env, make_vector_env, spaces
from zmqrl.lifecycle import StopFlag, seed_everything
from zmqrl.replay import NStepBuilder

log = logging.getLogger("zmqrl")


def linear_epsilon(step: int, start: float, end: float, decay_steps: int) -> float:
    """Epsilon after ``step`` env steps of a linear decay from ``start`` to ``end``."""
    if decay_steps <= 0:
        return end
    return end + (start - end) * max(0.0, 1.0 - step / decay_steps)


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


def train(cfg: Config, run_dir: str | Path | None = None, resume: bool = False) -> dict[str, Any]:
    """Train in this process; returns the summary written to ``summary.json``."""
    torch.set_num_threads(1)
    seed = cfg.run.seed
    seed_everything(seed)
    check_env(cfg.env)
    device = resolve_device(cfg.run.device)
    require_checkpoint(run_dir or cfg.run.run_dir, resume)
    path = prepare_run_dir(cfg, run_dir)
    obs_space, act_space = spaces(cfg.env)
    agent = make_agent(cfg.agent, obs_space, act_space, device=device, seed=seed)
    replay = make_replay_from(cfg)
    book = Bookkeeper(cfg, path, agent, extra_state=lambda: {"replay": replay.state_dict()}, replay=replay)
    if resume:
        state = book.restore("latest")
        restore_replay(book, replay, state)
        log.info("resumed from %s at opt step %d with %d transitions in replay", path / "checkpoints/latest",
                 book.opt_steps, len(replay))

    num_envs = cfg.env.num_envs
    stepper = VectorStepper(make_vector_env(cfg.env, num_envs, seed), seed)
    nstep = NStepBuilder(num_envs, cfg.agent.n_step, cfg.agent.gamma)
    evaluator = GreedyEvaluator(cfg.env, cfg.trainer.eval_episodes, seed + 1_000_000)
    tc, ac = cfg.trainer, cfg.agent
    log.info("training %s on %s in %s (device %s)", ac.algo, cfg.env.id, path, device)

    opt_credit = 0.0
    with StopFlag() as stop:
        while not stop.set and not book.should_stop():
            eps = linear_epsilon(book.env_steps, ac.eps_start, ac.eps_end, ac.eps_decay_steps)
            step = stepper.step(agent.act(stepper.obs, eps))
            book.add_env_steps(num_envs)
            book.add_episodes(step.episode_returns, step.episode_lengths)
            transitions = nstep.push(step.obs, step.action, step.reward, step.next_obs,
                                     step.terminated, step.truncated)
            if transitions is not None:
                replay.add(transitions)
            if len(replay) < tc.warmup:
                continue
            opt_credit += num_envs / tc.opt_interval
            while opt_credit >= 1.0 and not book.should_stop():
                opt_credit -= 1.0
                batch = replay.sample(ac.batch_size)
                metrics, priorities = agent.update(batch)
                if priorities is not None:
                    replay.update_priorities(batch["indices"], priorities)
                book.opt_step({**metrics, "epsilon": eps},
                              perf=lambda: {"perf/replay_size": float(len(replay)),
                                            "perf/beta": float(getattr(replay, "beta", 1.0))})
                if book.eval_due():
                    returns, lengths = evaluator.run(agent.greedy)
                    book.evaluation(returns, lengths, version=book.opt_steps)
    if stop.set:
        book.stop_reason = "interrupted"
    stepper.close()
    evaluator.close()
    summary = book.finish({"replay_size": len(replay)})
    log.info("done (%s): %d env steps, %d opt steps in %.1fs, best eval %s", book.stop_reason,
             book.env_steps, book.opt_steps, summary["wall_s"], summary["best_eval_return"])
    return summary
