"""Learner group: the real Learner loop fed by actors against the same learner alone, what its intake
costs per Pong transition, what it sends while it waits for data, and what an update costs.

- ``learner_opt_steps`` (CartPole DQN) and ``learner_opt_steps_pong`` (Pong, Nature CNN at batch 32 on
  the CPU): opt steps/s of an in-process ``Learner.run``, replay prefilled, while feeder processes
  (:mod:`zmqrl.bench.feeders`) that behave like actors send as fast as the rate limiter lets them,
  against the same learner with no feeders. Goal: at least 0.9 of the learner alone.
- ``learner_intake_pong``: real Pong batches with each frame once, taken from the data socket into
  replay on one thread (``Learner.ingest``: receive, decode, checks, fingerprints, interning), in
  transitions per CPU-second, against the former intake that rebuilt each batch's stacks and had
  replay find their frames again (decode, ``expand``, checks, ``replay.add`` of the stacks). Goal: 5x.
- ``learner_bytes_throttled``: bytes per second four actors' subscriptions receive from a Pong learner
  that waits for data (``max_samples_per_insert``), granting every 50 ms (its models republished every
  ``net.republish_s`` counted in at their average rate), against what the same grants
  cost when each rode on a model (the protocol before control had messages of its own). Goal: 100x fewer.
- ``learner_opt_steps_pong_cuda_device_replay``: on CUDA, the fed Pong learner at batch 256 with replay on
  the GPU (``replay.device: cuda``) against host replay; without CUDA it says so (``zmqrl bench --only cnn``
  times replay on the device's code on the CPU, and the unfed loop on CUDA at batch 32, 256 and 512).
- ``learner_update_r2d2_pomdp`` and ``learner_items_r2d2_pomdp``: the learner's step (sample, update,
  priorities) of R2D2 on CartPole without velocities (its shipped config: sequence items of
  burn-in + trained + 1 steps, an LSTM unrolled over each) in steps/s and in items/s, against DQN's
  step on the same env (its shipped control config) in steps/s and transitions/s. Not judged.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from zmqrl.bench.data import TRANSITION_KEYS, acted_items, pong_transitions, transition_pool
from zmqrl.bench.feeders import actor_meta, feed, save_messages
from zmqrl.bench.harness import (
    CONFIGS,
    BenchError,
    Context,
    Procs,
    Row,
    calls_per_second,
    free_addr,
    load_config,
    make_row,
    median,
    save_arrays,
    skipped_row,
)
from zmqrl.run.lifecycle import StopFlag
from zmqrl.run.rundir import read_json

CONFIG = "cartpole_dqn.yaml"
PONG_CONFIG = "pong_dqn.yaml"
SAC_CONFIG = "pendulum_sac.yaml"  # the update row of an algorithm without priorities, on two torch threads
RECURRENT_CONFIGS = ("cartpole_pomdp_r2d2.yaml", "cartpole_pomdp_dqn.yaml")  # R2D2 and its feed-forward control
SEQUENCE_ITEMS = {"full": 2000, "quick": 1000, "smoke": 200}  # real sequence items in replay for the R2D2 rows
FEEDERS = 4
DEFAULT_RATE = 5000.0  # transitions/s each feeder offers while not paused (--actor-rate)
PONG_TRANSITIONS = {"full": 4096, "quick": 2048, "smoke": 1024}  # real Pong transitions made for the Pong rows
SUBSCRIBERS = 4  # actors listening to the throttled learner
BATCH_GPU = 256  # the GPU sprint's batch (configs/pong_dqn_gpu.yaml): the fed row of replay on the device


def learner_config(path: Path, *overrides: str) -> Any:
    """``path`` as the learner rows train it: no stop return, no opt-step cap, warnings only, on the CPU."""
    return load_config(path, "trainer.stop_return=null", "trainer.max_opts=100000000", "run.log_level=warning",
                       "run.device=cpu", *overrides)


@dataclass
class Material:
    """What a fed learner row trains on (``prefill``: arrays as replay stores them) and what its feeders
    send (``messages``, a file of batches as actors send them)."""

    path: Path
    cfg: Any
    prefill: dict[str, np.ndarray]
    messages: Path
    count: int  # batches in the file
    what: str  # how the note describes the batches


def prefill_pool(c: Context, cfg: Any, name: str) -> tuple[dict[str, np.ndarray], Path]:
    """Real transitions with random priorities to prefill replay (up to 20k) and send, saved for helpers."""
    size = min(20_000, cfg.replay.capacity)
    pool = transition_pool(cfg, size, seed=1)
    pool["priority"] = np.random.default_rng(1).uniform(0.01, 2.0, size).astype(np.float32)
    return pool, save_arrays(c.path(name), pool)


def cartpole_material(c: Context, path: Path) -> Material:
    """20k real CartPole transitions (random priorities) to prefill replay; feeders send them in n_buffer batches."""
    cfg = learner_config(path)
    pool, _ = prefill_pool(c, cfg, "learner-pool.npz")
    size, n = len(pool["reward"]), cfg.actor.n_buffer
    messages = [{k: pool[k][lo:lo + n] for k in (*TRANSITION_KEYS, "priority")} for lo in range(0, size - n + 1, n)]
    return Material(path, cfg, pool, save_messages(c.path("learner-cartpole.npz"), messages), len(messages),
                    f"{n}-transition batches")


def pong_material(c: Context) -> Material:
    """Real Pong transitions of the shipped config's actor (its acting loop, n-step, initial priorities):
    replay is prefilled with them, and feeders send them as the actor does, each frame once per batch."""
    from zmqrl.frames import image_fields
    from zmqrl.wire.compact import FrameCompactor

    path = CONFIGS / PONG_CONFIG
    n = PONG_TRANSITIONS.get(c.settings.mode, PONG_TRANSITIONS["full"])
    spec, batch = pong_transitions(n, seed=1, config=str(path))
    cfg = learner_config(path, f"trainer.warmup={n}", "env.backend=gymnasium")
    per = cfg.actor.n_buffer
    compactor = FrameCompactor(image_fields(spec))
    messages = [compactor.compact({k: v[lo:lo + per] for k, v in batch.items()})[0]
                for lo in range(0, n - per + 1, per)]
    frames = compactor.frames / max(compactor.transitions, 1)
    return Material(path, cfg, batch, save_messages(c.path("learner-pong.npz"), messages), len(messages),
                    f"{per}-transition Pong batches, each frame once ({frames:.2f} frames a transition)")


def prefilled_learner(cfg: Any, run_dir: Path, prefill: dict[str, np.ndarray],
                      binds: tuple[str, str, str] | None = None) -> Any:
    """A real :class:`~zmqrl.roles.learner.Learner` bound at ``binds`` (data, model, eval; free ports by
    default), its agent built (measure training, not its startup) and its replay prefilled."""
    from zmqrl.roles.learner import Learner

    binds = binds or (free_addr(), free_addr(), free_addr())
    with contextlib.redirect_stderr(io.StringIO()):  # the progress view binds stderr here: keep it quiet
        learner = Learner(copy.deepcopy(cfg), run_dir, *binds)
        learner.agent_ready(block=True)
    arrays = {k: v for k, v in prefill.items() if k != "priority"}
    learner.replay.add(arrays, priorities=prefill.get("priority"))
    return learner


def _window(c: Context, material: Material, feeders: int, rate: float, tag: str) -> dict[str, float]:
    """Opt steps/s (and transitions/s ingested) of an in-process Learner over one measurement window."""
    s = c.settings
    learner = prefilled_learner(material.cfg, c.path(f"learner-{tag}"), material.prefill)
    stop = StopFlag()
    window: dict[str, float] = {}
    abort = threading.Event()

    def clock() -> None:
        if abort.wait(s.settle_s):
            return
        t0, o0, i0, p0 = time.perf_counter(), learner.book.opt_steps, learner.inserted, learner.limiter.pauses
        c0 = learner.intake.cpu_s()
        if abort.wait(s.learner_s):
            return
        t1, o1, i1, p1 = time.perf_counter(), learner.book.opt_steps, learner.inserted, learner.limiter.pauses
        window.update(opt_s=(o1 - o0) / (t1 - t0), ingest_s=(i1 - i0) / (t1 - t0), pauses=float(p1 - p0),
                      intake_cpu=(learner.intake.cpu_s() - c0) / (t1 - t0))
        stop.set = True

    outs = [c.path(f"feed-{tag}-{i}.json") for i in range(feeders)]
    with Procs(c.logs) as procs:
        for i, out in enumerate(outs):
            procs.child(f"feed-{tag}-{i}", feed, {
                "config": str(material.path), "overrides": ["env.backend=gymnasium"],
                "connect": learner.endpoints["data"], "models": learner.endpoints["model"],
                "messages": str(material.messages), "rate": rate, "sndhwm": material.cfg.actor.send_hwm,
                "index": i, "out": str(out), "timeout_s": s.settle_s + s.learner_s + 120})
        thread = threading.Thread(target=clock, name="bench-clock", daemon=True)
        thread.start()
        try:
            learner.run(stop)
        finally:
            abort.set()
            stop.set = True
            thread.join(5.0)
    if "opt_s" not in window:
        raise BenchError("the learner stopped before its measurement window closed")
    results = [read_json(out) or {} for out in outs]
    window["rejected"] = float(learner.rejected_total())
    window["paused_share"] = sum(r.get("paused_s", 0.0) / max(r.get("wall_s", 0.0), 1e-9) for r in results) / \
        max(len(results), 1)
    return window


def fed_row(c: Context, material: Material, name: str) -> Row:
    """Opt steps/s of the learner fed by :data:`FEEDERS` feeders against the same learner alone, alternated."""
    s, cfg = c.settings, material.cfg
    rate = s.actor_rate or DEFAULT_RATE
    idle: list[float] = []
    busy: list[float] = []
    ingest: list[float] = []
    paused: list[float] = []
    intake_cpu: list[float] = []
    rejected = pauses = 0.0
    for rep in range(s.reps):
        idle.append(_window(c, material, 0, rate, f"{name}-idle-{rep}")["opt_s"])
        w = _window(c, material, FEEDERS, rate, f"{name}-fed-{rep}")
        busy.append(w["opt_s"])
        ingest.append(w["ingest_s"])
        paused.append(w["paused_share"])
        intake_cpu.append(w["intake_cpu"])
        rejected += w["rejected"]
        pauses += w["pauses"]
    limiter = cfg.trainer.min_samples_per_insert
    limiter_text = (f"rate limiter on as configured (pause below {limiter:g} samples per insert): the feeders "
                    f"were paused {median(paused):.0%} of their running time, {pauses:.0f} pause request(s) in "
                    "the windows" if limiter > 0 else "rate limiter off in this config")
    note = (f"{material.path.name}: in-process Learner.run (batch {cfg.agent.batch_size}, "
            f"{cfg.run.torch_threads} torch thread), {'prioritized' if cfg.replay.prioritized else 'uniform'} replay "
            f"prefilled with {len(material.prefill['reward'])}; {FEEDERS} feeder processes subscribe to its models "
            f"and control like actors and PUSH {material.what} at up to {rate:,.0f} transitions/s each while not "
            f"paused; {limiter_text}; ingested {median(ingest):,.0f} transitions/s, the intake thread using "
            f"{median(intake_cpu):.1%} of a core; {rejected:.0f} rejected; median of {s.reps}: "
            + ", ".join(f"{a:.1f}/{b:.1f}" for a, b in zip(busy, idle, strict=True)))
    return make_row(name, median(busy), median(idle), "opt steps/s", note, (">=", 0.9))


def intake_row(c: Context, material: Material) -> Row:
    """Transitions per CPU-second from the data socket into replay: frames once against stacks rebuilt."""
    from zmqrl.bench.feeders import load_messages
    from zmqrl.wire import BatchEncoder

    cfg = material.cfg
    messages = load_messages(material.messages)
    encoder = BatchEncoder("actor-0", "inc-bench")
    rows = [len(m["reward"]) for m in messages]
    passes = max(2, {"smoke": 2, "quick": 4}.get(c.settings.mode, 8))
    encoded = []
    for seq in range(passes * len(messages)):  # the file's batches again and again, as one actor's stream
        arrays = messages[seq % len(messages)]
        encoded.append(([bytes(f) for f in encoder.encode(seq, 0, arrays, actor_meta(0, seq, rows[0], 0, None, 1.0))],
                        len(arrays["reward"])))
    total = sum(n for _, n in encoded)
    after: list[float] = []
    before: list[float] = []
    for rep in range(max(1, c.settings.reps) * 2):
        for which in (("after", "before") if rep % 2 == 0 else ("before", "after")):
            zctx = zmq.Context()
            try:
                if which == "after":
                    after.append(total / _frames_once(zctx, c.path(f"intake-{rep}"), material, encoded))
                else:
                    before.append(total / _stacks_rebuilt(zctx, cfg, encoded))
            finally:
                zctx.destroy(linger=0)
    note = (f"{material.path.name}: {len(encoded)} real Pong batches of {rows[0]} transitions ({material.what}), "
            f"pushed over TCP loopback and taken into a prioritized replay with frames kept once, on one thread "
            f"(time.thread_time; the I/O thread's copies are not counted in either): Learner.ingest (receive, "
            f"decode, batch spec, value and meta checks, sequence and allowance, fingerprints, replay.add_frames) "
            f"against the former intake (receive, decode, expand to stacks, batch spec and value checks, "
            f"replay.add of the stacks, which fingerprints all 2x4 frames of each transition); medians of "
            f"{len(after)}: " + ", ".join(f"{a:,.0f}/{b:,.0f}" for a, b in zip(after, before, strict=True)))
    return make_row("learner_intake_pong", median(after), median(before), "transitions/CPU-s", note, (">=", 5.0))


def _frames_once(zctx: zmq.Context, run_dir: Path, material: Material, encoded: list[tuple[list[bytes], int]]) -> float:
    """CPU seconds of the learner's intake over ``encoded`` (``Learner.ingest``, on this thread)."""
    from zmqrl.wire import SocketOptions, make_socket

    learner = prefilled_learner(material.cfg, run_dir, {k: v[:64] for k, v in material.prefill.items()})
    push = make_socket(zctx, zmq.PUSH, SocketOptions.push(sndhwm=4), connect=learner.endpoints["data"])
    try:
        return _timed_intake(push, encoded, lambda: learner.ingest(timeout=0.05))
    finally:
        push.close(linger=0)
        learner.close()


