"""Actor group: env steps/s of the real actor (sending, taking models) vs its bare acting loop, per config;
and on CartPole without velocities, the real actor with R2D2's numpy LSTM policy (a state per env,
sequence items, their priorities per batch) against DQN's on the same env."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import zmq

from zmqrl.bench.harness import (
    BenchError,
    Context,
    Procs,
    Row,
    await_subscriber,
    child_config,
    free_addr,
    load_arrays,
    load_config,
    make_row,
    median,
    save_arrays,
)
from zmqrl.roles.net import options
from zmqrl.run.lifecycle import StopFlag
from zmqrl.run.rundir import read_json
from zmqrl.wire import BATCH, SocketOptions, encode_model, make_socket, peek_header, send_frames

CONFIGS = ("cartpole_dqn.yaml", "pendulum_sac.yaml", "pong_dqn.yaml", "cartpole_pomdp_dqn.yaml",
           "cartpole_pomdp_r2d2.yaml")
RECURRENT = ("cartpole_pomdp_r2d2", "cartpole_pomdp_dqn")  # (recurrent, feed-forward) run names on one env
MODEL_INTERVAL_S = 0.1  # a new model version this often, as a learner with a short sync interval sends them
# A 6.7 MB Nature CNN every second: a GPU learner at ~100 updates/s and sync_interval 100.
MODEL_INTERVALS_S = {"pong_dqn.yaml": 1.0}
# Smoke runs (plumbing only) act for half a second: too short to fill Pong's batches of 1,024.
SMOKE_OVERRIDES = {"pong_dqn.yaml": ["actor.n_buffer=64"]}


def sink(p: dict[str, Any], stop: StopFlag) -> dict[str, Any]:
    """Helper process: PULL and count batches (by their header: hellos are not) until SIGTERM (the actor's
    stand-in for a proxy)."""
    net = child_config(p).net
    ctx = zmq.Context(io_threads=1)
    pull = make_socket(ctx, zmq.PULL, options(net, SocketOptions.pull(rcvhwm=64), data_path=True), bind=p["bind"])
    batches = nbytes = 0
    deadline = time.monotonic() + p["timeout_s"]
    try:
        while not stop.set and time.monotonic() < deadline:
            if not pull.poll(100, zmq.POLLIN):
                continue
            for _ in range(1000):
                try:
                    frames = pull.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                if peek_header(frames)["kind"] == BATCH:  # (a small batch comes packed in one frame)
                    batches += 1
                    nbytes += sum(len(f.buffer) for f in frames)
    finally:
        pull.close(linger=0)
        ctx.term()
    return {"batches": batches, "bytes": nbytes}


def models(p: dict[str, Any], stop: StopFlag) -> dict[str, Any]:
    """Helper process: publish the params in ``p["params"]`` (an .npz) as a new model version every ``interval_s``.

    The actor's stand-in for a learner, in its own process as a learner is: the first model goes
    out once a subscriber is connected, the rest follow until SIGTERM, each with the meta a
    learner sends (``p["meta"]``: the task signature the actor checks, no pause).
    """
    net = child_config(p).net
    params = load_arrays(p["params"])
    ctx = zmq.Context(io_threads=1)
    pub = make_socket(ctx, zmq.XPUB, options(net, SocketOptions.pub()), bind=p["bind"])
    version = 0
    try:
        await_subscriber(pub, p["timeout_s"])
        while not stop.set:
            try:
                send_frames(pub, encode_model("learner", "bench-learner", version, params, meta=p["meta"]),
                            flags=zmq.NOBLOCK)
                version += 1
            except zmq.Again:
                pass
            time.sleep(p["interval_s"])
    finally:
        pub.close(linger=0)
        ctx.term()
    return {"published": version}


def _bare_loop(actor: Any, seconds: float) -> float:
    """Env steps/s of the actor's own acting loop (vector env, policy, its adder): no sockets, no batching."""
    loop = actor.loop
    n, calls, start = 0, 0, time.perf_counter()
    deadline = start + seconds
    while True:
        n += loop.step().env_steps  # (an EnvPool env that was resetting took none)
        calls += 1
        if calls % 64 == 0 and time.perf_counter() >= deadline:
            return n / (time.perf_counter() - start)


