"""Learner group: opt steps/s of the real Learner loop while ingesting actors' batches vs idle.

The batches come from feeder processes that behave like actors towards the learner: they
subscribe to its models and its control, send nothing before the first model, and hold while the
rate limiter's ``pause`` (below ``trainer.min_samples_per_insert``) is on or once a grant's
``allow`` is made, as actors do.
"""

from __future__ import annotations

import contextlib
import copy
import io
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from zmqrl.bench.data import TRANSITION_KEYS, transition_pool
from zmqrl.bench.harness import (
    CONFIGS,
    BenchError,
    Context,
    Procs,
    Row,
    calls_per_second,
    child_config,
    free_addr,
    load_arrays,
    load_config,
    make_row,
    median,
    save_arrays,
)
from zmqrl.roles.fit import Allowance
from zmqrl.roles.net import limits, options
from zmqrl.run.lifecycle import StopFlag
from zmqrl.run.rundir import read_json
from zmqrl.wire import (
    BATCH,
    CONTROL,
    MODEL,
    SocketOptions,
    VersionTracker,
    drain_control,
    drain_latest_model,
    encode,
    make_socket,
    new_incarnation,
    send_frames,
)

CONFIG = "cartpole_dqn.yaml"
SAC_CONFIG = "pendulum_sac.yaml"  # the update row of an algorithm without priorities, on two torch threads
FEEDERS = 4
DEFAULT_RATE = 5000.0  # transitions/s each feeder offers while not paused (--actor-rate)


class Control:
    """The learner's requests as an actor reads them from its control: pause and allowance
    (:class:`~zmqrl.roles.fit.Allowance`; ``made`` counts what was made) and ``done`` (the run is over)."""

    def __init__(self, made: Callable[[], int] = lambda: 0) -> None:
        self.made, self.done = made, False
        self.allowance = Allowance()
        self.messages = 0

    def read(self, sock: zmq.Socket, lim: Any) -> None:
        """Take what control came on ``sock`` (a control subscriber)."""
        for msg in drain_control(sock, lim)[0]:
            self.messages += 1
            self.allowance.observe(msg, self.made())
            self.done = self.done or bool(msg.meta.get("done"))

    def hold(self) -> bool:
        """Whether an actor would hold now: paused, or its allowance made."""
        return self.allowance.reached(self.made())


def actor_meta(index: int, sent: int, n_buffer: int, version: int, model_inc: str | None, wall: float,
               blocked_s: float = 0.0, paused_s: float = 0.0, full: bool = True) -> dict[str, Any]:
    """The meta an actor puts on its ``sent``-th batch: three finished episodes and its counters
    (all of them when ``full``, else ``env_steps`` alone: :meth:`~zmqrl.roles.actor.ActorStats.for_batch`)."""
    stats: dict[str, Any] = {"env_steps": (sent + 1) * n_buffer}
    if full:
        stats.update({"host": "bench-host", "episodes": 3 * (sent + 1), "batches": sent,
                      "transitions": sent * n_buffer, "bytes_sent": 0, "blocked_s": round(blocked_s, 3),
                      "paused_s": round(paused_s, 3), "model_updates": 1, "bad_models": 0, "wall_s": round(wall, 3),
                      "env_steps_per_s": (sent + 1) * n_buffer / max(wall, 1e-9)})
    return {"episodes": {"returns": [21.0, 17.0, 30.0], "lengths": [21, 17, 30]}, "actor": index,
            "max_version": version, "model_inc": model_inc, "explore": 0.4, "stats": stats}


def learner_config(path: Path, *overrides: str) -> Any:
    """``path`` as the learner rows train it: no stop return, no opt-step cap, warnings only."""
    return load_config(path, "trainer.stop_return=null", "trainer.max_opts=100000000", "run.log_level=warning",
                       *overrides)


def prefill_pool(c: Context, cfg: Any, name: str) -> tuple[dict[str, np.ndarray], Path]:
    """Real transitions with random priorities to prefill replay (up to 20k) and send, saved for helpers."""
    size = min(20_000, cfg.replay.capacity)
    pool = transition_pool(cfg, size, seed=1)
    pool["priority"] = np.random.default_rng(1).uniform(0.01, 2.0, size).astype(np.float32)
    return pool, save_arrays(c.path(name), pool)