def _timed_intake(push: zmq.Socket, encoded: list[tuple[list[bytes], int]], take: Callable[[], int]) -> float:
    """CPU seconds ``take`` (one round of intake) spends until every message of ``encoded`` is in replay."""
    cpu, sent, inserted = 0.0, 0, 0
    total = sum(n for _, n in encoded)
    deadline = time.monotonic() + 300
    while inserted < total:
        if time.monotonic() > deadline:
            raise BenchError(f"the intake took {inserted} of {total} transitions within 300 s")
        while sent < len(encoded):
            try:
                push.send_multipart(encoded[sent][0], flags=zmq.NOBLOCK, copy=False)
                sent += 1
            except zmq.Again:
                break
        started = time.thread_time()
        inserted += take()
        cpu += time.thread_time() - started
    return cpu


def _stacks_rebuilt(zctx: zmq.Context, cfg: Any, encoded: list[tuple[list[bytes], int]]) -> float:
    """CPU seconds of the former intake path over ``encoded``: receive, decode, expand to stacks, checks,
    ``replay.add`` of the stacks (into the replay the config makes, frames kept once)."""
    from zmqrl.roles.intake import ValueCheck
    from zmqrl.roles.net import limits
    from zmqrl.run.acting import make_task
    from zmqrl.run.startup import make_replay_from
    from zmqrl.wire import BATCH, SocketOptions, check_batch_spec, decode, make_socket
    from zmqrl.wire.compact import expand

    task = make_task(cfg)
    spec = task.batch_spec()
    replay = make_replay_from(cfg, spec)
    values = ValueCheck(spec, task.value_limits())
    lim = limits(cfg.net, BATCH)
    pull = make_socket(zctx, zmq.PULL, SocketOptions.pull(lim, rcvhwm=64), bind="tcp://127.0.0.1:0")
    push = make_socket(zctx, zmq.PUSH, SocketOptions.push(sndhwm=4), connect=pull.getsockopt_string(zmq.LAST_ENDPOINT))

    def take() -> int:
        n = 0
        while pull.poll(50, zmq.POLLIN):
            msg = expand(decode(pull.recv_multipart(copy=False), lim), spec, lim)
            check_batch_spec(msg, spec)
            if values.problem(msg.arrays) is not None:
                raise BenchError("a bench batch failed the value check")
            arrays = dict(msg.arrays)
            priorities = arrays.pop("priority", None)
            replay.add(arrays, priorities=priorities)
            n += len(arrays["reward"])
            if n >= 4096:
                break
        return n

    try:
        return _timed_intake(push, encoded, take)
    finally:
        push.close(linger=0)
        pull.close(linger=0)