def measure(c: Context, path: Path) -> Row:
    """The real :class:`~zmqrl.roles.actor.Actor` of config ``path`` (PUSH to a sink process, models
    arriving) vs its bare loop, alternated ``actor_reps`` times.

    Models come from another process, as from a learner: a publisher thread in this process
    would take the interpreter lock from the actor, which a real learner never does.
    """
    import torch

    from zmqrl.roles.actor import Actor
    from zmqrl.roles.fit import task_signature
    from zmqrl.run.acting import make_task

    s = c.settings
    torch.set_num_threads(1)
    overrides = ["actor.nice=0", *(SMOKE_OVERRIDES.get(path.name, []) if s.mode == "smoke" else [])]
    cfg = load_config(path, *overrides)
    tag = cfg.run.name
    interval = MODEL_INTERVALS_S.get(path.name, MODEL_INTERVAL_S)
    task = make_task(cfg)
    params_path = save_arrays(c.path(f"actor-{tag}-model.npz"), task.agent().params())
    sink_addr, model_addr = free_addr(), free_addr()
    out = c.path(f"actor-{tag}-sink.json")
    common = {"config": str(path), "overrides": overrides}
    bare: list[float] = []
    real: list[float] = []
    with Procs(c.logs) as procs:
        sink_proc = procs.child(f"actor-{tag}-sink", sink, {**common, "bind": sink_addr, "out": str(out),
                                                            "timeout_s": 600})
        models_proc = procs.child(f"actor-{tag}-models", models, {
            **common, "bind": model_addr, "params": str(params_path), "interval_s": interval,
            "meta": {"pause": False, "task": task_signature(task)},
            "timeout_s": 60, "out": str(c.path(f"actor-{tag}-models.json"))})
        actor = Actor(cfg, 0, sink_addr, model_addr)
        stop = StopFlag()
        try:
            for _ in range(s.actor_reps):
                bare.append(_bare_loop(actor, s.actor_s))
                if not actor.stream.wait(60_000):  # a model is queued: run() finds it at once
                    raise models_proc.failure("no model reached the actor within 60 s")
                steps0 = actor.stats.env_steps
                target = steps0 + max(256, int(bare[-1] * s.actor_s))
                start = time.perf_counter()
                actor.run(stop, max_env_steps=target)
                elapsed = time.perf_counter() - start
                real.append((actor.stats.env_steps - steps0) / elapsed)
        finally:
            actor.close()
        if actor.refused:
            raise BenchError(f"{path.name}: the actor refused the models: {actor.refused}")
        sent = actor.stats.batches
        sink_proc.stop()
        got = (read_json(out) or {}).get("batches", 0)
    measured, baseline = median(real), median(bare)
    c.measured[f"actor_rate_{tag}"] = measured
    pairs = ", ".join(f"{r / b:.2f}" for r, b in zip(real, bare, strict=True))
    note = (f"{path.name}: Actor.run ({type(actor.policy).__name__}) PUSHing to a sink process, a new model every "
            f"{interval:g} s from another process ({actor.stats.model_updates} applied), priorities "
            f"{'computed' if actor.priorities else 'not computed'}, {cfg.env.num_envs} env(s), n_buffer "
            f"{cfg.actor.n_buffer}; baseline: the same ActingLoop (envs + policy + "
            f"{type(actor.loop.adder).__name__}) without sockets; sink got {got}/{sent} batches; figures = medians "
            f"of {s.actor_reps} alternated windows of {s.actor_s:g} s (each window's ratio, not judged: {pairs})")
    return make_row(f"actor_{tag}", measured, baseline, "env steps/s", note, (">=", 0.9))


def recurrent_row(c: Context) -> Row | None:
    """The real actor of R2D2's POMDP config against DQN's on the same env (both measured above), or None
    where this run measured only one of them."""
    recurrent, feed_forward = (c.measured.get(f"actor_rate_{tag}") for tag in RECURRENT)
    if recurrent is None or feed_forward is None:
        return None
    note = (f"Actor.run env steps/s with R2D2's numpy MLP + LSTM policy (configs/{RECURRENT[0]}.yaml: a state per "
            f"env, sequence items, their initial priorities one pass per batch) vs DQN's numpy MLP "
            f"(configs/{RECURRENT[1]}.yaml) on the same CartPole without velocities, each its config's envs and "
            "n_buffer: the rows actor_" + " and actor_".join(RECURRENT))
    return make_row("actor_r2d2_vs_dqn_pomdp", recurrent, feed_forward, "env steps/s", note)


def run(c: Context) -> list[Row]:
    rows = [measure(c, path) for path in c.configs(*CONFIGS)]
    pair = recurrent_row(c)
    return rows + ([pair] if pair is not None else [])

