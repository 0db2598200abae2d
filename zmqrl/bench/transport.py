"""Transport group: batches/s through the real proxy vs a relay inside libzmq, and vs direct PUSH->PULL;
the proxy's CPU per batch when one actor sends at an actor's pace, with its hold and without; and the
bytes per transition real Pong batches take on the wire, full stacks vs frames once (plain, lz4, zstd)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np
import zmq

from zmqrl.bench.data import pong_transitions
from zmqrl.bench.harness import (
    Context,
    Proc,
    Procs,
    Row,
    child_config,
    child_result,
    free_addr,
    make_row,
    median,
    skipped_row,
    zmqrl_argv,
)
from zmqrl.bench.procfs import cpu_seconds
from zmqrl.roles.net import options
from zmqrl.run.lifecycle import StopFlag
from zmqrl.wire import (
    BATCH,
    BUNDLE,
    PACK_MAGIC,
    SocketOptions,
    encode,
    make_socket,
    new_incarnation,
    pack,
    peek_header,
    send_frames,
)

CONFIG = "cartpole_dqn.yaml"  # the proxy's config (its socket options); the payloads are fixed below
PROXY_GOAL = 0.9  # the proxy reaches at least this share of the libzmq relay's rate
PACED_RATE = 400.0  # batches/s of the paced rows' actor: 64-transition batches, a CartPole actor's pace
PACED_BATCH = 64


def payload(kind: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Transport payloads: ``cartpole`` (1024 transitions, float32 obs) or ``atari`` (64, uint8 4x84x84 obs)."""
    rng = np.random.default_rng(seed)
    if kind == "cartpole":
        n, obs = 1024, rng.standard_normal((1025, 4)).astype(np.float32)
        return {"obs": obs[:-1].copy(), "action": rng.integers(0, 2, n), "reward": np.ones(n, np.float32),
                "next_obs": obs[1:].copy(), "discount": np.full(n, 0.99**3, np.float32)}
    if kind == "atari":
        n = 64
        frames = rng.integers(0, 256, (n + 4, 84, 84), dtype=np.uint8)
        obs = np.stack([frames[i:i + 4] for i in range(n)])
        nxt = np.stack([frames[i + 1:i + 5] for i in range(n)])
        return {"obs": obs, "action": rng.integers(0, 6, n), "reward": np.zeros(n, np.float32), "next_obs": nxt,
                "discount": np.full(n, 0.99**3, np.float32)}
    raise ValueError(f"unknown payload {kind!r}")


def recv(p: dict[str, Any], stop: StopFlag) -> dict[str, Any]:
    """Helper process: PULL exactly ``n`` batches (stats reports are skipped; a proxy's bundle counts
    its batches); time first to last."""
    net = child_config(p).net
    ctx = zmq.Context(io_threads=1)
    pull = make_socket(ctx, zmq.PULL, options(net, SocketOptions.pull(rcvhwm=64), data_path=True), bind=p["bind"])
    n, count, nbytes = int(p["n"]), 0, 0
    first = last = 0.0
    deadline = time.monotonic() + p["timeout_s"]
    try:
        while count < n and not stop.set and time.monotonic() < deadline:
            if not pull.poll(100, zmq.POLLIN):
                continue
            while count < n:
                try:
                    frames = pull.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                packed = len(frames) == 1 and bytes(frames[0].buffer[:len(PACK_MAGIC)]) == PACK_MAGIC
                if len(frames) < 2 and not packed:
                    continue  # a proxy's stats report, not a batch
                last = time.perf_counter()
                if count == 0:
                    first = last
                header: dict[str, Any] = peek_header(frames) if packed else {"kind": BATCH}
                count += len(header["meta"]["parts"]) if header["kind"] == BUNDLE else 1
                nbytes += sum(len(f.buffer) for f in frames)
    finally:
        pull.close(linger=0)
        ctx.term()
    return {"count": count, "first": first, "last": last, "bytes": nbytes}


def relay(p: dict[str, Any], stop: StopFlag) -> dict[str, Any]:
    """Helper process: PULL -> PUSH inside libzmq (``zmq.proxy_steerable``), no Python per message, no checks.

    What any proxy hop can reach on this machine. A thread turns SIGTERM (``stop``) into the
    TERMINATE command on the control socket.
    """
    net = child_config(p).net
    ctx = zmq.Context(io_threads=1)
    pull = make_socket(ctx, zmq.PULL, options(net, SocketOptions.pull(rcvhwm=64), data_path=True), bind=p["bind"])
    push = make_socket(ctx, zmq.PUSH, options(net, SocketOptions.push(sndhwm=64), data_path=True),
                       connect=p["connect"])
    control = ctx.socket(zmq.PAIR)
    control.bind("inproc://relay-control")
    command = ctx.socket(zmq.PAIR)
    command.connect("inproc://relay-control")

    def watch() -> None:
        while not stop.set:
            time.sleep(0.05)
        command.send(b"TERMINATE")

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        zmq.proxy_steerable(pull, push, None, control)
    finally:
        watcher.join(5.0)
        for sock in (pull, push, control, command):
            sock.close(linger=0)
        ctx.term()
    return {}