def bytes_row(c: Context, material: Material) -> Row:
    """Bytes/s :data:`SUBSCRIBERS` actors' subscriptions (models and control) receive from a Pong learner
    waiting for data, against what the same grants would cost riding on models."""
    from zmqrl.wire import CONTROL_TOPIC, MODEL_SUBSCRIPTION

    s = c.settings
    # throttled from the first update: max_samples_per_insert reached at once (replay prefilled, nothing
    # inserted through the intake), min_samples_per_insert on so that grants go out while it waits
    cfg = copy.deepcopy(material.cfg)
    cfg.trainer.min_samples_per_insert = cfg.trainer.max_samples_per_insert = 8.0
    learner = prefilled_learner(cfg, c.path("learner-throttled"), material.prefill)
    zctx = zmq.Context()
    subs = []
    for topic in [MODEL_SUBSCRIPTION, CONTROL_TOPIC] * SUBSCRIBERS:
        sub = zctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.SUBSCRIBE, topic)
        sub.connect(learner.endpoints["model"])
        subs.append(sub)
    counts = {"model": [0, 0], "control": [0, 0]}  # messages, bytes in the window
    stop = StopFlag()
    seconds = max(2.0, s.learner_s / 2)

    def listen() -> None:
        poller = zmq.Poller()
        for sub in subs:
            poller.register(sub, zmq.POLLIN)
        end = time.monotonic() + s.settle_s + seconds
        opened = time.monotonic() + s.settle_s
        while time.monotonic() < end:
            for sock, _ in poller.poll(50):
                frame = sock.recv()
                if time.monotonic() >= opened:
                    entry = counts["control" if frame[:len(CONTROL_TOPIC)] == CONTROL_TOPIC else "model"]
                    entry[0] += 1
                    entry[1] += len(frame)
        stop.set = True

    thread = threading.Thread(target=listen, name="bench-listen", daemon=True)
    thread.start()
    try:
        learner.run(stop)
    finally:
        stop.set = True
        thread.join(10.0)
        for sub in subs:
            sub.close(linger=0)
        zctx.term()
    if not counts["control"][0]:
        return skipped_row("learner_bytes_throttled", "bytes/s", "no control message reached the subscribers")
    model_frame = learner.publisher.model_bytes / max(learner.publisher.models_sent, 1)
    # steady state: the control seen in the window, plus each subscriber's model every net.republish_s (a
    # window shorter than that period may or may not hold one, so it is counted in at its average rate)
    republish_s = cfg.net.republish_s
    republished = SUBSCRIBERS * model_frame / republish_s if republish_s > 0 else 0.0
    measured = counts["control"][1] / seconds + republished
    former = (counts["control"][0] * model_frame) / seconds  # each control message a whole model, as before
    per_control = counts["control"][1] / counts["control"][0]
    note = (f"{material.path.name} (a {model_frame / 2**20:.1f} MB model) on the CPU, throttled by "
            f"trainer.max_samples_per_insert=8 with min_samples_per_insert=8, so it grants every 50 ms while it "
            f"waits for data; {SUBSCRIBERS} actors' subscriptions (a model and a control one each) counted over "
            f"{seconds:.0f} s: {counts['model'][0]} model and {counts['control'][0]} control messages "
            f"({per_control:.0f} bytes each) received, plus {SUBSCRIBERS} models every "
            f"net.republish_s={republish_s:g} s counted in at {republished / 2**20:.2f} MB/s; the baseline is the "
            f"same grants each riding on the model, as the learner sent them before control had messages of its own")
    return make_row("learner_bytes_throttled", measured, former, "bytes/s", note, (">=", 100.0), inverse=True)


