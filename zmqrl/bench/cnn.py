"""CNN group: the learner's optimisation steps/s with the Nature CNN on real Atari frames.

Each row times ``agent.update`` on batches sampled from a prioritized replay of real Pong
transitions (the shipped ``pong_dqn.yaml``, frames stored once), as the learner's loop runs it,
against the same update on one batch sampled once (the network's own speed: no sampling, no
staging of new data). On CUDA, where there is one, batch 32, 256 and 512 are timed with the pinned,
double-buffered staging and with plain blocking copies.
"""

from __future__ import annotations

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


_replays: dict[Path, Any] = {}


def _measure(c: Context, device: str, batch_size: int, pinned: bool, reps: int) -> tuple[float, float, str]:
    """(sampled-batch opt steps/s, fixed-batch opt steps/s, config name) on ``device``."""
    import torch

    from zmqrl.agents.staging import BatchStager
    from zmqrl.run.acting import make_task
    from zmqrl.run.startup import make_replay_from

    path = c.configs(CONFIG)[0]
    cfg = load_config(path, f"replay.capacity={POOL}", f"agent.batch_size={batch_size}", "env.num_envs=8")
    task = make_task(cfg)
    agent = task.agent(device=device, seed=0)
    if hasattr(agent, "stager"):
        agent.stager = BatchStager(device, pinned=pinned)
    replay = _replays.get(path)
    if replay is None:  # one replay of real frames for every row (the sampled priorities change, the frames not)
        replay = _replays[path] = make_replay_from(cfg)
        replay.add(transition_pool(cfg, POOL))
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
    return median(real), median(ceiling), path.name


def run(c: Context) -> list[Row]:
    import torch

    torch.set_num_threads(1)
    reps = max(1, c.settings.reps)
    real, ceiling, name = _measure(c, "cpu", 32, True, reps)
    rows = [make_row("cnn_learner_b32_cpu", real, ceiling, "opt steps/s",
                     f"{name}: DQN Nature CNN (dueling, double), batch 32, 1 torch thread on CPU: replay.sample + "
                     "update + update_priorities vs update on one fixed batch (the network alone); medians of "
                     f"{reps} alternations")]
    if not torch.cuda.is_available():
        return rows + [skipped_row(f"cnn_learner_b{b}_cuda_pinned", "opt steps/s", "no CUDA device here")
                       for b in CUDA_BATCHES]
    for batch_size in CUDA_BATCHES:
        pinned, _, _ = _measure(c, "cuda", batch_size, True, reps)
        plain, ceiling, _ = _measure(c, "cuda", batch_size, False, reps)
        rows.append(make_row(f"cnn_learner_b{batch_size}_cuda_pinned", pinned, plain, "opt steps/s",
                             f"{name}: batch {batch_size} on {torch.cuda.get_device_name()}: sampled batches staged "
                             f"through pinned double buffers vs plain blocking copies; one fixed batch already "
                             f"staged: {ceiling:.0f}/s"))
    return rows