def send(p: dict[str, Any], stop: StopFlag) -> dict[str, Any]:
    """Helper process: PUSH ``n`` BATCH messages of one payload (encoded up front) as fast as the link
    takes them, or ``rate`` a second, each as it comes due. ``batch``: the payload's first that many
    transitions, packed into one frame as an actor sends a small batch."""
    net = child_config(p).net
    arrays = payload(p["payload"])
    batch, rate = int(p.get("batch", 0)), float(p.get("rate", 0.0))
    if batch:
        arrays = {k: v[:batch] for k, v in arrays.items()}
    inc = new_incarnation()
    messages = [encode(BATCH, sender="bench-sender", incarnation=inc, seq=i, version=0, arrays=arrays,
                       meta={"actor": 0}) for i in range(int(p["n"]))]
    if batch:
        messages = [[pack(frames)] for frames in messages]
    ctx = zmq.Context(io_threads=1)
    opts = options(net, SocketOptions.push(sndhwm=16, sndtimeo_ms=int(p["timeout_s"] * 1000)), data_path=True)
    push = make_socket(ctx, zmq.PUSH, opts, connect=p["connect"])
    sent, start = 0, time.monotonic()
    try:
        for frames in messages:
            if stop.set:
                break
            send_frames(push, frames)
            sent += 1
            if rate:
                time.sleep(max(0.0, start + sent / rate - time.monotonic()))
    except zmq.Again:
        pass  # nobody took the messages within the timeout: the parent reports it
    finally:
        push.close(linger=int(p["timeout_s"] * 1000))
        ctx.term()
    return {"sent": sent}


def _paced_once(c: Context, procs: Procs, common: dict[str, Any], proxy: Proc, proxy_addr: str, recv_addr: str,
                n: int, tag: str) -> float:
    """CPU seconds (all its threads) ``proxy`` spent per batch while forwarding ``n`` paced batches."""
    timeout = 60.0 + 2 * n / PACED_RATE
    out_r = c.path(f"recv-{tag}.json")
    receiver = procs.child(f"recv-{tag}", recv, {**common, "bind": recv_addr, "n": n, "out": str(out_r),
                                                 "timeout_s": timeout})
    before = cpu_seconds(proxy.popen.pid, fine=True)
    sender = procs.child(f"send-{tag}", send, {**common, "connect": proxy_addr, "payload": "cartpole", "n": n,
                                               "batch": PACED_BATCH, "rate": PACED_RATE,
                                               "out": str(c.path(f"send-{tag}.json")), "timeout_s": timeout})
    result = child_result(receiver, out_r, timeout + 15)
    used = cpu_seconds(proxy.popen.pid, fine=True) - before
    sender.wait(15.0)
    if result["count"] < n:
        raise receiver.failure(f"received {result['count']}/{n} paced batches via {proxy.name}")
    return used / n


def paced_row(c: Context, procs: Procs, common: dict[str, Any], path: Any) -> Row:
    """The proxy's CPU per batch, one actor sending at ``PACED_RATE``: with its hold (the default
    ``net.proxy_hold_ms``) against ``net.proxy_hold_ms=0``, alternated."""
    s = c.settings
    n = max(20, round(PACED_RATE * s.paced_s))
    recv_addr = free_addr()
    proxies = {}
    for hold in ("default", "0"):
        addr = free_addr()
        sets = ["--set", "run.log_level=warning"] + (["--set", "net.proxy_hold_ms=0"] if hold == "0" else [])
        proxies[hold] = (procs.start(f"paced-proxy-{hold}", zmqrl_argv(
            "proxy", str(path), "--bind", addr, "--learner", recv_addr, "--models", free_addr(), *sets)), addr)
    for hold, (proc, addr) in proxies.items():  # each proxy up and linked before anything is timed
        _paced_once(c, procs, common, proc, addr, recv_addr, 20, f"paced-{hold}-warmup")
    per: dict[str, list[float]] = {"default": [], "0": []}
    for rep in range(s.reps):
        for hold, (proc, addr) in proxies.items():
            if not proc.alive():
                raise proc.failure(f"{proc.name} exited")
            per[hold].append(_paced_once(c, procs, common, proc, addr, recv_addr, n, f"paced-{hold}-{rep}"))
    held, unheld = median(per["default"]) * 1e6, median(per["0"]) * 1e6
    return make_row(
        "transport_proxy_cpu_paced", held, unheld, "us",
        f"`zmqrl proxy` process CPU (every thread) per {PACED_BATCH}-transition batch, one actor sending "
        f"{PACED_RATE:.0f} batches/s as they come due, {n} batches, median of {s.reps}: with its default hold "
        f"(net.proxy_hold_ms) vs net.proxy_hold_ms=0 (each batch read as it comes), alternated")