def run(c: Context) -> list[Row]:
    """The learner's rows (module docstring), the update rows last."""
    import torch

    torch.set_num_threads(1)
    path = c.configs(CONFIG)[0]
    rows = [fed_row(c, cartpole_material(c, path), "learner_opt_steps")]
    try:
        pong = pong_material(c)
    except ImportError as exc:  # (Atari is an extra)
        reason = f"Atari is not installed here ({exc})"
        rows += [skipped_row(name, unit, reason) for name, unit in (
            ("learner_opt_steps_pong", "opt steps/s"), ("learner_intake_pong", "transitions/CPU-s"),
            ("learner_bytes_throttled", "bytes/s"))]
    else:
        rows += [fed_row(c, pong, "learner_opt_steps_pong"), intake_row(c, pong), bytes_row(c, pong),
                 device_replay_fed_row(c, pong)]
    return [*rows, update_row(c, path), sac_update_row(c), *recurrent_update_rows(c)]


def device_replay_fed_row(c: Context, material: Material) -> Row:
    """On CUDA: opt steps/s of the Pong learner at batch 256 (its update a CUDA graph) fed by :data:`FEEDERS`
    feeders, with replay on the GPU (``replay.device: cuda``) against host replay, alternated."""
    import torch

    name = "learner_opt_steps_pong_cuda_device_replay"
    if not torch.cuda.is_available():
        return skipped_row(name, "opt steps/s", "no CUDA device here: replay on the device was not measured fed; "
                                                "zmqrl bench --only cnn times its code on this CPU")
    s = c.settings
    rate = s.actor_rate or DEFAULT_RATE
    rates: dict[str, list[float]] = {"cuda": [], "cpu": []}
    for rep in range(max(1, s.reps) * 2):
        for where in ("cuda", "cpu") if rep % 2 == 0 else ("cpu", "cuda"):
            cfg = copy.deepcopy(material.cfg)
            cfg.run.device, cfg.replay.device, cfg.agent.compile = "cuda", where, "auto"
            cfg.agent.batch_size = BATCH_GPU
            window = _window(c, dataclasses.replace(material, cfg=cfg), FEEDERS, rate, f"replay-{where}-{rep}")
            rates[where].append(window["opt_s"])
    note = (f"{material.path.name} at batch {BATCH_GPU} on {torch.cuda.get_device_name()} (update captured as a CUDA "
            f"graph), in-process Learner.run, prioritized replay prefilled with {len(material.prefill['reward'])}, "
            f"{FEEDERS} feeder processes pushing {material.what} at up to {rate:,.0f} transitions/s each: replay on "
            "the GPU (replay.device: cuda) vs host replay (cpu); medians of alternated windows: "
            + ", ".join(f"{a:.0f}/{b:.0f}" for a, b in zip(rates["cuda"], rates["cpu"], strict=True)))
    return make_row(name, median(rates["cuda"]), median(rates["cpu"]), "opt steps/s", note)


