"""CNN group: the learner's optimisation steps/s with the Nature CNN on real Atari frames.

Each ``cnn_learner`` row times the eager ``agent.update`` (``agent.compile=none``) on batches sampled
from a prioritized replay of real Pong transitions (the shipped ``pong_dqn.yaml``, frames stored once),
as the learner's loop runs it, against the same update on one batch sampled once (the network's own
speed: no sampling, no staging of new data). On CUDA, where there is one, batch 32, 256 and 512 are timed
with the pinned, double-buffered staging and with plain blocking copies.

Each ``cnn_update`` row times the update as the learner calls it (``update_deferred``, each step's
results read after the next step is queued) on one fixed batch, captured as a CUDA graph
(``agent.compile=graph``) against eager, at batch 32, 256 and 512; the note adds the graph in the
learner's whole loop (sampling and priorities included). Without CUDA those rows are not measured and
say so; ``cnn_update_b32_cpu_static`` then times the graph's code uncaptured on the CPU (static buffers,
in-place gradients, capturable Adam) against eager, which shows what that code costs without the graph.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from zmqrl.bench.data import transition_pool
from zmqrl.bench.harness import (
    Context,
    Row,
    calls_per_second,
    load_config,
    make_row,
    median,
    skipped_row,
)

CONFIG = "pong_dqn.yaml"
CUDA_BATCHES = (32, 256, 512)  # Nature DQN's batch, the GPU sprint's, Ape-X's
POOL = 2048  # real transitions in replay (distinct frames: sampling touches memory as a full replay would)
NO_CUDA = "no CUDA device here"


_replays: dict[Path, Any] = {}


def _agent_and_replay(c: Context, device: str, batch_size: int, compile: str) -> tuple[Any, Any, str]:
    """(agent, replay of real Pong frames shared by every row, config name)."""
    from zmqrl.run.acting import make_task
    from zmqrl.run.startup import make_replay_from

    path = c.configs(CONFIG)[0]
    cfg = load_config(path, f"replay.capacity={POOL}", f"agent.batch_size={batch_size}", "env.num_envs=8",
                      f"run.device={device}", f"agent.compile={compile}")
    agent = make_task(cfg).agent(device=device, seed=0)
    replay = _replays.get(path)
    if replay is None:  # one replay of real frames for every row (the sampled priorities change, the frames not)
        replay = _replays[path] = make_replay_from(cfg)
        replay.add(transition_pool(cfg, POOL))
    return agent, replay, path.name


def _measure(c: Context, device: str, batch_size: int, pinned: bool, reps: int) -> tuple[float, float, str]:
    """(sampled-batch opt steps/s, fixed-batch opt steps/s, config name) of the eager update on ``device``."""
    import torch

    from zmqrl.agents.staging import BatchStager

    agent, replay, name = _agent_and_replay(c, device, batch_size, "none")
    if hasattr(agent, "stager"):
        agent.stager = BatchStager(device, pinned=pinned)
    fixed = replay.sample(batch_size)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def sampled() -> None:
        batch = replay.sample(batch_size)
        _, priorities = agent.update(batch)
        if priorities is not None:
            replay.update_priorities(batch["indices"], priorities)

    def one_batch() -> None:
        agent.update(fixed)

    seconds = max(1.0, c.settings.actor_s * 2)
    real, ceiling = [], []
    for _ in range(reps):
        real.append(calls_per_second(sampled, seconds))
        sync()
        ceiling.append(calls_per_second(one_batch, seconds))
        sync()
    return median(real), median(ceiling), name


def _deferred_loop(agent: Any, next_batch: Callable[[], dict[str, Any]], replay: Any = None) -> Callable[[], None]:
    """One step of the learner's loop: the next batch's update queued, then the previous step's results
    read (its priorities written back to ``replay`` where given), as :class:`~zmqrl.core.DefersUpdates` runs."""
    previous: list[Any] = []  # the last step's (batch, pending results)

    def step() -> None:
        batch = next_batch()
        pending = agent.update_deferred(batch)
        if previous:
            old_batch, old = previous.pop()
            _, priorities = old.result()
            if replay is not None and priorities is not None:
                replay.update_priorities(old_batch["indices"], priorities)
        previous.append((batch, pending))

    return step


def _updates_per_second(c: Context, device: str, batch_size: int, mode: str, sampled: bool = False) -> float:
    """Deferred updates/s of the update run ``mode`` (eager, static or graph) on one fixed batch, or on
    sampled batches with their priorities written back; the capture, if any, happens before the clock."""
    import torch

    from zmqrl.agents.graphs import WARMUP

    agent, replay, _ = _agent_and_replay(c, device, batch_size, "graph" if mode == "graph" else "none")
    if mode == "static":
        agent.set_update_mode("static", "the bench")
    fixed = replay.sample(batch_size)
    step = (_deferred_loop(agent, lambda: replay.sample(batch_size), replay) if sampled
            else _deferred_loop(agent, lambda: fixed))
    for _ in range({"graph": WARMUP + 1, "static": 1}.get(mode, 0)):  # warm-up updates and the capture (or binding)
        step()
    rate = calls_per_second(step, max(0.5, c.settings.actor_s))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return rate


def cpu_static_row(c: Context) -> tuple[Row, float, float]:
    """The graph's code run uncaptured on the CPU against eager, batch 32 (row, static/s, eager/s)."""
    static = _updates_per_second(c, "cpu", 32, "static")
    eager = _updates_per_second(c, "cpu", 32, "eager")
    row = make_row("cnn_update_b32_cpu_static", static, eager, "opt steps/s",
                   f"{CONFIG}: DQN Nature CNN, batch 32, 1 torch thread on CPU, one fixed batch, results read one "
                   "step late: the code a CUDA graph captures run uncaptured (static input buffers, gradients "
                   "zeroed in place, capturable Adam with its lr in a tensor) vs the eager update")
    return row, static, eager