def _once(c: Context, procs: Procs, common: dict[str, Any], kind: str, n: int, send_to: str, recv_at: str,
          tag: str) -> float:
    """Batches/s of one sender -> receiver run of ``n`` messages (through whatever listens at ``send_to``)."""
    timeout = 60.0 + n * (0.02 if kind == "atari" else 0.002)
    out_r, out_s = c.path(f"recv-{tag}.json"), c.path(f"send-{tag}.json")
    receiver = procs.child(f"recv-{tag}", recv, {**common, "bind": recv_at, "n": n, "out": str(out_r),
                                                 "timeout_s": timeout})
    sender = procs.child(f"send-{tag}", send, {**common, "connect": send_to, "payload": kind, "n": n,
                                               "out": str(out_s), "timeout_s": timeout})
    result = child_result(receiver, out_r, timeout + 15)
    sender.wait(15.0)
    if result["count"] < n or result["last"] <= result["first"]:
        raise receiver.failure(f"received {result['count']}/{n} messages")
    return float((result["count"] - 1) / (result["last"] - result["first"]))


def run(c: Context) -> list[Row]:
    """Batches/s from a sender process to a receiver process: through a real ``zmqrl proxy``, through a
    relay inside libzmq (no Python, no checks: what any proxy hop reaches here), and directly.

    The proxy is judged against the relay; the direct ratio is reported only: with three processes
    on two cores, no hop comes near direct, whatever it does per message.
    """
    s = c.settings
    path = c.configs(CONFIG)[0]
    common = {"config": str(path)}
    proxy_addr, relay_addr, recv_addr, no_models = free_addr(), free_addr(), free_addr(), free_addr()
    rows = []
    with Procs(c.logs) as procs:
        proxy = procs.start("transport-proxy", zmqrl_argv(  # --models: nobody there, so no run ever ends it
            "proxy", str(path), "--bind", proxy_addr, "--learner", recv_addr, "--models", no_models,
            "--set", "run.log_level=warning"))
        relay_proc = procs.child("transport-relay", relay, {**common, "bind": relay_addr, "connect": recv_addr,
                                                            "out": str(c.path("relay.json"))})
        for kind, n in (("cartpole", s.small_messages), ("atari", s.large_messages)):
            rates: dict[str, list[float]] = {"direct": [], "proxy": [], "relay": []}
            hops: list[tuple[str, Proc | None, str]] = [("direct", None, recv_addr), ("proxy", proxy, proxy_addr),
                                                        ("relay", relay_proc, relay_addr)]
            for rep in range(s.reps):
                for via, proc, addr in hops:
                    if proc is not None and not proc.alive():
                        raise proc.failure(f"{proc.name} exited")
                    rates[via].append(_once(c, procs, common, kind, n, addr, recv_addr, f"{kind}-{via}-{rep}"))
            arrays = payload(kind)
            mb = sum(a.nbytes for a in arrays.values()) / 2**20
            per = len(arrays["reward"])
            proxied, ceiling, direct = (median(rates[k]) for k in ("proxy", "relay", "direct"))
            what = (f"{n} messages of {per} transitions ({mb:.2f} MB) from a sender process to a receiver process, "
                    f"median of {s.reps}")
            rows.append(make_row(
                f"transport_{kind}_{per}", proxied, ceiling, "batches/s",
                f"{what}: through `zmqrl proxy` ({proxied * per:,.0f} transitions/s) vs through a relay inside "
                f"libzmq (zmq.proxy_steerable: no Python, no checks), each hop measured right after the other",
                (">=", PROXY_GOAL)))
            rows.append(make_row(
                f"transport_{kind}_{per}_direct", proxied, direct, "batches/s",
                f"{what}: through `zmqrl proxy` vs direct PUSH->PULL (not judged: the relay reached "
                f"{ceiling / direct:.2f} of direct, the most any hop reaches with 3 processes on "
                f"{os.cpu_count()} CPUs)"))
        proxy.stop(10.0)
        relay_proc.stop(10.0)
        rows.append(paced_row(c, procs, common, path))
    rows += frames_rows(c)
    return rows