def update_row(c: Context, path: Path) -> Row:
    """Learner steps/s (sample, update, priorities) of CartPole's DQN with its written-out MLP update
    against the same agent's autograd update, alternated in one process under the learner's torch
    settings (one thread, denormals flushed)."""
    from zmqrl.agents.dqn.agent import DQNAgent

    cfg, replay, task = _sampling_task(path)
    agent, autograd = (task.agent(device="cpu", seed=0) for _ in range(2))
    assert isinstance(agent, DQNAgent) and isinstance(autograd, DQNAgent)
    rates = _alternated(c, {"explicit": (cfg.run.torch_threads, _learner_step(cfg, replay, agent.update)),
                            "autograd": (cfg.run.torch_threads, _learner_step(cfg, replay, autograd.update_autograd))})
    note = (f"{path.name}: replay.sample + DQN update + update_priorities on 20k real CartPole transitions, "
            f"{cfg.run.torch_threads} torch thread(s), denormals flushed; the written-out MLP update "
            f"(agents/dqn/explicit.py) vs the same agent's autograd update; medians of {len(rates['explicit'])} "
            f"alternated windows: " + ", ".join(f"{a:.0f}/{b:.0f}" for a, b in
                                              zip(rates["explicit"], rates["autograd"], strict=True)))
    return make_row("learner_update_cartpole_dqn", median(rates["explicit"]), median(rates["autograd"]),
                    "opt steps/s", note)


