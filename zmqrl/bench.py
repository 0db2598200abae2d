"""``zmqrl bench``: each performance goal of the design measured next to its baseline, in one run.

Every row compares a measured figure with a baseline measured in the same run on the same
machine (or with the goal itself where the goal is absolute) and reports their ratio:

=================  ==============================================================  ============
group (--only)     measured vs baseline                                            goal (ratio)
=================  ==============================================================  ============
replay             bytes per stored transition vs the transition's raw payload    <= 1.1
                   (and, for stacked frames, vs storing obs and next_obs)          <= 0.35
actor              env steps/s of the real actor sending to a sink vs a bare loop  >= 0.9
transport          batches/s through the proxy vs direct PUSH->PULL                >= 0.8
                   (and a libzmq relay's, the ceiling of any proxy hop)            (none)
learner            opt steps/s while ingesting 4 actors' batches vs idle           >= 0.9
broadcast          model publish -> loaded in a subscriber process (median ms)     goal/ms >= 1
startup            ``zmqrl local`` launch -> first transition in replay (s)        goal/s >= 1
scaling            env steps/s of ``zmqrl local`` with N actors vs 1 actor         (none)
solve              time to solve CartPole: ``zmqrl local`` vs ``zmqrl train``       (none)
                   (and vs Stable-Baselines3 DQN with ``--sb3``)                   <= 0.5
=================  ==============================================================  ============

Measurement hygiene: every process this module starts runs in its own session with
``OMP_NUM_THREADS=1`` and a log file, every wait has a deadline, and every process is stopped
(SIGTERM, then SIGKILL) when its measurement ends, pass or fail. Seeds are fixed. Helper
processes are ``python -c`` children running :func:`child_main`; they import numpy, pyzmq and
:mod:`zmqrl.wire` only (torch only where a policy is needed), so they start in well under a
second.

    zmqrl bench                       # everything, < 10 minutes on 2 cores
    zmqrl bench --quick --json b.json # ~2 minutes
    zmqrl bench --only actor,transport
    zmqrl bench --only solve --sb3 --sb3-python /tmp/sb3venv/bin/python
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import io
import json
import logging
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import zmq

from zmqrl.roles.common import read_json
from zmqrl.wire import (
    BATCH,
    Limits,
    SocketOptions,
    VersionTracker,
    drain_latest_model,
    encode,
    make_socket,
    new_incarnation,
    send_frames,
)

log = logging.getLogger("zmqrl")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "configs" / "cartpole_dqn.yaml"
HOST = "127.0.0.1"
GROUPS = ("replay", "actor", "transport", "learner", "broadcast", "startup", "scaling", "solve")
TRANSITION_KEYS = ("obs", "action", "reward", "next_obs", "discount")
DEFAULT_ACTOR_RATE = 5000.0  # transitions/s per simulated actor in the learner row
SOLVE_RETURN = 475.0


class BenchError(RuntimeError):
    """A measurement could not be taken (a process died, a deadline passed)."""


# ------------------------------------------------------------------------------------- rows


@dataclass
class Row:
    """One line of the table (and one object of the JSON list)."""

    name: str
    measured: float | None
    baseline: float | None
    ratio: float | None
    goal: str | None  # a condition on ``ratio``, e.g. ">= 0.9"; None where there is no goal
    met: bool | None  # None where there is no goal or nothing was measured
    unit: str = ""
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def make_row(name: str, measured: float | None, baseline: float | None, unit: str, note: str,
             goal: tuple[str, float] | None = None, ratio: float | None = None) -> Row:
    """A row whose ratio is ``measured / baseline`` unless given; ``goal`` = (">=" or "<=", value) on the ratio."""
    if ratio is None and measured is not None and baseline:
        ratio = measured / baseline
    row = Row(name, _clean(measured), _clean(baseline), _clean(ratio), None, None, unit, note)
    if goal is not None:
        op, value = goal
        row.goal = f"{op} {value:g}"
        if row.ratio is not None:
            row.met = row.ratio >= value if op == ">=" else row.ratio <= value
    return row


def skipped_row(name: str, unit: str, reason: str, goal: tuple[str, float] | None = None) -> Row:
    """A row that was not measured (``met`` stays None)."""
    row = make_row(name, None, None, unit, f"skipped: {reason}", goal)
    return row


def _clean(value: float | None) -> float | None:
    """Plain floats rounded to 5 significant digits (JSON-friendly)."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{float(value):.5g}")


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


# ------------------------------------------------------------------------------------- settings


@dataclass
class Settings:
    """Durations and counts of one suite run; see :meth:`preset`."""

    mode: str = "full"
    reps: int = 2  # alternations of measured and baseline in the transport and learner rows
    actor_reps: int = 6  # actor row: alternations of bare loop and real actor; the ratio is their pairs' median
    actor_s: float = 1.5  # seconds per actor measurement
    small_messages: int = 20_000  # transport: messages of 1024 CartPole transitions
    large_messages: int = 400  # transport: messages of 64 Atari-sized transitions
    learner_s: float = 8.0  # seconds of optimisation per learner measurement window
    settle_s: float = 2.0  # seconds before a learner window opens (senders connected, loop running)
    publishes: int = 50  # model broadcasts per model size
    publish_gap_s: float = 0.1  # seconds between 1 MB broadcasts (10 MB: twice that)
    scaling: tuple[int, ...] = (1, 2, 4)  # actor counts; the first is the baseline
    scaling_window_s: float = 10.0  # seconds between the learner summaries compared
    startup_reps: int = 3
    seeds: int = 3  # solve: seeds 0..seeds-1
    solve_budget_s: float = 330.0  # wall-clock budget of all capped ``zmqrl local``/``train`` solve runs
    actor_rate: float = 0.0  # learner row: transitions/s per simulated actor; 0 = DEFAULT_ACTOR_RATE
    sb3: bool = False
    sb3_python: str = ""
    config: Path = DEFAULT_CONFIG
    keep: Path | None = None  # keep run directories and logs here

    @classmethod
    def preset(cls, mode: str, **overrides: Any) -> Settings:
        """``full`` (< 10 min on 2 cores), ``quick`` (~2 min) or ``smoke`` (plumbing only, ~1 min)."""
        if mode == "quick":
            base = cls(mode="quick", reps=1, actor_reps=2, actor_s=1.5, small_messages=5000, large_messages=100,
                       learner_s=4.0, settle_s=1.5, publishes=20, scaling_window_s=5.0, startup_reps=1, seeds=1,
                       solve_budget_s=60.0)
        elif mode == "smoke":
            base = cls(mode="smoke", reps=1, actor_reps=1, actor_s=0.5, small_messages=300, large_messages=20,
                       learner_s=1.0, settle_s=1.0, publishes=5, publish_gap_s=0.05, scaling=(1,), scaling_window_s=0.0,
                       startup_reps=1, seeds=1, solve_budget_s=14.0)
        elif mode == "full":
            base = cls()
        else:
            raise ValueError(f"unknown bench mode {mode!r}")
        return dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})


@dataclass
class Context:
    """What the groups of one run share: settings, a work directory, figures measured so far."""

    settings: Settings
    work: Path
    measured: dict[str, float] = field(default_factory=dict)

    @property
    def logs(self) -> Path:
        path = self.work / "logs"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def path(self, name: str) -> Path:
        return self.work / name