# --------------------------------------------------------------------------- image frames on the wire

FRAME_GOAL = 1.1  # frames' bytes per transition on the wire (uncompressed), the compact format's goal


def wire_figures(spec: dict[str, Any], batch: dict[str, np.ndarray], n_buffer: int, reps: int = 3
                 ) -> dict[str, dict[str, float]]:
    """Per way of sending (full stacks, compact, compact + lz4, compact + zstd): bytes per transition of
    the encoded BATCH messages of ``n_buffer`` transitions each (header included), frames per transition,
    and the actor's encode plus the learner's decode (and stack rebuild) in us per transition (best of ``reps``)."""
    from zmqrl.frames import image_fields
    from zmqrl.wire import DEFAULT_COPY_THRESHOLD, BatchEncoder, decode
    from zmqrl.wire.compact import FrameCompactor, expand

    fields = image_fields(spec)
    batches = [{k: v[lo:lo + n_buffer] for k, v in batch.items()}
               for lo in range(0, len(batch["reward"]) - n_buffer + 1, n_buffer)]
    transitions = n_buffer * len(batches)
    frame_bytes = int(np.prod(spec[fields[0]][1][1:]))
    out: dict[str, dict[str, float]] = {}
    for way in ("full", "none", "lz4", "zstd"):
        best, wire = float("inf"), 0
        for _ in range(reps):
            compactor = FrameCompactor(fields, "none" if way == "full" else way)
            encoder = BatchEncoder("actor-0", "inc", pack_below=DEFAULT_COPY_THRESHOLD)
            wire = 0
            started = time.perf_counter()
            for seq, part in enumerate(batches):
                arrays, meta = (part, {}) if way == "full" else compactor.compact(part)
                frames = [bytes(f) for f in encoder.encode(seq, 0, arrays, {"explore": 0.1, **meta})]
                wire += sum(len(f) for f in frames)
                msg = expand(decode(frames), spec)
                assert np.array_equal(msg.arrays["next_obs"], part["next_obs"])
            best = min(best, time.perf_counter() - started)
        out[way] = {"bytes_per_transition": wire / transitions, "frames_bytes": wire / transitions / frame_bytes,
                    "frames_per_transition": 2 * int(spec[fields[0]][1][0]) if way == "full"
                    else compactor.frames / max(compactor.transitions, 1),
                    "us_per_transition": best / transitions * 1e6}
    return out


def frames_rows(c: Context) -> list[Row]:
    """Bytes per transition on the wire for real Pong batches: full stacks vs compact vs compact + lz4 vs
    compact + zstd, at the shipped n_buffer (32) and at 128."""
    try:
        import ale_py  # noqa: F401
    except ImportError:
        return [skipped_row("wire_pong_frames_32", "frames' bytes", "ale-py is not installed", ("<=", 1.0))]
    n = 2048 if c.settings.reps > 1 else 1024
    spec, batch = pong_transitions(n, config=c.configs("pong_dqn.yaml")[0])
    rows = []
    for n_buffer in (32, 128):
        fig = wire_figures(spec, batch, n_buffer, reps=max(1, c.settings.reps))
        note = ", ".join(f"{way}: {f['bytes_per_transition']:,.0f} B ({f['frames_per_transition']:.2f} frames, "
                         f"{f['us_per_transition']:.1f} us encode+decode)" for way, f in fig.items())
        rows.append(make_row(
            f"wire_pong_frames_{n_buffer}", fig["none"]["frames_bytes"], FRAME_GOAL, "frames' bytes",
            f"{n} Pong transitions of the shipped config's actor (4 envs, 3-step) in BATCH messages of {n_buffer}, "
            f"frames' bytes per transition on the wire, compact, uncompressed, vs the goal {FRAME_GOAL}; per "
            f"transition: {note}", ("<=", 1.0)))
        for way in ("lz4", "zstd"):
            rows.append(make_row(
                f"wire_pong_bytes_{way}_{n_buffer}", fig[way]["bytes_per_transition"],
                fig["full"]["bytes_per_transition"], "bytes",
                f"bytes per transition on the wire, compact + {way} (net.compress={way}) vs full stacks, "
                f"batches of {n_buffer}: encode+decode {fig[way]['us_per_transition']:.1f} us per transition "
                f"vs {fig['full']['us_per_transition']:.1f}"))
    return rows
