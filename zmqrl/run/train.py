"""Single-process training: the same agents, replay and configs as a distributed run, no sockets.

The loop is border's ``Trainer``: step the envs, turn steps into n-step transitions (or sequence
items, for an algorithm that trains on sequences), and once ``trainer.warmup`` of them are stored,
run one optimisation step every ``trainer.opt_interval`` env steps (sequence items, for sequences:
replay, warm-up and the rate of updates count items, as Acme's and SEED RL's R2D2 do). An on-policy
algorithm's store (:class:`~zmqrl.core.OnPolicyStore`) sets the rate itself: once it holds a batch of
segments the loop trains on it for its ``agent.epochs`` passes, then acts again. Evaluation,
checkpoints, records and the summary come from :class:`zmqrl.run.bookkeeping.Bookkeeper`, shared
with the learner.

A run stopped by SIGINT/SIGTERM finishes its optimisation step, writes ``checkpoints/latest``
and exits; ``--resume`` continues it exactly (the same parameters as a run never stopped) when
``trainer.checkpoint_replay`` is on: every checkpoint holds the agent with its RNGs, the envs'
state, the adder's pending steps (and a recurrent policy's states) and this loop's counters, and
``latest`` the replay contents with their sampling RNG. Without the replay contents, or for an env
whose state cannot be captured whole, the resume is not exact and the log says so and why. The
checkpoint is read and checked before anything in the run directory is written.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from zmqrl.agents.torch_util import flush_denormals, resolve_device
from zmqrl.config import Config
from zmqrl.core import Agent, OnPolicyStore, ReplayBuffer
from zmqrl.envs.evaluator import GreedyEvaluator, evaluator_for
from zmqrl.run.acting import STATE_FILE as ENV_STATE_FILE
from zmqrl.run.acting import ActingLoop, Task, make_task
from zmqrl.run.bookkeeping import replay_values
from zmqrl.run.checkpoint import STATE_FILE, CheckpointError
from zmqrl.run.lifecycle import StopFlag, seed_everything
from zmqrl.run.record import print_run_table
from zmqrl.run.resume import ResumePoint
from zmqrl.run.startup import open_run

log = logging.getLogger("zmqrl")


@dataclass
class LoopCounters:
    """What the loop carries between iterations, saved in ``state.json`` under ``trainer``."""

    opt_credit: float = 0.0  # optimisation steps owed to the transitions collected so far
    eval_calls: int = 0  # greedy evaluations run (each draws its episodes' seeds from this count)

    def state(self) -> dict[str, Any]:
        return {"opt_credit": self.opt_credit, "eval_calls": self.eval_calls}

    def load(self, state: Any, where: Path) -> None:
        try:
            self.opt_credit = float(state["opt_credit"])
            self.eval_calls = int(state["eval_calls"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{where}: 'trainer' holds no loop counters: {exc}") from None


def train(cfg: Config, run_dir: str | Path | None = None, resume: bool = False) -> dict[str, Any]:
    """Train in this process; returns the summary written to ``summary.json``.

    Denormal floats are flushed to zero in the calling thread while it trains (:func:`flush_denormals`).
    """
    torch.set_num_threads(cfg.run.torch_threads)
    seed = cfg.run.seed
    seed_everything(seed)
    task = make_task(cfg)
    device = resolve_device(cfg.run.device)
    agent = task.agent(device=device, seed=seed)
    loop = ActingLoop(cfg, agent, task.exploration(None), seed)
    evaluator = evaluator_for(cfg, seed + 1_000_000)
    flushed_before = flush_denormals()
    try:
        return _train(cfg, run_dir, resume, task, agent, loop, evaluator, device)
    finally:
        flush_denormals(flushed_before)
        loop.close()
        evaluator.close()


def _restore(point: ResumePoint, loop: ActingLoop, counters: LoopCounters) -> None:
    """This loop's own parts of a checkpoint: its counters and the envs' state (notes say what is not exact)."""
    state_path = point.directory / STATE_FILE
    if "trainer" in point.state:
        counters.load(point.state["trainer"], state_path)
    else:
        point.notes.append(f"{state_path} holds no loop counters (written by an earlier version)")
    env_file = point.directory / ENV_STATE_FILE
    if env_file.is_file():
        point.notes += loop.restore(env_file, int(point.state.get("env_steps", 0)))
    else:
        loop.env_steps = int(point.state.get("env_steps", 0))
        point.notes.append(f"the checkpoint holds no {ENV_STATE_FILE}: the envs start new episodes")


def _train(cfg: Config, run_dir: str | Path | None, resume: bool, task: Task, agent: Agent, loop: ActingLoop,
           evaluator: GreedyEvaluator, device: Any) -> dict[str, Any]:
    counters = LoopCounters()
    replay: ReplayBuffer | None = None

    def extra_state() -> dict[str, Any]:
        counters.eval_calls = evaluator.calls
        assert replay is not None
        return {"replay": replay.state_dict(), "trainer": counters.state()}

    run = open_run(cfg, run_dir, task.batch_spec(), resume=resume, agent=agent,
                   restore=lambda point: _restore(point, loop, counters), extra_state=extra_state,
                   extra_files=lambda: {ENV_STATE_FILE: loop.snapshot()})
    replay, book, path, rewards = run.replay, run.book, run.dir, run.rewards
    loop.reward_factor = rewards.factor
    evaluator.calls = counters.eval_calls

    tc, batch_size, cost = cfg.trainer, cfg.agent.batch_size, book.cost
    per_item = type(cfg.agent).SEQUENCES  # updates owed per item inserted, not per env step
    # an on-policy store says itself how many updates it can serve (trainer.opt_interval is not used)
    on_policy = replay if isinstance(replay, OnPolicyStore) else None

    def perf() -> dict[str, float]:
        assert replay is not None
        return {**replay_values(replay), "perf/beta": float(getattr(replay, "beta", 1.0))}

    explore_tag = loop.exploration.name
    explore = loop.exploration.mean(max(loop.env_steps - loop.num_envs, 0))  # that of the last env step
    log.info("training %s on %s in %s (device %s)", cfg.agent.algo, cfg.env.id, path, device)
    try:
        with StopFlag() as stop:
            while not stop.set and not book.should_stop():
                # A resumed run first pays the steps it owes (once warm again, if its replay starts empty).
                if counters.opt_credit < 1.0 or len(replay) < tc.warmup:
                    t0 = time.perf_counter()
                    acted = loop.step()
                    explore = acted.explore
                    book.add_env_steps(acted.env_steps)
                    book.add_episodes(acted.episode_returns, acted.episode_lengths)
                    t1 = time.perf_counter()
                    if acted.transitions is not None:
                        replay.add(acted.transitions)
                        rewards.observe(acted.transitions)
                    cost.add("act", t1 - t0)
                    cost.add("insert", time.perf_counter() - t1)
                    if len(replay) < tc.warmup:
                        continue
                    if rewards.settle_due and rewards.settle():
                        rewards.level_priorities(replay)
                        loop.reward_factor = rewards.factor  # its priorities are computed with it
                    if on_policy is not None:  # a batch of segments, trained on for its passes
                        counters.opt_credit = float(on_policy.updates_ready(batch_size))
                    else:
                        made = 0 if acted.transitions is None else len(acted.transitions["reward"])
                        counters.opt_credit += (made if per_item else acted.env_steps) / tc.opt_interval
                while counters.opt_credit >= 1.0 and not stop.set and not book.should_stop():
                    counters.opt_credit -= 1.0
                    t0 = time.perf_counter()
                    batch = rewards.scale(replay.sample(batch_size))
                    t1 = time.perf_counter()
                    metrics, priorities = agent.update(batch)
                    t2 = time.perf_counter()
                    if priorities is not None:
                        replay.update_priorities(batch["indices"], priorities)
                    cost.add("sample", t1 - t0)
                    cost.add("update", t2 - t1)
                    cost.add("priorities", time.perf_counter() - t2)
                    book.opt_step({**metrics, explore_tag: explore}, save=False, perf=perf)
                    if book.eval_due():
                        t0 = time.perf_counter()
                        returns, lengths = evaluator.play(agent)
                        cost.add("evaluate", time.perf_counter() - t0)
                        book.evaluation(returns, lengths, version=book.opt_steps)
                    book.save_due()  # after the evaluation, so a checkpoint never falls between the two
        if stop.set:
            book.stop_reason = "interrupted"
        # before the envs close: their state is saved
        store = {"store": on_policy.summary()} if on_policy is not None else {}
        summary = book.finish({"replay_size": len(replay), "replay_item": task.replay_item, **store,
                               "reward_scale": rewards.factor, "reward_rms_measured": rewards.measured_rms})
        print_run_table(summary, path)
        return summary
    except BaseException:
        book.close_recorder(failed=True)  # a tracker's run marked failed, what it held sent
        raise
