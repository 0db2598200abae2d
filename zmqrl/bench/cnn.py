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

Replay on the device (``replay.device``, :mod:`zmqrl.replay.device`): each ``cnn_learner_b*_cuda_device_replay``
row times the learner's loop (sample, captured update read one step late, priorities back) with replay on the
GPU against host replay, at batch 32, 256 and 512; the note adds the sum tree's copy on the device. Each
``cnn_sum_tree_b*_cuda`` row times prioritized sampling and priorities over 1M items with the sum tree's copy
on the device against the host's tree. Without CUDA those rows say so, and the same code runs on the CPU's
torch: ``cnn_replay_b*_cpu_torch`` (the replay's work of a step: the torch replay on the CPU against the numpy
replay), ``cnn_learner_b32_cpu_torch_replay`` (a whole step at batch 32) and ``cnn_sum_tree_b*_cpu``: what
that code costs on a CPU, not what a GPU gains.
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
SUM_TREE_ITEMS = 1_000_000  # a full Pong replay's priorities (the items one byte each: the search is timed)
NO_CUDA = "no CUDA device here"


_replays: dict[tuple[Path, str], Any] = {}
_pools: dict[Path, dict[str, Any]] = {}


def _agent_and_replay(c: Context, device: str, batch_size: int, compile: str,
                      replay_on: str = "host") -> tuple[Any, Any, str]:
    """(agent, replay of real Pong frames shared by every row of its kind, config name). ``replay_on``: ``host``
    (the numpy replay), or ``DEVICE`` or ``DEVICE/device`` for the torch replay on that device, searching the
    host's sum tree or (``/device``) its copy on the device."""
    from zmqrl.run.acting import make_task

    path = c.configs(CONFIG)[0]
    cfg = load_config(path, f"replay.capacity={POOL}", f"agent.batch_size={batch_size}", "env.num_envs=8",
                      f"run.device={device}", f"agent.compile={compile}", "replay.device=cpu")  # (host: "host" rows)
    agent = make_task(cfg).agent(device=device, seed=0)
    return agent, _replay(cfg, path, replay_on), path.name


def _replay(cfg: Any, path: Path, replay_on: str) -> Any:
    """The replay of real Pong frames of :func:`_agent_and_replay` (the same transitions in every kind)."""
    from zmqrl.run.startup import make_replay_from

    replay = _replays.get((path, replay_on))
    if replay is None:  # one replay of real frames for every row (the sampled priorities change, the frames not)
        if path not in _pools:
            _pools[path] = transition_pool(cfg, POOL)
        torch_device, _, tree = replay_on.partition("/")
        replay = _replays[(path, replay_on)] = make_replay_from(
            cfg, torch_device=None if replay_on == "host" else torch_device, sum_tree=tree or "host")
        replay.add(_pools[path])
    return replay


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


def _updates_per_second(c: Context, device: str, batch_size: int, mode: str, sampled: bool = False,
                        replay_on: str = "host") -> float:
    """Deferred updates/s of the update run ``mode`` (eager, static or graph) on one fixed batch, or on
    sampled batches with their priorities written back (from the replay ``replay_on`` names, as for
    :func:`_agent_and_replay`); the capture, if any, happens before the clock."""
    step = _prepared_loop(c, device, batch_size, mode, sampled, replay_on)
    return calls_per_second(step, max(0.5, c.settings.actor_s))


def _prepared_loop(c: Context, device: str, batch_size: int, mode: str, sampled: bool = True,
                   replay_on: str = "host") -> Callable[[], None]:
    """The step :func:`_updates_per_second` times, its warm-up updates and capture done (each step reads the one
    before: the device is never more than a step behind what a window counts)."""
    import torch

    from zmqrl.agents.graphs import WARMUP

    agent, replay, _ = _agent_and_replay(c, device, batch_size, "graph" if mode == "graph" else "none", replay_on)
    if mode == "static":
        agent.set_update_mode("static", "the bench")
    fixed = replay.sample(batch_size)
    step = (_deferred_loop(agent, lambda: replay.sample(batch_size), replay) if sampled
            else _deferred_loop(agent, lambda: fixed))
    for _ in range({"graph": WARMUP + 1, "static": 1}.get(mode, 0)):  # warm-up updates and the capture (or binding)
        step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return step


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