def graph_rows(c: Context) -> list[Row]:
    """Graph against eager at each of :data:`CUDA_BATCHES` on CUDA."""
    import torch

    rows = []
    for batch_size in CUDA_BATCHES:
        graph = _updates_per_second(c, "cuda", batch_size, "graph")
        eager = _updates_per_second(c, "cuda", batch_size, "eager")
        looped = _updates_per_second(c, "cuda", batch_size, "graph", sampled=True)
        rows.append(make_row(f"cnn_update_b{batch_size}_cuda_graph", graph, eager, "opt steps/s",
                             f"{CONFIG}: batch {batch_size} on {torch.cuda.get_device_name()}, one fixed batch, "
                             "results read one step late: the update captured as one CUDA graph vs eager; the graph "
                             f"in the learner's loop (replay.sample, update, priorities back): {looped:.0f}/s"))
    return rows


def run(c: Context) -> list[Row]:
    import torch

    torch.set_num_threads(1)
    reps = max(1, c.settings.reps)
    real, ceiling, name = _measure(c, "cpu", 32, True, reps)
    rows = [make_row("cnn_learner_b32_cpu", real, ceiling, "opt steps/s",
                     f"{name}: DQN Nature CNN (dueling, double), batch 32, 1 torch thread on CPU: replay.sample + "
                     "update + update_priorities vs update on one fixed batch (the network alone); medians of "
                     f"{reps} alternations")]
    static_row, static, eager = cpu_static_row(c)
    rows.append(static_row)
    if not torch.cuda.is_available():
        reason = (f"{NO_CUDA}: graph updates need CUDA and were not measured; on this CPU at batch 32: eager "
                  f"{eager:.1f}/s, the graph's code uncaptured (static path) {static:.1f}/s")
        return (rows + [skipped_row(f"cnn_learner_b{b}_cuda_pinned", "opt steps/s", NO_CUDA) for b in CUDA_BATCHES]
                + [skipped_row(f"cnn_update_b{b}_cuda_graph", "opt steps/s", reason) for b in CUDA_BATCHES])
    for batch_size in CUDA_BATCHES:
        pinned, _, _ = _measure(c, "cuda", batch_size, True, reps)
        plain, ceiling, _ = _measure(c, "cuda", batch_size, False, reps)
        rows.append(make_row(f"cnn_learner_b{batch_size}_cuda_pinned", pinned, plain, "opt steps/s",
                             f"{name}: batch {batch_size} on {torch.cuda.get_device_name()}: sampled batches staged "
                             f"through pinned double buffers vs plain blocking copies (eager updates); one fixed "
                             f"batch already staged: {ceiling:.0f}/s"))
    return rows + graph_rows(c)