def sac_update_row(c: Context) -> Row:
    """Learner steps/s (sample, update) of the shipped Pendulum SAC config on its torch threads against one."""
    path = CONFIGS / SAC_CONFIG
    cfg, replay, task = _sampling_task(path)
    step = _learner_step(cfg, replay, task.agent(device="cpu", seed=0).update)
    threads = cfg.run.torch_threads
    rates = _alternated(c, {"config": (threads, step), "one": (1, step)})
    mine = median(rates["config"])
    note = (f"{path.name}: replay.sample + SAC update (critics, actor, alpha; batch {cfg.agent.batch_size}, hidden "
            f"{list(cfg.agent.hidden)}) on 20k real Pendulum transitions, denormals flushed, {threads} torch "
            f"threads ({1000 / mine:.2f} ms an update) vs 1; medians of {len(rates['config'])} alternated windows: "
            + ", ".join(f"{a:.0f}/{b:.0f}" for a, b in zip(rates["config"], rates["one"], strict=True)))
    return make_row("learner_update_pendulum_sac", mine, median(rates["one"]), "opt steps/s", note)


def recurrent_update_rows(c: Context) -> list[Row]:
    """R2D2's learner step on its POMDP config against DQN's on the same env, in steps/s and items/s."""
    r2d2_path, dqn_path = (CONFIGS / name for name in RECURRENT_CONFIGS)
    items = SEQUENCE_ITEMS.get(c.settings.mode, SEQUENCE_ITEMS["full"])
    r2d2_cfg, r2d2_replay, r2d2_task = _sampling_task(r2d2_path, items)
    dqn_cfg, dqn_replay, dqn_task = _sampling_task(dqn_path)
    threads = r2d2_cfg.run.torch_threads
    rates = _alternated(c, {
        "r2d2": (threads, _learner_step(r2d2_cfg, r2d2_replay, r2d2_task.agent(device="cpu", seed=0).update)),
        "dqn": (dqn_cfg.run.torch_threads, _learner_step(dqn_cfg, dqn_replay, dqn_task.agent(device="cpu",
                                                                                              seed=0).update))})
    r2d2, dqn = median(rates["r2d2"]), median(rates["dqn"])
    rc, steps = r2d2_cfg.replay, r2d2_cfg.replay.burn_in + r2d2_cfg.replay.sequence_length + 1
    r_batch, d_batch = r2d2_cfg.agent.batch_size, dqn_cfg.agent.batch_size
    windows = ", ".join(f"{a:.0f}/{b:.0f}" for a, b in zip(rates["r2d2"], rates["dqn"], strict=True))
    note = (f"replay.sample + update + update_priorities, {threads} torch thread(s), denormals flushed: R2D2 "
            f"({r2d2_path.name}: batches of {r_batch} sequence items of {steps} steps, burn-in {rc.burn_in} and "
            f"{rc.sequence_length} trained, LSTM {r2d2_cfg.agent.lstm_size}; {len(r2d2_replay)} real items in replay; "
            f"{r2d2 * r_batch * rc.sequence_length:.0f} trained steps/s) vs DQN ({dqn_path.name}: batches of "
            f"{d_batch} transitions, hidden {list(dqn_cfg.agent.hidden)}; 20k real transitions); medians of "
            f"{len(rates['r2d2'])} alternated windows (R2D2/DQN steps/s): {windows}")
    return [make_row("learner_update_r2d2_pomdp", r2d2, dqn, "opt steps/s", note),
            make_row("learner_items_r2d2_pomdp", r2d2 * r_batch, dqn * d_batch, "items/s",
                     f"the row learner_update_r2d2_pomdp in items sampled per second: sequence items of R2D2 vs "
                     f"transitions of DQN ({r_batch} vs {d_batch} an update)")]