def _replay_step(replay: Any, batch_size: int) -> Callable[[], None]:
    """The learner's replay work of one step: a batch sampled, then the previous step's priorities written
    back (one step late, with the count it was sampled at), as the learner's loop does around an update."""
    import numpy as np

    rng = np.random.default_rng(0)
    previous: list[tuple[Any, int]] = []

    def step() -> None:
        sampled_at = replay.num_added
        batch = replay.sample(batch_size)
        if previous:
            indices, at = previous.pop()
            replay.update_priorities(indices, rng.uniform(0.01, 2.0, batch_size), sampled_at=at)
        previous.append((batch["indices"], sampled_at))

    return step


def _alternate(c: Context, steps: dict[str, Callable[[], None]], seconds: float) -> dict[str, list[float]]:
    """Calls/s of each step, in windows alternating their order."""
    rates: dict[str, list[float]] = {name: [] for name in steps}
    for rep in range(max(1, c.settings.reps) * 2):
        for name in list(steps) if rep % 2 == 0 else list(steps)[::-1]:
            rates[name].append(calls_per_second(steps[name], seconds))
    return rates


def _pong_cfg(c: Context, batch_size: int, device: str) -> tuple[Any, Path]:
    path = c.configs(CONFIG)[0]
    return load_config(path, f"replay.capacity={POOL}", f"agent.batch_size={batch_size}", "env.num_envs=8",
                       f"run.device={device}", "replay.device=cpu"), path


def _held(replay: Any) -> str:
    """What a torch replay holds on its device, per transition."""
    frames = replay.frames_held / max(len(replay), 1)
    return (f"{replay.device_nbytes / replay.capacity:,.0f} device bytes a transition at capacity {replay.capacity:,} "
            f"(frame slots reserved 1/16 over the items), {frames:.2f} frames a transition held")


def torch_replay_cpu_rows(c: Context) -> list[Row]:
    """The replay's work of a step at each of :data:`CUDA_BATCHES`, and a whole learner step at batch 32, with the
    torch replay (replay on the device's code) on the CPU against the numpy replay."""
    seconds = max(0.25, c.settings.actor_s / 2)
    rows = []
    for batch_size in CUDA_BATCHES:
        cfg, path = _pong_cfg(c, batch_size, "cpu")
        torch_replay, host = _replay(cfg, path, "cpu"), _replay(cfg, path, "host")
        steps = {"torch": _replay_step(torch_replay, batch_size), "numpy": _replay_step(host, batch_size)}
        rates = _alternate(c, steps, seconds)
        rows.append(make_row(
            f"cnn_replay_b{batch_size}_cpu_torch", median(rates["torch"]), median(rates["numpy"]), "steps/s",
            f"{CONFIG}: the learner's replay work of a step at batch {batch_size} (sample, then the last step's "
            f"priorities written back) on {POOL} real Pong transitions, prioritized, frames once: replay on the "
            f"device's code with device=cpu (items and frames in CPU tensors, stacks gathered by torch; "
            f"{_held(torch_replay)}) vs the numpy replay; on a CPU both gather in host memory, so this is what that "
            f"code costs here, not what a GPU gains; medians of {len(rates['torch'])} alternated windows"))
    loops = {"torch": _prepared_loop(c, "cpu", 32, "eager", replay_on="cpu"),
             "numpy": _prepared_loop(c, "cpu", 32, "eager")}
    rates = _alternate(c, loops, max(0.5, c.settings.actor_s))
    rows.append(make_row(
        "cnn_learner_b32_cpu_torch_replay", median(rates["torch"]), median(rates["numpy"]), "opt steps/s",
        f"{CONFIG}: DQN Nature CNN, batch 32, 1 torch thread on CPU, the learner's loop (sample, eager update read "
        "one step late, priorities back) with replay on the device's code on device=cpu vs the numpy replay; "
        f"medians of {len(rates['torch'])} alternated windows"))
    return rows


def sum_tree_rows(c: Context, device: str) -> list[Row]:
    """Prioritized sampling on :data:`SUM_TREE_ITEMS` items: the sum tree's copy on ``device`` searched there, against
    the host's sum tree with only indices crossing, the replay on ``device`` either way."""
    import numpy as np

    from zmqrl.run.startup import make_replay_from

    seconds = max(0.25, c.settings.actor_s / 2)
    rng = np.random.default_rng(0)
    cfg = load_config(c.configs(CONFIG)[0], f"replay.capacity={SUM_TREE_ITEMS}", "replay.prioritized=true")
    replays = {}
    for tree in ("device", "host"):
        replay = make_replay_from(cfg, {"x": (np.dtype(np.uint8), ())}, torch_device=device, sum_tree=tree)
        replay.add({"x": np.zeros(SUM_TREE_ITEMS, np.uint8)}, priorities=rng.uniform(0.01, 2.0, SUM_TREE_ITEMS))
        replays[tree] = replay
    where = _device_name(device)
    rows = []
    for batch_size in CUDA_BATCHES:
        rates = _alternate(c, {tree: _replay_step(r, batch_size) for tree, r in replays.items()}, seconds)
        rows.append(make_row(
            f"cnn_sum_tree_b{batch_size}_{device}", median(rates["device"]), median(rates["host"]), "steps/s",
            f"prioritized replay of {SUM_TREE_ITEMS:,} one-byte items on {where}, batch {batch_size}: sample (search, "
            "weights, gather) and the last step's priorities back, with the sum tree's copy on the device searched "
            "there (indices copied back to the host for the priorities) vs the host's sum tree (indices sent over); "
            f"medians of {len(rates['device'])} alternated windows"
            + ("; on a CPU the device's tree is torch's CPU code" if device == "cpu" else "")))
    return rows


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device.startswith("cuda") else "the CPU (1 torch thread)"