def _tcp(port: int) -> str:
    return f"tcp://{HOST}:{port}"


def _free_addr() -> str:
    from zmqrl.roles.common import free_port

    return _tcp(free_port(HOST))


def _load_config(s: Settings, *overrides: str) -> Any:
    from zmqrl import config as config_mod

    return config_mod.load(s.config, ["run.seed=0", *overrides])


# ------------------------------------------------------------------------------------- processes


def _child_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _zmqrl_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "zmqrl.cli", *args]


_BOOT = "import sys; from zmqrl.bench import child_main; sys.exit(child_main(sys.argv[1:]))"


class Proc:
    """One process this suite started: its own session, a log file, bounded waits."""

    def __init__(self, name: str, argv: list[str], log_dir: Path) -> None:
        self.name, self.argv = name, argv
        self.log_path = log_dir / f"{name}.log"
        with open(self.log_path, "wb") as fh:
            self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                          env=_child_env(), start_new_session=True)
        self.started = time.monotonic()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if still running after ``timeout`` seconds."""
        try:
            return self.popen.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the session this process leads."""
        if self.alive():
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.popen.kill()

    def stop(self, grace_s: float = 5.0) -> int | None:
        """SIGTERM, wait up to ``grace_s``, then SIGKILL; returns the exit code."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            if self.wait(grace_s) is None:
                self.kill()
        return self.wait(5.0)

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(f"    {line}" for line in text[-lines:])

    def failure(self, what: str) -> BenchError:
        return BenchError(f"{what} ({self.name}, exit code {self.popen.poll()}, log {self.log_path}):\n{self.tail()}")


def _pids_with_arg(arg: str) -> list[int]:
    """Live processes that have ``arg`` as one exact command-line argument (a unique run directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except (OSError, IndexError):
            continue
        if arg.encode() in argv and state != "Z":
            found.append(int(entry.name))
    return found


class Procs:
    """The processes of one measurement; leaving the ``with`` block stops every one of them."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[Proc] = []
        self.sweep_args: list[str] = []  # afterwards, stop leftovers whose command line holds one of these

    def __enter__(self) -> Procs:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop_all()

    def start(self, name: str, argv: list[str]) -> Proc:
        proc = Proc(name, argv, self.log_dir)
        self.procs.append(proc)
        return proc

    def child(self, name: str, kind: str, params: dict[str, Any]) -> Proc:
        """A helper process running ``child_main([kind, json(params)])``."""
        return self.start(name, [sys.executable, "-c", _BOOT, kind, json.dumps(params)])

    def stop_all(self, grace_s: float = 10.0) -> None:
        for proc in self.procs:
            if proc.alive():
                proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            if proc.wait(deadline - time.monotonic()) is None:
                proc.kill()
                proc.wait(5.0)
        for arg in self.sweep_args:
            _kill_pids(_pids_with_arg(arg))


def _kill_pids(pids: list[int], grace_s: float = 5.0) -> None:
    """SIGTERM each pid, then SIGKILL whatever is left after ``grace_s``."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)




def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def _child_result(proc: Proc, out: Path, timeout_s: float) -> dict[str, Any]:
    """Wait for a helper to exit and return what it wrote to ``out``."""
    code = proc.wait(timeout_s)
    if code is None:
        proc.stop()
        raise proc.failure(f"no result within {timeout_s:.0f}s")
    result = read_json(out)
    if code != 0 or result is None:
        raise proc.failure("helper failed")
    return result


# ------------------------------------------------------------------------------------- helper processes


class _Flag:
    """Set by SIGTERM/SIGINT in a helper process."""

    def __init__(self) -> None:
        self.set = False
        signal.signal(signal.SIGTERM, self._on)
        signal.signal(signal.SIGINT, self._on)

    def _on(self, signum: int, frame: Any) -> None:
        self.set = True


def _data_options(base: SocketOptions) -> SocketOptions:
    """The options roles use on the back-pressured batch links (no heartbeats, queue across reconnects)."""
    return dataclasses.replace(base, heartbeat_ivl_ms=0, heartbeat_timeout_ms=0, heartbeat_ttl_ms=0,
                               immediate=False, tcp_keepalive_s=60)


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


def _child_sink(p: dict[str, Any], flag: _Flag) -> dict[str, Any]:
    """PULL and count batches until SIGTERM (the actor row's stand-in for a proxy)."""
    ctx = zmq.Context(io_threads=1)
    pull = make_socket(ctx, zmq.PULL, _data_options(SocketOptions.pull(rcvhwm=64)), bind=p["bind"])
    batches = nbytes = 0
    deadline = time.monotonic() + p["timeout_s"]
    try:
        while not flag.set and time.monotonic() < deadline:
            if not pull.poll(100, zmq.POLLIN):
                continue
            for _ in range(1000):
                try:
                    frames = pull.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                if len(frames) > 1:
                    batches += 1
                    nbytes += sum(len(f.buffer) for f in frames)
    finally:
        pull.close(linger=0)
        ctx.term()
    return {"batches": batches, "bytes": nbytes}


def _child_recv(p: dict[str, Any], flag: _Flag) -> dict[str, Any]:
    """PULL exactly ``n`` batches (single-frame stats messages are skipped); time first to last."""
    ctx = zmq.Context(io_threads=1)
    pull = make_socket(ctx, zmq.PULL, _data_options(SocketOptions.pull(rcvhwm=64)), bind=p["bind"])
    n, count, nbytes = int(p["n"]), 0, 0
    first = last = 0.0
    deadline = time.monotonic() + p["timeout_s"]
    try:
        while count < n and not flag.set and time.monotonic() < deadline:
            if not pull.poll(100, zmq.POLLIN):
                continue
            while count < n:
                try:
                    frames = pull.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                if len(frames) < 2:
                    continue
                last = time.perf_counter()
                if count == 0:
                    first = last
                count += 1
                nbytes += sum(len(f.buffer) for f in frames)
    finally:
        pull.close(linger=0)
        ctx.term()
    return {"count": count, "first": first, "last": last, "bytes": nbytes}


def _child_relay(p: dict[str, Any], flag: _Flag) -> dict[str, Any]:
    """PULL -> PUSH inside libzmq (``zmq.proxy_steerable``), no Python per message and no checks.

    The transport rows' ceiling: what any proxy hop can reach on this machine. A thread turns
    SIGTERM (``flag``) into the TERMINATE command on the control socket.
    """
    ctx = zmq.Context(io_threads=1)
    pull = make_socket(ctx, zmq.PULL, _data_options(SocketOptions.pull(rcvhwm=64)), bind=p["bind"])
    push = make_socket(ctx, zmq.PUSH, _data_options(SocketOptions.push(sndhwm=64)), connect=p["connect"])
    control = ctx.socket(zmq.PAIR)
    control.bind("inproc://relay-control")
    command = ctx.socket(zmq.PAIR)
    command.connect("inproc://relay-control")

    def watch() -> None:
        while not flag.set:
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


def _child_models(p: dict[str, Any], flag: _Flag) -> dict[str, Any]:
    """Publish the params in ``p["params"]`` (an .npz) as a new model version every ``interval_s``.

    The actor row's stand-in for a learner, in its own process as a learner is: the first model
    goes out once a subscriber is connected, the rest follow until SIGTERM.
    """
    from zmqrl.wire import encode_model

    with np.load(p["params"], allow_pickle=False) as npz:
        params = {k: npz[k] for k in npz.files}
    ctx = zmq.Context(io_threads=1)
    pub = make_socket(ctx, zmq.XPUB, SocketOptions.pub(), bind=p["bind"])
    version = 0
    try:
        _await_subscriber(pub, p["timeout_s"])
        while not flag.set:
            with contextlib.suppress(zmq.Again):
                send_frames(pub, encode_model("learner", "bench-learner", version, params), flags=zmq.NOBLOCK)
                version += 1
            time.sleep(p["interval_s"])
    finally:
        pub.close(linger=0)
        ctx.term()
    return {"published": version}


def _child_send(p: dict[str, Any], flag: _Flag) -> dict[str, Any]:
    """PUSH ``n`` BATCH messages of one payload as fast as the link takes them (headers encoded up front)."""
    arrays = payload(p["payload"])
    inc = new_incarnation()
    messages = [encode(BATCH, sender="bench-sender", incarnation=inc, seq=i, version=0, arrays=arrays,
                       meta={"actor": 0}) for i in range(int(p["n"]))]
    ctx = zmq.Context(io_threads=1)
    opts = _data_options(SocketOptions.push(sndhwm=16, sndtimeo_ms=int(p["timeout_s"] * 1000)))
    push = make_socket(ctx, zmq.PUSH, opts, connect=p["connect"])
    sent = 0
    try:
        for frames in messages:
            if flag.set:
                break
            send_frames(push, frames)
            sent += 1
    except zmq.Again:
        pass  # nobody took the messages within the timeout: the parent reports it
    finally:
        push.close(linger=int(p["timeout_s"] * 1000))
        ctx.term()
    return {"sent": sent}


def _child_feed(p: dict[str, Any], flag: _Flag) -> dict[str, Any]:
    """PUSH actor-like batches (n_buffer transitions, priorities, the actor's meta) at a fixed rate."""
    with np.load(p["pool"], allow_pickle=False) as npz:
        pool = {k: npz[k] for k in npz.files}
    size, n_buffer = len(pool["reward"]), int(p["n_buffer"])
    interval = n_buffer / float(p["rate"])
    ctx = zmq.Context(io_threads=1)
    push = make_socket(ctx, zmq.PUSH, _data_options(SocketOptions.push(sndhwm=int(p["sndhwm"]))),
                       connect=p["connect"])
    inc, name, index = new_incarnation(), f"actor-{p['index']}", int(p["index"])
    sent, blocked_s, start = 0, 0.0, time.monotonic()
    offset = (index * 997 * n_buffer) % max(size - n_buffer, 1)
    next_t = start
    deadline = start + p["timeout_s"]
    try:
        while not flag.set and time.monotonic() < deadline:
            now = time.monotonic()
            if now < next_t:
                time.sleep(min(next_t - now, 0.05))
                continue
            next_t = max(next_t + interval, now - 1.0)  # never burst more than 1 s of backlog
            lo = (offset + sent * n_buffer) % (size - n_buffer)
            batch = {k: pool[k][lo:lo + n_buffer] for k in (*TRANSITION_KEYS, "priority")}
            wall = time.monotonic() - start
            stats = {"env_steps": (sent + 1) * n_buffer, "episodes": 3 * (sent + 1), "batches": sent,
                     "transitions": sent * n_buffer, "bytes_sent": 0, "blocked_s": round(blocked_s, 3),
                     "paused_s": 0.0, "model_updates": 1, "bad_models": 0, "wall_s": round(wall, 3),
                     "env_steps_per_s": (sent + 1) * n_buffer / max(wall, 1e-9)}
            meta = {"episodes": {"returns": [21.0, 17.0, 30.0], "lengths": [21, 17, 30]}, "actor": index,
                    "max_version": 0, "model_inc": p["model_inc"], "epsilon": 0.4, "stats": stats}
            frames = encode(BATCH, sender=name, incarnation=inc, seq=sent, version=0, arrays=batch, meta=meta)
            t0 = time.monotonic()
            while not flag.set:
                try:
                    send_frames(push, frames, flags=zmq.NOBLOCK)
                    sent += 1
                    break
                except zmq.Again:
                    push.poll(100, zmq.POLLOUT)
            blocked_s += time.monotonic() - t0
    finally:
        push.close(linger=0)
        ctx.term()
    return {"sent": sent, "blocked_s": blocked_s, "wall_s": time.monotonic() - start}


def _child_modelsub(p: dict[str, Any], flag: _Flag) -> dict[str, Any]:
    """Subscribe like an actor (CONFLATE, drain_latest_model) and time publish -> load_params per model."""
    from zmqrl import config as config_mod
    from zmqrl.acting import make_task

    def policy(h: int) -> Any:
        cfg = config_mod.load(p["config"], [f"agent.hidden=[{h}, {h}]"])
        return make_task(cfg).policy(0, backend=cfg.actor.backend)

    policies = {str(h): policy(h) for h in p["hidden"]}
    limits = Limits.only(["model"])
    ctx = zmq.Context(io_threads=1)
    sub = make_socket(ctx, zmq.SUB, SocketOptions.sub(limits), connect=p["connect"])
    tracker = VersionTracker()
    latencies: list[dict[str, Any]] = []
    last_version, deadline = int(p["last_version"]), time.monotonic() + p["timeout_s"]
    last_seen = math.inf  # give up 10 s after the last model once models have arrived
    try:
        while not flag.set and time.monotonic() < deadline and time.monotonic() - last_seen < 10.0:
            if not sub.poll(100, zmq.POLLIN):
                continue
            last_seen = time.monotonic()
            msg, _ = drain_latest_model(sub, tracker, limits)
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


CHILDREN: dict[str, Callable[[dict[str, Any], _Flag], dict[str, Any]]] = {
    "sink": _child_sink, "recv": _child_recv, "send": _child_send, "feed": _child_feed,
    "modelsub": _child_modelsub, "relay": _child_relay, "models": _child_models,
}


def child_main(argv: list[str]) -> int:
    """Entry point of a helper process: ``KIND JSON_PARAMS``; writes its result to ``params["out"]``."""
    kind, params = argv[0], json.loads(argv[1])
    flag = _Flag()
    result = CHILDREN[kind](params, flag)
    _write_json(Path(params["out"]), result)
    return 0


# ------------------------------------------------------------------------------------- replay


def uniform_actions(stepper: Any, rng: np.random.Generator) -> np.ndarray:
    """One uniformly random action per env of a vector (dtype as the single env's action space)."""
    space = stepper.vec.single_action_space
    space.seed(int(rng.integers(2**31)))
    return np.stack([np.asarray(space.sample()) for _ in range(stepper.num_envs)])


def transition_pool(cfg: Any, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` real n-step transitions of the configured env under a uniform random policy, as the actor builds them."""
    from zmqrl.envs import VectorStepper, make_vector_env
    from zmqrl.replay import NStepBuilder

    stepper = VectorStepper(make_vector_env(cfg.env, cfg.env.num_envs, seed), seed)
    nstep = NStepBuilder(cfg.env.num_envs, cfg.agent.n_step, cfg.agent.gamma)
    rng = np.random.default_rng(seed)
    parts, count = [], 0
    try:
        while count < n:
            step = stepper.step(uniform_actions(stepper, rng))
            out = nstep.push(step.obs, step.action, step.reward, step.next_obs, step.terminated, step.truncated)
            if out is not None:
                parts.append(out)
                count += len(out["reward"])
    finally:
        stepper.close()
    return {k: np.ascontiguousarray(np.concatenate([p[k] for p in parts])[:n]) for k in TRANSITION_KEYS}


NOISE_FRAMES_ID = "zmqrl/NoiseFrames-v0"


def _register_noise_frames() -> None:
    """Register an env of 84x84 uint8 noise frames (Atari's observation shape without ALE)."""
    import gymnasium as gym

    class NoiseFrames(gym.Env):
        """A new random 84x84 frame every step; episodes of ``episode_len`` steps."""

        observation_space = gym.spaces.Box(0, 255, (84, 84), np.uint8)
        action_space = gym.spaces.Discrete(6)

        def __init__(self, **kwargs: Any) -> None:
            self.episode_len, self.t = int(kwargs.get("episode_len", 400)), 0

        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
            super().reset(seed=seed)
            self.t = 0
            return self.np_random.integers(0, 256, (84, 84), dtype=np.uint8), {}

        def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
            self.t += 1
            frame = self.np_random.integers(0, 256, (84, 84), dtype=np.uint8)
            return frame, 0.0, self.t >= self.episode_len, False, {}

    if NOISE_FRAMES_ID not in gym.registry:
        gym.register(NOISE_FRAMES_ID, entry_point=NoiseFrames)


def bench_replay(c: Context) -> list[Row]:
    """Bytes per stored transition for CartPole and for stacked Atari-sized frames (configured replay)."""
    from zmqrl.bookkeeping import make_replay_from

    cfg = _load_config(c.settings)
    replay = make_replay_from(cfg)
    batch = transition_pool(cfg, 256)
    replay.add(batch)
    raw = sum(a[0].nbytes for a in batch.values())
    per_slot = replay.nbytes / replay.capacity
    tree = getattr(replay, "tree", None)
    tree_bytes = tree.nbytes / replay.capacity if tree is not None else 0.0
    kind = "prioritized" if tree is not None else "uniform"
    rows = [make_row("replay_bytes_cartpole", per_slot, raw, "bytes/transition",
                     f"{kind} replay of {cfg.replay.capacity} (config): {per_slot - tree_bytes:.1f} B of items + "
                     f"{tree_bytes:.1f} B of priorities per slot vs {raw} B raw payload", ("<=", 1.1))]

    _register_noise_frames()
    capacity, stack = 2000, 4
    frames_cfg = _load_config(c.settings, f"env.id={NOISE_FRAMES_ID}", "env.wrappers=[frame_stack]",
                              f"env.frame_stack={stack}", "env.num_envs=8", f"replay.capacity={capacity}")
    image_replay = make_replay_from(frames_cfg)
    stream = transition_pool(frames_cfg, capacity + capacity // 2)  # the ring wraps: frames are freed too
    for i in range(0, len(stream["reward"]), 64):
        image_replay.add({k: v[i:i + 64] for k, v in stream.items()})
    per_slot = image_replay.nbytes / len(image_replay)
    stacks = stream["obs"][0].nbytes + stream["next_obs"][0].nbytes
    pooled = "each distinct frame stored once" if image_replay.frame_keys else "obs and next_obs stored as given"
    rows.append(make_row("replay_bytes_frames", per_slot, stacks, "bytes/transition",
                         f"{stack}x84x84 uint8 stacks of 8 envs (FrameStackObservation over noise frames, "
                         f"{frames_cfg.agent.n_step}-step), {kind} replay of {capacity} after "
                         f"{len(stream['reward'])} adds: {pooled}; baseline = obs + next_obs stacks",
                         ("<=", 0.35)))
    return rows


# ------------------------------------------------------------------------------------- actor


def _await_subscriber(pub: zmq.Socket, timeout_s: float) -> None:
    """Block until an XPUB socket sees a subscription (the subscriber is connected)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pub.poll(100, zmq.POLLIN):
            event = pub.recv()
            if event and event[0] == 1:
                return
    raise BenchError(f"no subscriber connected within {timeout_s:.0f}s")


def _bare_loop(actor: Any, seconds: float) -> float:
    """Env steps/s of the actor's own acting loop (vector env, policy, n-step builder): no sockets, no batching."""
    loop = actor.loop
    n, start = 0, time.perf_counter()
    deadline = start + seconds
    while True:
        loop.step()
        n += loop.num_envs
        if n % 256 == 0 and time.perf_counter() >= deadline:
            return n / (time.perf_counter() - start)


def bench_actor(c: Context) -> list[Row]:
    """The real :class:`~zmqrl.roles.actor.Actor` (PUSH to a sink process, models arriving) vs a bare loop.

    Models come from another process, as from a learner: a publisher thread in this process
    would take the interpreter lock from the actor, which a real learner never does.
    """
    import torch

    from zmqrl.acting import make_task
    from zmqrl.lifecycle import StopFlag
    from zmqrl.roles.actor import Actor

    s = c.settings
    torch.set_num_threads(1)
    cfg = _load_config(s, "actor.nice=0")
    params_path = c.path("actor-model.npz")
    with open(params_path, "wb") as fh:  # what a learner publishes: torch state_dict arrays
        cast(Any, np.savez)(fh, **make_task(cfg).agent().params())
    sink_addr, model_addr = _free_addr(), _free_addr()
    out = c.path("actor-sink.json")
    bare: list[float] = []
    real: list[float] = []
    with Procs(c.logs) as procs:
        sink = procs.child("actor-sink", "sink", {"bind": sink_addr, "out": str(out), "timeout_s": 600})
        models = procs.child("actor-models", "models", {"bind": model_addr, "params": str(params_path),
                                                        "interval_s": 0.1, "timeout_s": 60,
                                                        "out": str(c.path("actor-models.json"))})
        actor = Actor(cfg, 0, sink_addr, model_addr)
        stop = StopFlag()
        try:
            for _ in range(s.actor_reps):
                bare.append(_bare_loop(actor, s.actor_s))
                if not actor.sub.poll(60_000, zmq.POLLIN):  # a model is queued: run() finds it at once
                    raise models.failure("no model reached the actor within 60 s")
                steps0 = actor.stats.env_steps
                target = steps0 + max(256, int(bare[-1] * s.actor_s))
                start = time.perf_counter()
                actor.run(stop, max_env_steps=target)
                elapsed = time.perf_counter() - start
                real.append((actor.stats.env_steps - steps0) / elapsed)
        finally:
            actor.close()
        sent = actor.stats.batches
        sink.stop()
        got = (read_json(out) or {}).get("batches", 0)
    measured, baseline = _median(real), _median(bare)
    pairs = [r / b for r, b in zip(real, bare, strict=True)]  # each real window right after its bare one
    c.measured["actor_rate"] = measured
    note = (f"Actor.run ({type(actor.policy).__name__}): PUSH to a sink process, a new model every 0.1 s from "
            f"another process, priorities computed (compute_priorities={cfg.actor.compute_priorities}), "
            f"{cfg.env.num_envs} envs, n_buffer {cfg.actor.n_buffer}, {actor.stats.model_updates} models applied; "
            f"baseline: same envs + policy.act + NStepBuilder, no sockets; sink got {got}/{sent} batches; "
            f"{s.actor_reps} alternations of {s.actor_s:g} s, ratio = median of each pair's ratio "
            f"({', '.join(f'{r:.2f}' for r in pairs)}), figures = medians")
    return [make_row("actor_env_steps", measured, baseline, "env steps/s", note, (">=", 0.9), ratio=_median(pairs))]


# ------------------------------------------------------------------------------------- transport


def _transport_once(c: Context, procs: Procs, kind: str, n: int, send_to: str, recv_at: str, tag: str) -> float:
    timeout = 60.0 + n * (0.02 if kind == "atari" else 0.002)
    out_r, out_s = c.path(f"recv-{tag}.json"), c.path(f"send-{tag}.json")
    recv = procs.child(f"recv-{tag}", "recv", {"bind": recv_at, "n": n, "out": str(out_r), "timeout_s": timeout})
    send = procs.child(f"send-{tag}", "send", {"connect": send_to, "payload": kind, "n": n, "out": str(out_s),
                                               "timeout_s": timeout})
    result = _child_result(recv, out_r, timeout + 15)
    send.wait(15.0)
    if result["count"] < n or result["last"] <= result["first"]:
        raise recv.failure(f"received {result['count']}/{n} messages")
    return float((result["count"] - 1) / (result["last"] - result["first"]))


def bench_transport(c: Context) -> list[Row]:
    """Batches/s from a sender process to a receiver process, directly and through a real proxy process.

    Each kind also goes through a relay inside libzmq (no Python, no checks): the ceiling of any
    proxy hop here, reported as its own row, so the table shows how much of the gap is the hop itself.
    """
    s = c.settings
    proxy_addr, relay_addr, recv_addr = _free_addr(), _free_addr(), _free_addr()
    rows = []
    with Procs(c.logs) as procs:
        proxy = procs.start("transport-proxy", _zmqrl_argv("proxy", str(s.config), "--bind", proxy_addr,
                                                           "--learner", recv_addr, "--set", "run.log_level=warning"))
        relay = procs.child("transport-relay", "relay", {"bind": relay_addr, "connect": recv_addr})
        for kind, n in (("cartpole", s.small_messages), ("atari", s.large_messages)):
            direct: list[float] = []
            proxied: list[float] = []
            relayed: list[float] = []
            for rep in range(s.reps):
                direct.append(_transport_once(c, procs, kind, n, recv_addr, recv_addr, f"{kind}-direct-{rep}"))
                for via, addr, rates in ((proxy, proxy_addr, proxied), (relay, relay_addr, relayed)):
                    if not via.alive():
                        raise via.failure(f"{via.name} exited")
                    rates.append(_transport_once(c, procs, kind, n, addr, recv_addr, f"{kind}-{via.name}-{rep}"))
            arrays = payload(kind)
            size = sum(a.nbytes for a in arrays.values())
            per = len(arrays["reward"])
            measured, baseline, ceiling = _median(proxied), _median(direct), _median(relayed)
            rows.append(make_row(
                f"transport_{kind}_{per}", measured, baseline, "batches/s",
                f"{n} messages of {per} transitions ({size / 2**20:.2f} MB); proxied {measured * per:,.0f} vs direct "
                f"{baseline * per:,.0f} transitions/s; sender, proxy, receiver are separate processes; "
                f"median of {s.reps}; the libzmq relay reached {ceiling / baseline:.2f} of direct "
                f"(next row)", (">=", 0.8)))
            rows.append(make_row(
                f"transport_{kind}_{per}_ceiling", ceiling, baseline, "batches/s",
                f"the same messages through a relay inside libzmq (zmq.proxy_steerable: no Python, no checks) "
                f"vs direct: the most any proxy hop reaches with 3 processes on {os.cpu_count()} CPUs"))
    return rows


# ------------------------------------------------------------------------------------- learner


def _learner_window(c: Context, cfg: Any, pool: dict[str, np.ndarray], pool_path: Path, feeders: int,
                    rate: float, tag: str) -> dict[str, float]:
    """Opt steps/s (and transitions/s ingested) of an in-process Learner over one measurement window."""
    from zmqrl.lifecycle import StopFlag
    from zmqrl.roles.learner import Learner

    s = c.settings
    cfg = copy.deepcopy(cfg)
    with contextlib.redirect_stderr(io.StringIO()):  # the progress view binds stderr here: keep it quiet
        learner = Learner(cfg, c.path(f"learner-{tag}"), _free_addr(), _free_addr(), _free_addr())
        learner.agent_ready(block=True)  # (built in the background): measure training, not its startup
    learner.replay.add({k: pool[k] for k in TRANSITION_KEYS}, priorities=pool["priority"])
    stop = StopFlag()
    window: dict[str, float] = {}
    abort = threading.Event()

    def clock() -> None:
        if abort.wait(s.settle_s):
            return
        t0, o0, i0 = time.perf_counter(), learner.book.opt_steps, learner.inserted
        if abort.wait(s.learner_s):
            return
        t1, o1, i1 = time.perf_counter(), learner.book.opt_steps, learner.inserted
        window.update(opt_s=(o1 - o0) / (t1 - t0), ingest_s=(i1 - i0) / (t1 - t0))
        stop.set = True

    with Procs(c.logs) as procs:
        for i in range(feeders):
            procs.child(f"feed-{tag}-{i}", "feed", {
                "connect": learner.endpoints["data"], "pool": str(pool_path), "rate": rate,
                "n_buffer": cfg.actor.n_buffer, "sndhwm": cfg.actor.send_hwm, "index": i,
                "model_inc": learner.incarnation, "out": str(c.path(f"feed-{tag}-{i}.json")),
                "timeout_s": s.settle_s + s.learner_s + 120})
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
    window["rejected"] = float(learner.rejected_total())
    return window


def bench_learner(c: Context) -> list[Row]:
    """Opt steps/s of the real Learner loop, replay prefilled, idle vs ingesting 4 actors' worth of batches."""
    import torch

    s = c.settings
    torch.set_num_threads(1)
    cfg = _load_config(s, "trainer.stop_return=null", "trainer.max_opts=100000000", "run.log_level=warning")
    prefill = min(20_000, cfg.replay.capacity)
    pool = transition_pool(cfg, prefill, seed=1)
    pool["priority"] = np.random.default_rng(1).uniform(0.01, 2.0, prefill).astype(np.float32)
    pool_path = c.path("learner-pool.npz")
    with open(pool_path, "wb") as fh:
        cast(Any, np.savez)(fh, **pool)
    rate = s.actor_rate or DEFAULT_ACTOR_RATE
    source = "--actor-rate" if s.actor_rate else "default; --actor-rate to change"
    idle: list[float] = []
    busy: list[float] = []
    ingest: list[float] = []
    rejected = 0.0
    for rep in range(s.reps):
        idle.append(_learner_window(c, cfg, pool, pool_path, 0, rate, f"idle-{rep}")["opt_s"])
        w = _learner_window(c, cfg, pool, pool_path, 4, rate, f"ingest-{rep}")
        busy.append(w["opt_s"])
        ingest.append(w["ingest_s"])
        rejected += w["rejected"]
    note = (f"in-process Learner.run, {'prioritized' if cfg.replay.prioritized else 'uniform'} replay prefilled "
            f"with {prefill}; 4 feeder processes PUSH {cfg.actor.n_buffer}-transition batches at "
            f"{rate:,.0f}/s each ({source}); ingested {_median(ingest):,.0f} transitions/s; "
            f"{rejected:.0f} rejected; median of {s.reps}")
    return [make_row("learner_opt_steps", _median(busy), _median(idle), "opt steps/s", note, (">=", 0.9))]


# ------------------------------------------------------------------------------------- model broadcast


def _hidden_for(nbytes: int) -> int:
    """Width of a two-layer MLP whose float32 parameters take about ``nbytes``."""
    return int(round(math.sqrt(nbytes / 4)))


def bench_broadcast(c: Context) -> list[Row]:
    """Publish (params + encode + send) -> applied with load_params in a subscriber process: median and p90."""
    import torch

    from zmqrl.acting import make_task
    from zmqrl.wire import encode_model

    s = c.settings
    torch.set_num_threads(1)
    cfg = _load_config(s)
    sizes = (("broadcast_1mb", 2**20, 5.0, s.publish_gap_s), ("broadcast_10mb", 10 * 2**20, 25.0, 2 * s.publish_gap_s))
    hidden = [_hidden_for(nbytes) for _, nbytes, _, _ in sizes]
    policies = [make_task(_load_config(s, f"agent.hidden=[{h}, {h}]")).agent() for h in hidden]
    backend = type(make_task(cfg).policy(0, backend=cfg.actor.backend)).__name__
    n = s.publishes
    addr, out = _free_addr(), c.path("modelsub.json")
    with Procs(c.logs) as procs:
        sub = procs.child("modelsub", "modelsub", {"connect": addr, "config": str(s.config), "hidden": hidden,
                                                   "last_version": 2 * n - 1, "out": str(out),
                                                   "timeout_s": 120 + n * 4 * s.publish_gap_s})
        zctx = zmq.Context(io_threads=1)
        pub = make_socket(zctx, zmq.XPUB, SocketOptions.pub(), bind=addr)
        inc = new_incarnation()
        try:
            _await_subscriber(pub, 90.0)
            version = 0
            for (_, _, _, gap), h, policy in zip(sizes, hidden, policies, strict=True):
                for _ in range(n):
                    t = time.time()
                    frames = encode_model("learner", inc, version, policy.params(), meta={"t": t, "hidden": h})
                    send_frames(pub, frames)
                    version += 1
                    time.sleep(gap)
            result = _child_result(sub, out, 30.0)
        finally:
            pub.close(linger=0)
            zctx.term()
    rows = []
    for (name, _, goal_ms, _), h, policy in zip(sizes, hidden, policies, strict=True):
        ms = [e["ms"] for e in result["latencies"] if e["hidden"] == h]
        mb = sum(a.nbytes for a in policy.params().values()) / 2**20
        if not ms:
            raise BenchError(f"{name}: the subscriber applied none of {n} models")
        median, p90 = _median(ms), float(np.percentile(ms, 90))
        rows.append(make_row(name, median, goal_ms, "ms (median)",
                             f"p90 {p90:.2f} ms; {mb:.2f} MB MLP [{h}, {h}]; applied {len(ms)}/{n}; learner-side "
                             f"params+encode+send -> CONFLATE SUB -> {backend} load_params in another process; "
                             "baseline = goal, ratio = goal/median", (">=", 1.0), ratio=goal_ms / median))
    return rows


# ------------------------------------------------------------------------------------- launches


def _wait_launcher(proc: Proc, timeout_s: float) -> int:
    code = proc.wait(timeout_s)
    if code is None:
        code = proc.stop(15.0)
    return -9 if code is None else code


def _startup_once(c: Context, k: int) -> float:
    """Seconds from launching ``zmqrl local`` to the first transition in the learner's replay.

    The learner writes ``RUN_DIR/first_batch.json`` (an atomic rename) right after it inserts its
    first batch, so that file's appearance, polled from here every 5 ms, marks the first
    transition in replay. The run uses the config as it is (no overrides but the seed).
    """
    from zmqrl.roles.learner import FIRST_BATCH_FILE

    s = c.settings
    run_dir = c.path(f"startup-{k}")
    marker = run_dir / FIRST_BATCH_FILE
    argv = _zmqrl_argv("local", str(s.config), "--actors", "2", "--run-dir", str(run_dir), "--set", "run.seed=0")
    with Procs(c.logs) as procs:
        procs.sweep_args.append(str(run_dir))
        start = time.monotonic()
        proc = procs.start(f"startup-{k}", argv)
        while time.monotonic() - start < 120.0:
            if marker.exists():
                return time.monotonic() - start
            if not proc.alive():
                raise proc.failure("zmqrl local exited before the first transition")
            time.sleep(0.005)
        raise proc.failure("no transition reached replay within 120s")


def bench_startup(c: Context) -> list[Row]:
    s = c.settings
    times = [_startup_once(c, k) for k in range(s.startup_reps)]
    measured = _median(times)
    note = (f"launch of `zmqrl local CONFIG --actors 2` (learner, proxy, 2 actors, evaluator) -> first batch in "
            f"replay (the learner's first_batch.json appears); runs: "
            f"{', '.join(f'{t:.2f}' for t in times)} s; baseline = goal, ratio = goal/median")
    return [make_row("startup_s", measured, 3.0, "s", note, (">=", 1.0), ratio=3.0 / measured)]


def _local_env_rate(c: Context, actors: int) -> tuple[float, str]:
    """Total env steps/s of ``zmqrl local --actors N`` between two learner summaries once training runs."""
    s = c.settings
    run_dir = c.path(f"scaling-{actors}")
    summary_path = run_dir / "summary.json"
    argv = _zmqrl_argv("local", str(s.config), "--actors", str(actors), "--no-evaluator", "--run-dir", str(run_dir),
                       "--set", "run.seed=0", "--set", "trainer.stop_return=null",
                       "--set", "trainer.min_samples_per_insert=0",
                       "--set", f"trainer.max_seconds={60 + 2 * s.scaling_window_s:g}")
    first: dict[str, Any] | None = None
    with Procs(c.logs) as procs:
        procs.sweep_args.append(str(run_dir))
        proc = procs.start(f"scaling-{actors}", argv)
        deadline = time.monotonic() + 60.0 + s.scaling_window_s
        while time.monotonic() < deadline:
            summary = read_json(summary_path)
            if summary and summary.get("opt_steps", 0) > 0:
                if first is None:
                    first = summary
                elif summary["wall_s"] > first["wall_s"] and summary["wall_s"] >= first["wall_s"] + s.scaling_window_s:
                    proc.stop(15.0)
                    rate = (summary["env_steps"] - first["env_steps"]) / (summary["wall_s"] - first["wall_s"])
                    return rate, _window_detail(first, summary)
            if not proc.alive():
                raise proc.failure("zmqrl local exited early")
            time.sleep(0.2)
        raise proc.failure("no two learner summaries with training under way before the deadline")


def _window_detail(first: dict[str, Any], last: dict[str, Any]) -> str:
    """The window's length and each actor's env steps/s in it (from the learner's per-actor counters)."""
    span = last["wall_s"] - first["wall_s"]
    before = first.get("actors", {})
    per = {name: round((a.get("env_steps", 0) - before.get(name, {}).get("env_steps", 0)) / span)
           for name, a in sorted(last.get("actors", {}).items())}
    return f"{span:.1f}s window of learner summaries; per actor {per}"


def bench_scaling(c: Context) -> list[Row]:
    s = c.settings
    results = {n: _local_env_rate(c, n) for n in s.scaling}
    base_n = s.scaling[0]
    base = results[base_n][0]
    rows = []
    for n, (rate, detail) in results.items():
        rows.append(make_row(f"scaling_{n}_actors", rate, base, "env steps/s",
                             f"`zmqrl local --actors {n} --no-evaluator`, rate limiter off (min_samples_per_insert=0), "
                             f"learner training on the same {os.cpu_count()} CPUs; vs {base_n} actor; {detail}"))
    return rows


# ------------------------------------------------------------------------------------- solve

_SB3_SCRIPT = r'''
import json, sys, time
start = time.monotonic()
import torch
torch.set_num_threads(1)
import gymnasium as gym
from stable_baselines3 import DQN
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.evaluation import evaluate_policy

seed, target, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
evals = []


class StopAtReturn(BaseCallback):
    """Greedy evaluation of 10 episodes every 1000 steps; stop at the first mean >= target."""

    def __init__(self):
        super().__init__()
        self.eval_env = gym.make("CartPole-v1")
        self.eval_env.reset(seed=seed + 1_000_000)

    def _on_step(self):
        if self.num_timesteps % 1000:
            return True
        mean, _ = evaluate_policy(self.model, self.eval_env, n_eval_episodes=10, deterministic=True)
        evals.append({"env_steps": self.num_timesteps, "return_mean": float(mean),
                      "wall_s": round(time.monotonic() - start, 2)})
        return mean < target


model = DQN("MlpPolicy", gym.make("CartPole-v1"), learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
            learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
            exploration_fraction=0.16, exploration_final_eps=0.04, policy_kwargs={"net_arch": [256, 256]},
            seed=seed, device="cpu", verbose=0)
model.learn(total_timesteps=50_000, callback=StopAtReturn())
solved = next((e for e in evals if e["return_mean"] >= target), None)
with open(out, "w") as fh:
    json.dump({"solved": solved, "evals": evals, "wall_s": time.monotonic() - start}, fh)
'''


@dataclass
class SolveRun:
    """One training run to the stop return: wall time from launch to exit and what it reported."""

    kind: str
    seed: int
    wall_s: float
    solved: dict[str, Any] | None
    cap_s: float | None = None


def _solve_once(c: Context, kind: str, seed: int, cap_s: float) -> SolveRun:
    """``zmqrl local --actors 2`` or ``zmqrl train`` with ``trainer.max_seconds`` as the cap, timed launch->exit."""
    s = c.settings
    run_dir = c.path(f"solve-{kind}-{seed}")
    common = [str(s.config), "--run-dir", str(run_dir), "--set", f"run.seed={seed}",
              "--set", f"trainer.stop_return={SOLVE_RETURN}", "--set", f"trainer.max_seconds={max(1.0, cap_s - 4):.0f}"]
    argv = _zmqrl_argv("local", *common, "--actors", "2") if kind == "local" else _zmqrl_argv("train", *common)
    with Procs(c.logs) as procs:
        procs.sweep_args.append(str(run_dir))
        start = time.monotonic()
        proc = procs.start(f"solve-{kind}-{seed}", argv)
        code = _wait_launcher(proc, cap_s + 60.0)
        wall = time.monotonic() - start
    summary = read_json(run_dir / "summary.json")
    if summary is None:
        raise proc.failure(f"zmqrl {kind} exited with code {code} and no summary.json")
    return SolveRun(kind, seed, wall, summary.get("solved"), cap_s)


def _sb3_interpreter(s: Settings) -> str | None:
    """The interpreter that has stable_baselines3 (``--sb3-python`` or this one), or None."""
    python = s.sb3_python or sys.executable
    try:
        done = subprocess.run([python, "-c", "import stable_baselines3"], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=120, env=_child_env(), start_new_session=True)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return python if done.returncode == 0 else None


def _sb3_once(c: Context, python: str, seed: int) -> SolveRun:
    out = c.path(f"sb3-{seed}.json")
    with Procs(c.logs) as procs:
        start = time.monotonic()
        proc = procs.start(f"sb3-{seed}", [python, "-c", _SB3_SCRIPT, str(seed), str(SOLVE_RETURN), str(out)])
        code = _wait_launcher(proc, 900.0)
        wall = time.monotonic() - start
    result = read_json(out)
    if code != 0 or result is None:
        raise proc.failure("the Stable-Baselines3 run failed")
    return SolveRun("sb3", seed, wall, result.get("solved"))


def _describe(runs: list[SolveRun]) -> str:
    solved = [r for r in runs if r.solved]
    text = f"solved {len(solved)}/{len(runs)}"
    if solved:
        text += f" (median {_median([r.solved['env_steps'] for r in solved if r.solved]):,.0f} env steps)"
    return text + "; per seed " + ", ".join(f"{r.seed}: {r.wall_s:.1f} s" for r in runs)


def bench_solve(c: Context) -> list[Row]:
    """Wall time from launch to exit at the first greedy evaluation >= 475, median over seeds.

    The capped runs share ``solve_budget_s``: each gets the budget left divided by the runs left,
    so a fast run leaves more to the next. A run that hits its cap counts at its wall time (a lower
    bound); the note says how many did.
    """
    s = c.settings
    plan = [(kind, seed) for seed in range(s.seeds) for kind in ("local", "train")]
    budget_end = time.monotonic() + s.solve_budget_s
    runs: dict[str, list[SolveRun]] = {"local": [], "train": []}
    for i, (kind, seed) in enumerate(plan):
        cap = max(6.0, (budget_end - time.monotonic()) / (len(plan) - i))
        runs[kind].append(_solve_once(c, kind, seed, cap))
    local, train = runs["local"], runs["train"]
    local_s = _median([r.wall_s for r in local])
    caps = sorted({round(r.cap_s or 0) for r in local + train})
    note = (f"launch -> exit, median of seeds 0..{s.seeds - 1}; local {_describe(local)}, train "
            f"{_describe(train)}; unsolved runs count at their capped wall time (caps {caps} s of a "
            f"{s.solve_budget_s:.0f} s budget)")
    rows = [make_row("solve_local_vs_train", local_s, _median([r.wall_s for r in train]), "s", note, None)]
    if s.sb3:
        python = _sb3_interpreter(s)
        if python is None:
            rows.append(skipped_row("solve_local_vs_sb3", "s", "stable-baselines3 not installed", ("<=", 0.5)))
        else:
            sb3 = [_sb3_once(c, python, seed) for seed in range(s.seeds)]
            sb3_note = (f"SB3 DQN, rl-zoo CartPole-v1 hyperparameters, greedy eval of 10 episodes every 1000 steps, "
                        f"stop at >= {SOLVE_RETURN:g}: {_describe(sb3)} (unsolved: full 50k steps); local "
                        f"{_describe(local)}")
            row = make_row("solve_local_vs_sb3", local_s, _median([r.wall_s for r in sb3]), "s", sb3_note,
                           ("<=", 0.5))
            if row.met and not all(r.solved for r in local):
                row.met = False
            rows.append(row)
    return rows


# ------------------------------------------------------------------------------------- the suite

BENCHES: dict[str, Callable[[Context], list[Row]]] = {
    "replay": bench_replay, "actor": bench_actor, "transport": bench_transport, "learner": bench_learner,
    "broadcast": bench_broadcast, "startup": bench_startup, "scaling": bench_scaling, "solve": bench_solve,
}


def run_suite(settings: Settings, only: Sequence[str] | None = None,
              progress: Callable[[str], None] | None = None) -> list[Row]:
    """Run the chosen groups (all by default) in a fresh work directory; returns their rows.

    A group that fails yields one row with ``met`` False and the error in its note, and the suite
    goes on; the work directory (logs of every process) is then kept and named in that note.
    """
    import torch

    torch.set_num_threads(1)
    groups = list(only) if only else list(GROUPS)
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        raise ValueError(f"unknown bench name(s) {', '.join(unknown)}; choose from {', '.join(GROUPS)}")
    if settings.keep is not None:
        settings.keep.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="bench-", dir=settings.keep))
    else:
        work = Path(tempfile.mkdtemp(prefix="zmqrl-bench-"))
    ctx = Context(settings, work)
    rows: list[Row] = []
    failed = False
    try:
        for group in GROUPS:
            if group not in groups:
                continue
            if progress:
                progress(f"bench: {group} ...")
            started = time.monotonic()
            try:
                new = BENCHES[group](ctx)
            except Exception as exc:  # one broken measurement must not hide the others
                failed = True
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                new = [Row(group, None, None, None, None, False, "",
                           f"error: {type(exc).__name__}: {first} (logs kept in {work})")]
                log.warning("bench %s failed", group, exc_info=True)
            rows.extend(new)
            if progress:
                progress(f"bench: {group} done in {time.monotonic() - started:.1f}s")
    finally:
        if not failed and settings.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return rows


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1e4:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def format_table(rows: Sequence[Row]) -> str:
    """The rows as a fixed-width table, notes last."""
    header = f"{'name':<26}{'measured':>12}{'baseline':>12}{'ratio':>8}  {'goal':<8}{'met':<6}{'unit':<18}note"
    lines = [header, "-" * len(header)]
    for r in rows:
        met = "-" if r.met is None else "yes" if r.met else "NO"
        lines.append(f"{r.name:<26}{_fmt(r.measured):>12}{_fmt(r.baseline):>12}{_fmt(r.ratio):>8}  "
                     f"{r.goal or '-':<8}{met:<6}{r.unit:<18}{r.note}")
    return "\n".join(lines)


def cmd_bench(args: argparse.Namespace) -> int:
    """The ``zmqrl bench`` entry point: run, print the table, write ``--json``; 1 if a measurement failed."""
    from zmqrl.record import setup_logging

    setup_logging("warning", "bench")
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    only = [name.strip() for item in args.only for name in item.split(",") if name.strip()] if args.only else None
    if only:
        unknown = sorted(set(only) - set(GROUPS))
        if unknown:
            print(f"zmqrl bench: unknown name(s) {', '.join(unknown)}; choose from {', '.join(GROUPS)}",
                  file=sys.stderr)
            return 2
    config_path = Path(args.config)
    if not config_path.is_file():
        print(f"zmqrl bench: no config file {config_path} (pass --config)", file=sys.stderr)
        return 2
    settings = Settings.preset(mode, seeds=args.seeds, sb3=args.sb3 or None, sb3_python=args.sb3_python,
                               solve_budget_s=args.solve_budget, actor_rate=args.actor_rate,
                               config=config_path.resolve(), keep=Path(args.keep) if args.keep else None)
    started = time.monotonic()
    rows = run_suite(settings, only, progress=lambda text: print(text, file=sys.stderr, flush=True))
    print(format_table(rows))
    print(f"({mode} run, {time.monotonic() - started:.0f}s, {os.cpu_count()} CPUs)")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_json(path, [r.as_dict() for r in rows])
    return 1 if any(r.note.startswith("error:") for r in rows) else 0


def register(sub: argparse._SubParsersAction, handlers: dict[str, Callable[[argparse.Namespace], int]]) -> None:
    """Add the ``bench`` subcommand to a ``zmqrl`` parser's subparsers and its handler to ``handlers``."""
    p = sub.add_parser("bench", help="measure the performance goals side by side with their baselines",
                       description="Measure each performance goal next to its baseline in one run and print a table "
                                   f"(name, measured, baseline, ratio, goal, met). Names: {', '.join(GROUPS)}.")
    p.add_argument("--only", action="append", metavar="NAME[,NAME...]", help="run only these groups (repeatable)")
    p.add_argument("--json", metavar="FILE", help="also write the rows as a JSON list to FILE")
    p.add_argument("--quick", action="store_true", help="shorter measurements, one seed (~2 minutes)")
    p.add_argument("--smoke", action="store_true", help="a plumbing check in about a minute; figures not meaningful")
    p.add_argument("--seeds", type=int, metavar="N", help="seeds for the solve rows (default 3; --quick 1)")
    p.add_argument("--solve-budget", type=float, metavar="S",
                   help="seconds shared by all capped zmqrl solve runs (default 330; --quick 60)")
    p.add_argument("--actor-rate", type=float, metavar="T",
                   help=f"learner row: transitions/s per simulated actor (default {DEFAULT_ACTOR_RATE:g})")
    p.add_argument("--sb3", action="store_true", help="also time Stable-Baselines3 DQN on CartPole (solve group)")
    p.add_argument("--sb3-python", metavar="PATH", default="",
                   help="interpreter with stable-baselines3 installed (default: this one)")
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="the CartPole DQN config (default: %(default)s)")
    p.add_argument("--keep", metavar="DIR", help="keep every run directory and process log under DIR")
    handlers["bench"] = cmd_bench


def main(argv: list[str] | None = None) -> int:
    """``python -m zmqrl.bench [options]``: the same as ``zmqrl bench``."""
    parser = argparse.ArgumentParser(prog="zmqrl")
    sub = parser.add_subparsers(dest="command", required=True)
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {}
    register(sub, handlers)
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    return handlers["bench"](args)


if __name__ == "__main__":
    sys.exit(main())
