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

from zmqrl.acting import ActingLoop, make_task
from zmqrl.agents.torch_util import resolve_device
from zmqrl.bookkeeping import Bookkeeper, make_replay_from, prepare_run_dir, require_checkpoint, restore_replay
from zmqrl.config import Config
from zmqrl.envs import GreedyEvaluator
from zmqrl.lifecycle import StopFlag, seed_everything
from zmqrl.record import print_run_table

log = logging.getLogger("zmqrl")


def train(cfg: Config, run_dir: str | Path | None = None, resume: bool = False) -> dict[str, Any]:
    """Train in this process; returns the summary written to ``summary.json``."""
    torch.set_num_threads(1)
    seed = cfg.run.seed
    seed_everything(seed)
    task = make_task(cfg)
    device = resolve_device(cfg.run.device)
    require_checkpoint(run_dir or cfg.run.run_dir, resume)
    path = prepare_run_dir(cfg, run_dir)
    agent = task.agent(device=device, seed=seed)
    replay = make_replay_from(cfg, task.batch_spec())
    book = Bookkeeper(cfg, path, agent, extra_state=lambda: {"replay": replay.state_dict()}, replay=replay)
    if resume:
        state = book.restore("latest")
        restore_replay(book, replay, state)
        log.info("resumed from %s at opt step %d with %d transitions in replay", path / "checkpoints/latest",
                 book.opt_steps, len(replay))

    loop = ActingLoop(cfg, agent, task.exploration(None), seed, env_steps=book.env_steps)
    evaluator = GreedyEvaluator(cfg.env, cfg.trainer.eval_episodes, seed + 1_000_000)
    tc, batch_size = cfg.trainer, cfg.agent.batch_size
    explore_tag = loop.exploration.name
    log.info("training %s on %s in %s (device %s)", cfg.agent.algo, cfg.env.id, path, device)

    opt_credit = 0.0
    with StopFlag() as stop:
        while not stop.set and not book.should_stop():
            acted = loop.step()
            book.add_env_steps(loop.num_envs)
            book.add_episodes(acted.episode_returns, acted.episode_lengths)
            if acted.transitions is not None:
                replay.add(acted.transitions)
            if len(replay) < tc.warmup:
                continue
            opt_credit += loop.num_envs / tc.opt_interval
            while opt_credit >= 1.0 and not book.should_stop():
                opt_credit -= 1.0
                batch = replay.sample(batch_size)
                metrics, priorities = agent.update(batch)
                if priorities is not None:
                    replay.update_priorities(batch["indices"], priorities)
                book.opt_step({**metrics, explore_tag: acted.explore},
                              perf=lambda: {"perf/replay_size": float(len(replay)),
                                            "perf/beta": float(getattr(replay, "beta", 1.0))})
                if book.eval_due():
                    returns, lengths = evaluator.run(agent.greedy)
                    book.evaluation(returns, lengths, version=book.opt_steps)
    if stop.set:
        book.stop_reason = "interrupted"
    loop.close()
    evaluator.close()
    summary = book.finish({"replay_size": len(replay)})
    print_run_table(summary, path)
    return summary