def prefilled_learner(cfg: Any, run_dir: Path, pool: dict[str, np.ndarray], binds: tuple[str, str, str]) -> Any:
    """A real :class:`~zmqrl.roles.learner.Learner` bound at ``binds`` (data, model, eval), its agent
    built (measure training, not its startup) and its replay prefilled with ``pool``."""
    from zmqrl.roles.learner import Learner

    with contextlib.redirect_stderr(io.StringIO()):  # the progress view binds stderr here: keep it quiet
        learner = Learner(copy.deepcopy(cfg), run_dir, *binds)
        learner.agent_ready(block=True)
    learner.replay.add({k: pool[k] for k in TRANSITION_KEYS}, priorities=pool["priority"])
    return learner


def feed(p: dict[str, Any], stop: StopFlag) -> dict[str, Any]:
    """Helper process: PUSH actor-like batches (n_buffer transitions, priorities, the actor's meta) at a
    fixed rate once the first model and control have arrived, holding while the learner asks actors to
    pause (or once a grant's allowance is made) and stopping when it says the run is over."""
    net = child_config(p).net
    pool = load_arrays(p["pool"])
    size, n_buffer = len(pool["reward"]), int(p["n_buffer"])
    interval = n_buffer / float(p["rate"])
    ctx = zmq.Context(io_threads=1)
    push = make_socket(ctx, zmq.PUSH, options(net, SocketOptions.push(sndhwm=int(p["sndhwm"])), data_path=True),
                       connect=p["connect"])
    model_limits, control_limits = limits(net, MODEL), limits(net, CONTROL)
    sub = make_socket(ctx, zmq.SUB, options(net, SocketOptions.models(model_limits)), connect=p["models"])
    csub = make_socket(ctx, zmq.SUB, options(net, SocketOptions.control(control_limits)), connect=p["models"])
    tracker = VersionTracker()
    inc, name, index = new_incarnation(), f"actor-{p['index']}", int(p["index"])
    sent, blocked_s, paused_s, version = 0, 0.0, 0.0, -1
    control = Control(made=lambda: sent * n_buffer)
    offset = (index * 997 * n_buffer) % max(size - n_buffer, 1)
    start = time.monotonic()
    deadline = start + p["timeout_s"]
    first_model_s: float | None = None
    try:
        # no batch before the first model and the first control (which the learner sends from its start)
        while not stop.set and time.monotonic() < deadline and (version < 0 or not control.messages):
            control.read(csub, control_limits)
            if sub.poll(100, zmq.POLLIN):
                msg, _ = drain_latest_model(sub, tracker, model_limits)
                version = msg.version if msg is not None else version
        first_model_s = time.monotonic() - start
        next_t = time.monotonic()
        while not stop.set and not control.done and time.monotonic() < deadline:
            control.read(csub, control_limits)
            msg, _ = drain_latest_model(sub, tracker, model_limits)
            version = msg.version if msg is not None else version
            now = time.monotonic()
            if control.hold():
                csub.poll(50, zmq.POLLIN)
                paused_s += time.monotonic() - now
                next_t = time.monotonic()  # an actor steps on from where it stopped, with no backlog to make up
                continue
            if now < next_t:
                sub.poll(max(1, int(min(next_t - now, 0.05) * 1000)), zmq.POLLIN)
                continue
            next_t = max(next_t + interval, now - 1.0)  # never burst more than 1 s of backlog
            lo = (offset + sent * n_buffer) % (size - n_buffer)
            batch = {k: pool[k][lo:lo + n_buffer] for k in (*TRANSITION_KEYS, "priority")}
            meta = actor_meta(index, sent, n_buffer, version, tracker.incarnation, now - start, blocked_s, paused_s)
            meta["grants"] = control.allowance.stamp()
            frames = encode(BATCH, sender=name, incarnation=inc, seq=sent, version=version, arrays=batch, meta=meta)
            t0 = time.monotonic()
            while not stop.set:
                try:
                    send_frames(push, frames, flags=zmq.NOBLOCK)
                    sent += 1
                    break
                except zmq.Again:
                    push.poll(100, zmq.POLLOUT)
            blocked_s += time.monotonic() - t0
    finally:
        push.close(linger=0)
        sub.close(linger=0)
        csub.close(linger=0)
        ctx.term()
    return {"sent": sent, "controls": control.messages, "transitions": sent * n_buffer, "blocked_s": blocked_s,
            "paused_s": paused_s, "first_model_s": first_model_s, "wall_s": time.monotonic() - start}