def device_replay_rows(c: Context) -> list[Row]:
    """On CUDA, at each of :data:`CUDA_BATCHES`: the learner's loop with replay on the device against host replay."""
    import torch

    rows = []
    for batch_size in CUDA_BATCHES:
        loops = {where: _prepared_loop(c, "cuda", batch_size, "graph", replay_on=where)
                 for where in ("cuda", "host", "cuda/device")}
        rates = _alternate(c, loops, max(0.5, c.settings.actor_s))
        held = _held(_replays[(c.configs(CONFIG)[0], "cuda")])
        rows.append(make_row(
            f"cnn_learner_b{batch_size}_cuda_device_replay", median(rates["cuda"]), median(rates["host"]),
            "opt steps/s",
            f"{CONFIG}: batch {batch_size} on {torch.cuda.get_device_name()}, the learner's loop (sample, update "
            f"captured as a CUDA graph and read one step late, priorities back) with replay on the device (host sum "
            f"tree, indices sent over; {held}) vs host replay (numpy, batches staged through pinned memory); with "
            f"the sum tree's copy on the device: {median(rates['cuda/device']):.0f}/s; medians of "
            f"{len(rates['cuda'])} alternated windows"))
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
    if torch.cuda.is_available():  # (the CUDA rows below measure replay on the device itself)
        why = "this host has CUDA: the cnn_*_device_replay and cnn_sum_tree_*_cuda rows measure replay on the device"
        rows += [skipped_row(f"cnn_replay_b{b}_cpu_torch", "steps/s", why) for b in CUDA_BATCHES]
        rows += [skipped_row("cnn_learner_b32_cpu_torch_replay", "opt steps/s", why)]
        rows += [skipped_row(f"cnn_sum_tree_b{b}_cpu", "steps/s", why) for b in CUDA_BATCHES]
    else:
        rows += torch_replay_cpu_rows(c)
        rows += sum_tree_rows(c, "cpu")
    if not torch.cuda.is_available():
        reason = (f"{NO_CUDA}: graph updates need CUDA and were not measured; on this CPU at batch 32: eager "
                  f"{eager:.1f}/s, the graph's code uncaptured (static path) {static:.1f}/s")
        replay_reason = (f"{NO_CUDA}: replay on the device was not measured there; its code on this CPU: "
                         "cnn_replay_b*_cpu_torch, cnn_learner_b32_cpu_torch_replay, cnn_sum_tree_b*_cpu")
        return (rows + [skipped_row(f"cnn_learner_b{b}_cuda_pinned", "opt steps/s", NO_CUDA) for b in CUDA_BATCHES]
                + [skipped_row(f"cnn_update_b{b}_cuda_graph", "opt steps/s", reason) for b in CUDA_BATCHES]
                + [skipped_row(f"cnn_learner_b{b}_cuda_device_replay", "opt steps/s", replay_reason)
                   for b in CUDA_BATCHES]
                + [skipped_row(f"cnn_sum_tree_b{b}_cuda", "steps/s", replay_reason) for b in CUDA_BATCHES])
    for batch_size in CUDA_BATCHES:
        pinned, _, _ = _measure(c, "cuda", batch_size, True, reps)
        plain, ceiling, _ = _measure(c, "cuda", batch_size, False, reps)
        rows.append(make_row(f"cnn_learner_b{batch_size}_cuda_pinned", pinned, plain, "opt steps/s",
                             f"{name}: batch {batch_size} on {torch.cuda.get_device_name()}: sampled batches staged "
                             f"through pinned double buffers vs plain blocking copies (eager updates); one fixed "
                             f"batch already staged: {ceiling:.0f}/s"))
    return rows + graph_rows(c) + device_replay_rows(c) + sum_tree_rows(c, "cuda")
