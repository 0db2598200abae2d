"""Broadcast group: a model's publish -> applied with ``load_params`` in a subscriber process (1 MB, 10 MB)."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import zmq

from zmqrl.bench.harness import (
    BenchError,
    Context,
    Procs,
    Row,
    await_subscriber,
    child_config,
    child_result,
    free_addr,
    load_config,
    make_row,
    median,
)
from zmqrl.roles.net import limits, options
from zmqrl.run.lifecycle import StopFlag
from zmqrl.wire import (
    MODEL,
    SocketOptions,
    VersionTracker,
    drain_latest_model,
    make_socket,
    new_incarnation,
    send_frames,
)

CONFIG = "cartpole_dqn.yaml"


def _hidden_for(nbytes: int) -> int:
    """Width of a two-layer MLP whose float32 parameters take about ``nbytes``."""
    return int(round(math.sqrt(nbytes / 4)))


def modelsub(p: dict[str, Any], stop: StopFlag) -> dict[str, Any]:
    """Helper process: subscribe like an actor (CONFLATE, drain_latest_model) and time publish -> load_params."""
    from zmqrl.run.acting import make_task

    base = child_config(p)

    def policy(h: int) -> Any:
        cfg = child_config({**p, "overrides": [f"agent.hidden=[{h}, {h}]"]})
        return make_task(cfg).policy(0, backend=cfg.actor.backend)

    policies = {str(h): policy(h) for h in p["hidden"]}
    model_limits = limits(base.net, MODEL)
    ctx = zmq.Context(io_threads=1)
    sub = make_socket(ctx, zmq.SUB, options(base.net, SocketOptions.sub(model_limits)), connect=p["connect"])
    tracker = VersionTracker()
    latencies: list[dict[str, Any]] = []
    last_version, deadline = int(p["last_version"]), time.monotonic() + p["timeout_s"]
    last_seen = math.inf  # give up 10 s after the last model once models have arrived
    try:
        while not stop.set and time.monotonic() < deadline and time.monotonic() - last_seen < 10.0:
            if not sub.poll(100, zmq.POLLIN):
                continue
            last_seen = time.monotonic()
            msg, _ = drain_latest_model(sub, tracker, model_limits)
            if msg is None:
                continue
            policies[str(msg.meta["hidden"])].load_params(msg.arrays)
            applied = time.time()
            latencies.append({"version": msg.version, "hidden": msg.meta["hidden"],
                              "ms": (applied - float(msg.meta["t"])) * 1000.0})
            if msg.version >= last_version:
                break
    finally:
        sub.close(linger=0)
        ctx.term()
    return {"latencies": latencies}


def run(c: Context) -> list[Row]:
    """Publish (params + encode + send) -> applied with load_params in a subscriber process: median and p90."""
    import torch

    from zmqrl.run.acting import make_task
    from zmqrl.wire import encode_model

    s = c.settings
    torch.set_num_threads(1)
    path = c.configs(CONFIG)[0]
    cfg = load_config(path)
    sizes = (("broadcast_1mb", 2**20, 5.0, s.publish_gap_s), ("broadcast_10mb", 10 * 2**20, 25.0, 2 * s.publish_gap_s))
    hidden = [_hidden_for(nbytes) for _, nbytes, _, _ in sizes]
    agents = [make_task(load_config(path, f"agent.hidden=[{h}, {h}]")).agent() for h in hidden]
    backend = type(make_task(cfg).policy(0, backend=cfg.actor.backend)).__name__
    n = s.publishes
    addr, out = free_addr(), c.path("modelsub.json")
    with Procs(c.logs) as procs:
        sub = procs.child("modelsub", modelsub, {"connect": addr, "config": str(path), "hidden": hidden,
                                                 "last_version": 2 * n - 1, "out": str(out),
                                                 "timeout_s": 120 + n * 4 * s.publish_gap_s})
        zctx = zmq.Context(io_threads=1)
        pub = make_socket(zctx, zmq.XPUB, options(cfg.net, SocketOptions.pub()), bind=addr)
        inc = new_incarnation()
        try:
            await_subscriber(pub, 90.0)
            version = 0
            for (_, _, _, gap), h, agent in zip(sizes, hidden, agents, strict=True):
                for _ in range(n):
                    t = time.time()
                    frames = encode_model("learner", inc, version, agent.params(), meta={"t": t, "hidden": h})
                    send_frames(pub, frames)
                    version += 1
                    time.sleep(gap)
            result = child_result(sub, out, 30.0)
        finally:
            pub.close(linger=0)
            zctx.term()
    rows = []
    for (name, _, goal_ms, _), h, agent in zip(sizes, hidden, agents, strict=True):
        ms = [e["ms"] for e in result["latencies"] if e["hidden"] == h]
        mb = sum(a.nbytes for a in agent.params().values()) / 2**20
        if not ms:
            raise BenchError(f"{name}: the subscriber applied none of {n} models")
        p90 = float(np.percentile(ms, 90))
        rows.append(make_row(name, median(ms), goal_ms, "ms (median)",
                             f"{path.name}: p90 {p90:.2f} ms; {mb:.2f} MB MLP [{h}, {h}]; applied {len(ms)}/{n}; "
                             f"learner-side params+encode+send -> CONFLATE SUB -> {backend} load_params in another "
                             "process; baseline = the goal, ratio = goal/median", (">=", 1.0), inverse=True))
    return rows