def _window(c: Context, cfg: Any, path: Path, pool: dict[str, np.ndarray], pool_path: Path, feeders: int,
            rate: float, tag: str) -> dict[str, float]:
    """Opt steps/s (and transitions/s ingested) of an in-process Learner over one measurement window."""
    s = c.settings
    learner = prefilled_learner(cfg, c.path(f"learner-{tag}"), pool, (free_addr(), free_addr(), free_addr()))
    stop = StopFlag()
    window: dict[str, float] = {}
    abort = threading.Event()

    def clock() -> None:
        if abort.wait(s.settle_s):
            return
        t0, o0, i0, p0 = time.perf_counter(), learner.book.opt_steps, learner.inserted, learner.limiter.pauses
        if abort.wait(s.learner_s):
            return
        t1, o1, i1, p1 = time.perf_counter(), learner.book.opt_steps, learner.inserted, learner.limiter.pauses
        window.update(opt_s=(o1 - o0) / (t1 - t0), ingest_s=(i1 - i0) / (t1 - t0), pauses=float(p1 - p0))
        stop.set = True

    outs = [c.path(f"feed-{tag}-{i}.json") for i in range(feeders)]
    with Procs(c.logs) as procs:
        for i, out in enumerate(outs):
            procs.child(f"feed-{tag}-{i}", feed, {
                "config": str(path), "connect": learner.endpoints["data"], "models": learner.endpoints["model"],
                "pool": str(pool_path), "rate": rate, "n_buffer": cfg.actor.n_buffer, "sndhwm": cfg.actor.send_hwm,
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


def run(c: Context) -> list[Row]:
    """Opt steps/s of the real Learner loop, replay prefilled, idle vs ingesting 4 feeders' batches."""
    import torch

    s = c.settings
    torch.set_num_threads(1)
    path = c.configs(CONFIG)[0]
    cfg = learner_config(path)
    pool, pool_path = prefill_pool(c, cfg, "learner-pool.npz")
    prefill = len(pool["reward"])
    rate = s.actor_rate or DEFAULT_RATE
    idle: list[float] = []
    busy: list[float] = []
    ingest: list[float] = []
    paused: list[float] = []
    rejected = pauses = 0.0
    for rep in range(s.reps):
        idle.append(_window(c, cfg, path, pool, pool_path, 0, rate, f"idle-{rep}")["opt_s"])
        w = _window(c, cfg, path, pool, pool_path, FEEDERS, rate, f"ingest-{rep}")
        busy.append(w["opt_s"])
        ingest.append(w["ingest_s"])
        paused.append(w["paused_share"])
        rejected += w["rejected"]
        pauses += w["pauses"]
    limiter = cfg.trainer.min_samples_per_insert
    limiter_text = (f"rate limiter on as configured (pause below {limiter:g} samples per insert): the feeders "
                    f"were paused {median(paused):.0%} of their running time, {pauses:.0f} pause request(s) in "
                    "the windows" if limiter > 0 else "rate limiter off in this config")
    note = (f"{path.name}: in-process Learner.run, {'prioritized' if cfg.replay.prioritized else 'uniform'} replay "
            f"prefilled with {prefill}; {FEEDERS} feeder processes subscribe to its models like actors and PUSH "
            f"{cfg.actor.n_buffer}-transition batches at up to {rate:,.0f}/s each while not paused; "
            f"{limiter_text}; ingested {median(ingest):,.0f} transitions/s; {rejected:.0f} rejected; "
            f"median of {s.reps}")
    return [make_row("learner_opt_steps", median(busy), median(idle), "opt steps/s", note, (">=", 0.9)),
            update_row(c, path), sac_update_row(c)]


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


def _sampling_task(path: Path) -> tuple[Any, Any, Any]:
    """(config, replay holding 20k real transitions of its env, the task that makes its agents) for ``path``."""
    from zmqrl.run.acting import make_task
    from zmqrl.run.startup import make_replay_from

    cfg = load_config(path)
    task = make_task(cfg)
    replay = make_replay_from(cfg, task.batch_spec())
    replay.add(transition_pool(cfg, 20_000))
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