def _sampling_task(path: Path, items: int = 20_000) -> tuple[Any, Any, Any]:
    """(config, replay holding ``items`` real items of its env, the task that makes its agents) for ``path``:
    transitions under a random policy, or the sequence items of its acting loop for a recurrent agent."""
    from zmqrl.run.acting import make_task
    from zmqrl.run.startup import make_replay_from

    cfg = load_config(path)
    task = make_task(cfg)
    replay = make_replay_from(cfg, task.batch_spec())
    replay.add(acted_items(cfg, items) if type(cfg.agent).SEQUENCES else transition_pool(cfg, items))
    return cfg, replay, task


def _learner_step(cfg: Any, replay: Any, update: Callable[[Any], tuple[Any, Any]]) -> Callable[[], None]:
    """One step of the learner's loop: sample, update, and priorities back when the update gives them."""
    def one() -> None:
        batch = replay.sample(cfg.agent.batch_size)
        _, priorities = update(batch)
        if priorities is not None:
            replay.update_priorities(batch["indices"], priorities)
    return one


def _alternated(c: Context, steps: dict[str, tuple[int, Callable[[], None]]]) -> dict[str, list[float]]:
    """Calls/s of each ``name: (torch threads, step)``, in windows alternating their order, with
    denormals flushed as the learner's training thread has them."""
    import torch

    from zmqrl.agents.torch_util import flush_denormals

    seconds, reps = max(1.0, c.settings.actor_s * 2), max(1, c.settings.reps) * 2
    rates: dict[str, list[float]] = {name: [] for name in steps}
    threads_before = torch.get_num_threads()
    flushed_before = flush_denormals()
    try:
        for rep in range(reps):
            for name in list(steps) if rep % 2 == 0 else list(steps)[::-1]:
                threads, step = steps[name]
                torch.set_num_threads(threads)
                rates[name].append(calls_per_second(step, seconds))
    finally:
        flush_denormals(flushed_before)  # this process measures other rows after this one
        torch.set_num_threads(threads_before)
    return rates
