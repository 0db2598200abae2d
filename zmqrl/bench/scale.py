"""Scale group: the real learner, relays and proxies against many simulated hosts and actors.

One run per actor count N (8, 64, 256, 1,024 over H = 1, 4, 16, 64 hosts of K = 8, 16, 16, 16
actors): a ``zmqrl learner`` process; per simulated host a ``zmqrl proxy --relay`` process bound on
its own loopback address (127.0.0.X) and a process of K simulated actors
(:func:`~zmqrl.bench.scale_hosts.sim_host`), which send recorded real batches through their host's
proxy and take models and control from their host's relay; a probe on the learner's own XPUB
(:class:`~zmqrl.bench.scale_hosts.Probe`). Every N offers the same total load. A run, in order:

1. **steady** — every actor offers ``rate_low / N`` transitions/s. The learner trains with
   ``trainer.max_samples_per_insert`` (it waits for data there) above ``min_samples_per_insert``, so
   it is not saturated and no pause comes; over one window: the learner's intake, the bytes that
   left its XPUB and snapshot ports (``ss``: TCP bytes acknowledged per connection) per model version,
   its memory, and each version's reach (from the probe seeing it to 99% of actors holding it);
2. **joiners** — a further process of simulated actors joins host 0's relay late: each one's wait
   for its first model, and the snapshot bytes the learner sent meanwhile;
3. **flood** — every actor offers ``rate_high / N``: inserts outrun the learner's samples, its rate
   limiter pauses the actors (``min_samples_per_insert``); the reach of its first pause that lasts,
   from the probe seeing it to 99% of actors paused, and over the flood's window the fairness of
   what the learner accepted from each actor (Jain's index, its own per-actor counts).

Beside those: one host of K = 64 actors with the relay off (actors subscribe to the learner, the
proxy has no ``--relay``) and on, the proxy's CPU per 1,000 transitions forwarded; and a learner
with a small ``net.max_peers`` and ``net.peer_idle_s`` fed by one generation of actor names, then
another: whether the state of peers that have gone is freed for newcomers.

``zmqrl bench --only scale --keep DIR`` keeps ``scale.json`` (every figure) and ``scale.png`` (each
row against N); ``python -m zmqrl.bench.scale scale.json scale.png`` draws the figure again.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from zmqrl.bench.fanin import RunBench
from zmqrl.bench.feeders import save_messages
from zmqrl.bench.harness import (
    BenchError,
    Context,
    Proc,
    Procs,
    Row,
    free_addr,
    load_config,
    make_row,
    zmqrl_argv,
)
from zmqrl.bench.procfs import cpu_seconds, open_sockets, rss_bytes
from zmqrl.bench.scale_hosts import Probe, sim_host
from zmqrl.roles.addresses import free_port
from zmqrl.roles.launch.processes import stop_roles
from zmqrl.run.rundir import read_json

log = logging.getLogger("zmqrl")

CONFIG = "cartpole_dqn.yaml"
PONG_CONFIG = "pong_dqn.yaml"
SHAPES = {8: (1, 8), 64: (4, 16), 256: (16, 16), 1024: (64, 16)}  # N -> (hosts, actors per host)
REACH = 99.0  # a version or a pause has reached the actors when this percentile of them holds it
LONG_PAUSE_S = 0.3  # pauses shorter than this (as the probe saw them) are not judged: conflated, an actor may
#                     see the next control first
NICE = 10  # simulated hosts and proxies yield the CPU to the learner, which has its own machine in a real run
RELAY_K = 64  # the relay CPU rows: actors on the one host
BYTES_SLACK = 1.01  # bytes per version may exceed (H + 1) models by ZMTP's framing and heartbeats, not by a model
PEER_GEN = 16  # the freed-state sub-run: actors per generation, and the learner's net.max_peers


@dataclass(frozen=True)
class Load:
    """One config's setting: what the learner trains, what the simulated actors send, and how fast."""

    config: str
    n_buffer: int  # transitions per batch a simulated actor sends
    rate_low: float  # total transitions/s offered in the steady window (every N)
    rate_high: float  # ... in the flood
    min_spi: float  # trainer.min_samples_per_insert: actors pause below it
    max_spi: float  # trainer.max_samples_per_insert: the learner waits for data above it
    transitions: int  # recorded real transitions the batches are cut from
    extra: tuple[str, ...] = ()

    def overrides(self) -> list[str]:
        return ["run.seed=0", "run.device=cpu", "run.log_level=warning", "trainer.stop_return=null",
                "trainer.max_opts=100000000", "trainer.save_interval=0", f"actor.n_buffer={self.n_buffer}",
                f"trainer.min_samples_per_insert={self.min_spi:g}",
                f"trainer.max_samples_per_insert={self.max_spi:g}", "net.stats_interval_s=1",
                "net.max_peers=4096", *self.extra]


CARTPOLE = Load(CONFIG, n_buffer=16, rate_low=2000.0, rate_high=20000.0, min_spi=3.0, max_spi=4.0,
                transitions=4096)
PONG = Load(PONG_CONFIG, n_buffer=32, rate_low=80.0, rate_high=800.0, min_spi=3.0, max_spi=4.0, transitions=1024,
            extra=("trainer.sync_interval=10", "trainer.warmup=256", "replay.capacity=20000",
                   "trainer.latest_interval_s=0", "env.backend=gymnasium"))


@dataclass(frozen=True)
class Plan:
    """Actor counts and windows of one bench mode."""

    cartpole: tuple[int, ...]
    pong: tuple[int, ...]
    steady_s: float
    fair_s: float
    joiners: int
    extras: bool  # the relay CPU rows and the freed-state sub-run


PLANS = {"full": Plan((8, 64, 256, 1024), (8, 64), 8.0, 6.0, 16, True),
         "quick": Plan((8, 64, 256), (8,), 5.0, 4.0, 8, True),
         "smoke": Plan((8,), (), 2.0, 2.0, 4, False)}


# ------------------------------------------------------------------------------------- one run


@dataclass
class ScaleRun:
    """What one learner run with N simulated actors gave (figures as measured; rows are made from them)."""

    config: str
    n: int
    hosts: int
    per_host: int
    relay: bool
    n_buffer: int = 0
    model_bytes: int = 0  # one model message as the learner sends it
    versions: int = 0  # model versions the probe saw published in the steady window
    steady_s: float = 0.0  # the window, by the learner's summaries
    intake: float = 0.0  # transitions/s the learner took in over it
    offered: float = 0.0
    wire_bytes: int = 0  # bytes that left the learner's XPUB and snapshot ports over it (TCP, acknowledged)
    wire_connections: int = 0  # connections on those ports at its end
    publisher: dict[str, float] = field(default_factory=dict)  # the publisher's own counters over it
    opt_steps_s: float = 0.0
    rss: int = 0  # learner VmRSS at its end
    sockets: int = 0
    version_reach: list[float] = field(default_factory=list)  # per version, seconds to REACH % of actors
    version_missed: int = 0  # (actor, version) pairs never reached
    joiner_waits: list[float] = field(default_factory=list)
    joiner_snapshot_bytes: int = -1  # snapshot bytes (models and control) the learner sent while they joined
    joiner_wire_bytes: int = -1  # bytes that left the learner's ports meanwhile, beyond its stream's versions
    pause_reach: list[float] = field(default_factory=list)  # per long pause in the flood
    pauses_seen: int = 0
    pause_wait_s: float = 0.0  # from the flood's start to the first pause
    fairness: float | None = None
    fair_accepted: list[int] = field(default_factory=list)
    fair_offered: float = 0.0
    accepted_from: int = 0  # simulated actors the learner took transitions from over the run
    newest_version: int = -1  # the newest version the probe saw
    holding_newest: int = 0  # simulated actors that took it
    rejected: int = 0
    lost: int = 0
    refused: int = 0
    proxy_cpu: float = 0.0  # the proxies' CPU-s over the steady window (every thread)
    proxy_main_cpu: float = 0.0  # ... their main threads (the data path)
    relay_cpu: float = 0.0  # ... their relay threads (their own count)
    relay_snapshot_models: int = 0  # models the relays took from the learner's snapshots (missed on the stream)
    forwarded: int = 0  # transitions the learner took in over that window
    copied: int = 0  # model bytes the simulated actors copied into their buffers
    wall_s: float = 0.0
    note: str = ""


class _Bench(RunBench):
    """The fan-in bench's run control (the rate PUB, the report PULL, the learner's summaries, liveness),
    keeping every report the simulated hosts send."""

    def __init__(self, summary_path: Path, procs: list[Proc]) -> None:
        super().__init__(summary_path, procs)
        self.reports: list[dict[str, Any]] = []

    def tick(self, wait_s: float = 0.05) -> None:
        super().tick(wait_s)
        while self.pull.poll(0, zmq.POLLIN):
            self.reports.append(self.pull.recv_json())  # type: ignore[arg-type]

    def wait(self, what: str, cond: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > deadline:
                raise BenchError(f"{what}: not within {timeout_s:.0f}s")
            self.tick()

    def ready(self, hosts: set[int], timeout_s: float) -> list[dict[str, Any]]:  # type: ignore[override]
        """Wait for the hosts ``hosts`` to say each of their actors holds a model; their reports."""
        self.wait(f"{len(hosts)} simulated hosts ready", lambda: hosts <= {r["ready"] for r in self.reports},
                  timeout_s)
        return [r for r in self.reports if r["ready"] in hosts]


def wire_bytes(ports: list[int]) -> tuple[int, int]:
    """Bytes acknowledged on every established TCP connection from one of ``ports`` (``ss -ti``), and how
    many connections; (-1, 0) where ``ss`` cannot say."""
    query = " or ".join(f"sport = :{p}" for p in ports)
    try:
        out = subprocess.run(["ss", "-tinH", "state", "established", f"( {query} )"], capture_output=True,
                             text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return -1, 0
    total = conns = 0
    for token in out.split():
        if token.startswith("bytes_acked:"):
            total += int(token.split(":", 1)[1])
            conns += 1
    return total, conns


def idle_argv(argv: list[str]) -> list[str]:
    """``argv`` run under SCHED_IDLE (``chrt --idle 0``) where the machine has chrt: every thread of the
    process, from its first, takes only CPU the learner leaves (nice 10 alone let 128 host processes take
    most of two cores from it: their weights add up)."""
    chrt = shutil.which("chrt")
    return [chrt, "--idle", "0", *argv] if chrt else argv


def yield_cpu(proc: Proc) -> None:
    """Lower ``proc``'s priority (and its session's, where the kernel groups scheduling by session) to
    NICE: what a simulated host or its proxy costs must not be taken from the learner's CPU, as it would
    not be on a cluster, where they run on other machines."""
    pid = proc.popen.pid
    try:
        os.setpriority(os.PRIO_PROCESS, pid, NICE)
        with open(f"/proc/{pid}/autogroup", "w") as fh:
            fh.write(str(NICE))
    except OSError:
        pass


def _port(addr: str) -> int:
    return int(addr.rsplit(":", 1)[1])


def host_ip(h: int) -> str:
    """The loopback address simulated host ``h`` binds on (127.0.0.2 onwards; the learner has 127.0.0.1)."""
    return f"127.0.{(h + 2) // 254}.{(h + 2) % 254 or 254}"


def host_addr(ip: str) -> str:
    return f"tcp://{ip}:{free_port(ip)}"


def messages_file(c: Context, load: Load) -> Path:
    """Recorded real batches of ``load.n_buffer`` transitions (made once per bench run): CartPole's from a
    uniform random policy through the n-step builder, Pong's from its config's acting loop with each frame
    once per batch, as actors send them."""
    path = c.path(f"scale-{Path(load.config).stem}-messages.npz")
    if path.exists():
        return path
    cfg = load_config(_config_path(c, load), *load.overrides())
    n = load.n_buffer
    if load is PONG:
        from zmqrl.bench.data import pong_transitions
        from zmqrl.frames import image_fields
        from zmqrl.wire.compact import FrameCompactor

        spec, batch = pong_transitions(load.transitions, seed=1, config=str(_config_path(c, load)))
        compactor = FrameCompactor(image_fields(spec))
        messages = [compactor.compact({k: v[lo:lo + n] for k, v in batch.items()})[0]
                    for lo in range(0, load.transitions - n + 1, n)]
    else:
        from zmqrl.bench.data import TRANSITION_KEYS, transition_pool

        pool = transition_pool(cfg, load.transitions, seed=1)
        pool["priority"] = np.random.default_rng(1).uniform(0.01, 2.0, load.transitions).astype(np.float32)
        messages = [{k: pool[k][lo:lo + n] for k in (*TRANSITION_KEYS, "priority")}
                    for lo in range(0, load.transitions - n + 1, n)]
    return save_messages(path, messages)


def _config_path(c: Context, load: Load) -> Path:
    if c.settings.config is not None:
        return c.settings.config
    return c.configs(load.config)[0]


def _reach(firsts: list[float | None], start: float) -> float:
    """Seconds from ``start`` until REACH % of actors had their event (each actor's first time, or None)."""
    delays = [math.inf if t is None else max(0.0, t - start) for t in firsts]
    return float(np.percentile(np.asarray(delays), REACH, method="higher")) if delays else math.nan


def version_reach(published: dict[int, float], window: tuple[float, float], actors: list[dict[str, Any]]
                  ) -> tuple[list[float], int]:
    """Per version the probe saw published within ``window``: seconds until REACH % of ``actors`` held it
    or a newer one; and how many (actor, version) pairs never got there."""
    taken = [sorted((int(v), float(t)) for v, t in a["versions"]) for a in actors]
    out, missed = [], 0
    for version, at in sorted(published.items()):
        if not window[0] <= at <= window[1]:
            continue
        firsts: list[float | None] = []
        for records in taken:
            first = next((t for v, t in records if v >= version and t >= at - 1.0), None)
            missed += first is None
            firsts.append(first)
        out.append(_reach(firsts, at))
    return out, missed


def pause_reach(pauses: list[tuple[int, bool, float]], since: float, actors: list[dict[str, Any]]
                ) -> list[float]:
    """Per pause the probe saw from ``since`` on that lasted LONG_PAUSE_S: seconds until REACH % of
    ``actors`` had taken a paused control of it (a control seq from its start to its end)."""
    out = []
    for i, (seq, paused, at) in enumerate(pauses):
        if not paused or at < since:
            continue
        end_seq, end_at = (pauses[i + 1][0], pauses[i + 1][2]) if i + 1 < len(pauses) else (2**62, math.inf)
        if end_at - at < LONG_PAUSE_S:
            continue
        firsts = [next((float(t) for s, p, t in a["pauses"] if p and seq <= s < end_seq), None) for a in actors]
        out.append(_reach(firsts, at))
    return out


def granular_jain(accepted: np.ndarray, n_buffer: int) -> float:
    """The Jain index a perfectly fair allocation in whole batches would read, the batches falling on actors
    at random (Poisson with the same mean m): m / (m + 1). Few batches per actor cap the index however
    fair the limiter is: 4 each read 0.8."""
    m = float(np.mean(accepted)) / max(n_buffer, 1)
    return m / (m + 1.0) if m > 0 else 0.0


def jain(values: list[int]) -> float | None:
    """Jain's fairness index of ``values``: 1 when all are equal, 1/n when one has everything."""
    x = np.asarray(values, dtype=np.float64)
    total = float((x ** 2).sum())
    return float(x.sum() ** 2 / (len(x) * total)) if len(x) and total > 0 else None


def _proxy_cpu(procs: list[Proc]) -> tuple[float, float]:
    """CPU-s so far of these proxies: every thread, and their main threads."""
    return (sum(cpu_seconds(p.popen.pid, fine=True) for p in procs),
            sum(cpu_seconds(p.popen.pid, p.popen.pid) for p in procs))


def measure(c: Context, load: Load, n: int, *, hosts: int | None = None, relay: bool = True, joiners: int = 0,
            flood: bool = True, tag: str = "") -> ScaleRun:
    """One learner run with ``n`` simulated actors over ``hosts`` hosts (module docstring)."""
    plan = PLANS.get(c.settings.mode, PLANS["full"])
    h_count, per_host = (hosts, n // hosts) if hosts else SHAPES.get(n, (max(1, n // 16), min(n, 16)))
    n = h_count * per_host
    path = _config_path(c, load)
    tag = tag or f"{path.stem}-{n}"
    overrides = load.overrides()
    cfg = load_config(path, *overrides)
    run_dir = c.path(f"scale-{tag}")
    data, model, evals, snap = free_addr(), free_addr(), free_addr(), free_addr()
    sets = [a for o in overrides for a in ("--set", o)]
    result = ScaleRun(path.stem, n, h_count, per_host, relay, load.n_buffer, offered=load.rate_low)
    messages = messages_file(c, load)
    started = time.monotonic()
    common = {"config": str(path), "overrides": overrides, "messages": str(messages), "n_buffer": load.n_buffer,
              "sndhwm": cfg.actor.send_hwm, "timeout_s": 1800.0, "idle": True}
    with Procs(c.logs) as procs:
        procs.sweep_args.append(str(run_dir))
        bench = _Bench(run_dir / "summary.json", procs.procs)
        probe = Probe(cfg.net, model)
        probe.start()
        try:
            learner = procs.start(f"scale-{tag}-learner", zmqrl_argv(
                "learner", str(path), "--run-dir", str(run_dir), "--bind-data", data, "--bind-model", model,
                "--bind-eval", evals, "--bind-snapshot", snap, *sets))
            bench.fresh_summary(180.0)  # the learner's loop runs
            proxies, streams, outs = [], [], []
            for h in range(h_count):
                ip = host_ip(h)
                bind = host_addr(ip)
                argv = ["proxy", str(path), "--bind", bind, "--learner", data, "--models", model, "--snapshot", snap,
                        "--name", f"host-{h}", "--run-dir", str(run_dir)]
                if relay:
                    stream, snapshot = host_addr(ip), host_addr(ip)
                    argv += ["--relay", stream, "--relay-snapshot", snapshot]
                else:
                    stream, snapshot = model, snap
                proxies.append(procs.start(f"scale-{tag}-proxy-{h}", idle_argv(zmqrl_argv(*argv, *sets))))
                yield_cpu(proxies[-1])
                streams.append((bind, stream, snapshot))
            host_procs = []
            for h, (bind, stream, snapshot) in enumerate(streams):
                out = c.path(f"scale-{tag}-host-{h}.json")
                outs.append(out)
                host_procs.append(procs.child(f"scale-{tag}-host-{h}", sim_host, {
                    **common, "host": h, "first": h * per_host, "count": per_host, "proxy": bind, "stream": stream,
                    "snapshot": snapshot, "control": bench.control, "report": bench.report, "out": str(out)}))
                yield_cpu(host_procs[-1])
            bench.ready(set(range(h_count)), 120.0 + n * 0.2)
            # steady: the learner trains on what comes (it waits for data at max_samples_per_insert)
            bench.offer(load.rate_low / n)
            bench.fresh_summary(120.0, lambda s: s.get("opt_steps", 0) > 0 and s.get("model_version", 0) >= 1)
            first = bench.fresh_summary(30.0)
            t0 = time.time()
            b0, _ = wire_bytes([_port(model), _port(snap)])
            cpu0 = _proxy_cpu(proxies)
            last = bench.fresh_summary(plan.steady_s + 30.0, lambda s: s["wall_s"] >= first["wall_s"] + plan.steady_s)
            t1 = time.time()
            b1, conns = wire_bytes([_port(model), _port(snap)])
            cpu1 = _proxy_cpu(proxies)
            span = last["wall_s"] - first["wall_s"]
            result.steady_s = span
            result.intake = (last["transitions_inserted"] - first["transitions_inserted"]) / span
            result.forwarded = last["transitions_inserted"] - first["transitions_inserted"]
            result.opt_steps_s = (last["opt_steps"] - first["opt_steps"]) / span
            result.wire_bytes = b1 - b0 if b0 >= 0 and b1 >= 0 else -1
            result.wire_connections = conns
            result.publisher = {k: last["publisher"].get(k, 0) - first["publisher"].get(k, 0)
                                for k in ("bytes_sent", "model_bytes", "models_published", "model_versions_sent",
                                          "snapshot_model_bytes", "snapshot_models", "control_bytes")}
            result.proxy_cpu, result.proxy_main_cpu = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
            result.rss = rss_bytes(learner.popen.pid) or 0
            result.sockets = open_sockets(learner.popen.pid)
            result.versions = sum(t0 <= t <= t1 for t in probe.published.values())
            window = (t0, t1)
            if joiners:
                result.joiner_waits, result.joiner_snapshot_bytes, result.joiner_wire_bytes = _join(
                    c, bench, procs, probe, common, streams[0], tag, n, joiners, model, snap)
            flood_at = time.time()
            if flood:
                bench.offer(load.rate_high / n)
                bench.wait("a pause of the rate limiter in the flood",
                           lambda: any(p and t >= flood_at for _, p, t in probe.pauses), 60.0)
                result.pause_wait_s = next(t for _, p, t in probe.pauses if p and t >= flood_at) - flood_at
                f0 = bench.fresh_summary(30.0)
                f1 = bench.fresh_summary(plan.fair_s + 30.0, lambda s: s["wall_s"] >= f0["wall_s"] + plan.fair_s)
                names = [f"sim-{i}" for i in range(n)]
                before, after = f0.get("actors", {}), f1.get("actors", {})
                result.fair_accepted = [int(after.get(a, {}).get("transitions", 0))
                                        - int(before.get(a, {}).get("transitions", 0)) for a in names]
                result.fairness = jain(result.fair_accepted)
                result.fair_offered = load.rate_high
            bench.offer(0.0)
            bench.tick(0.5)
            stopping_at = time.time()
            stop_roles(host_procs, 20.0)  # all at once (each stops within a loop's wake-up)
            for proc in host_procs:
                if proc.popen.wait() != 0:
                    raise proc.failure("a simulated host did not stop cleanly")
            stop_roles(proxies, 10.0)  # (their roles files: the relays' counters)
            relays = [read_json(run_dir / "roles" / f"host-{h}.json") for h in range(h_count)]
            learner.stop(30.0)
        finally:
            probe.close()
            bench.close()
    actors = [a for out in outs for a in (read_json(out) or {}).get("actors", [])]
    if len(actors) != n:
        raise BenchError(f"{len(actors)} of {n} simulated actors reported")
    result.model_bytes = probe.model_bytes
    result.version_reach, result.version_missed = version_reach(probe.published, window, actors)
    if flood:
        result.pause_reach = pause_reach(probe.pauses, flood_at, actors)
        result.pauses_seen = sum(p for _, p, t in probe.pauses if t >= flood_at)
    # the newest version published a second or more before the hosts stopped
    result.newest_version = max((v for v, t in probe.published.items() if t <= stopping_at - 1.0), default=-1)
    result.holding_newest = sum(any(v >= result.newest_version for v, _ in a["versions"]) for a in actors)
    result.copied = sum(int(a["copied"]) for a in actors)
    result.relay_cpu = sum(float(((r or {}).get("relay") or {}).get("cpu_s", 0.0)) for r in relays)
    result.relay_snapshot_models = sum(int(((r or {}).get("relay") or {}).get("upstream_snapshot_models", 0))
                                       for r in relays)
    final = read_json(run_dir / "summary.json") or {}
    accounts = final.get("actors", {})
    result.accepted_from = sum(int(accounts.get(f"sim-{i}", {}).get("transitions", 0)) > 0 for i in range(n))
    messages_ = final.get("messages", {})
    result.rejected = int(messages_.get("rejected_total", -1))
    result.lost = int(messages_.get("batches_lost", -1))
    result.refused = int(messages_.get("peers_refused", -1))
    result.wall_s = time.monotonic() - started
    return result


def _join(c: Context, bench: _Bench, procs: Procs, probe: Probe, common: dict[str, Any], host: tuple[str, str, str],
          tag: str, n: int, joiners: int, model: str, snap: str) -> tuple[list[float], int, int]:
    """Start ``joiners`` simulated actors late on host 0 (its proxy and its stream); each one's wait for its
    first model, the snapshot bytes the learner sent meanwhile (its summaries), and the bytes that left its
    ports beyond one model per version it published meanwhile (-1 where ``ss`` cannot say)."""
    bind, stream, snapshot = host
    before = bench.fresh_summary(30.0)
    b0, _ = wire_bytes([_port(model), _port(snap)])
    versions0 = len(probe.published)
    out = c.path(f"scale-{tag}-join.json")
    proc = procs.child(f"scale-{tag}-join", sim_host, {
        **common, "host": 10_000, "first": n, "count": joiners, "prefix": "join", "proxy": bind, "stream": stream,
        "snapshot": snapshot, "control": bench.control, "report": bench.report, "out": str(out)})
    report = bench.ready({10_000}, 120.0)[-1]
    after = bench.fresh_summary(30.0)
    b1, conns = wire_bytes([_port(model), _port(snap)])
    published = len(probe.published) - versions0
    code = proc.stop(20.0)
    if code != 0:
        raise proc.failure("the joiners did not stop cleanly")
    procs.procs.remove(proc)
    snap_bytes = sum(after["publisher"].get(k, 0) - before["publisher"].get(k, 0)
                     for k in ("snapshot_model_bytes", "snapshot_control_bytes"))
    extra = -1
    if b0 >= 0 and b1 >= 0:
        extra = max(0, (b1 - b0) - published * probe.model_bytes * conns)
    return [float(x) for x in report["first_model_s"]], snap_bytes, extra


# ------------------------------------------------------------------------------------- side runs


@dataclass
class Freed:
    """The freed-state sub-run: two generations of PEER_GEN actor names, one after the other."""

    max_peers: int
    idle_s: float
    held_after: int = 0  # peers the learner held after the second generation
    first_held: int = 0  # of those, names of the first generation
    second_accepted: int = 0  # second-generation names it took transitions from
    refused: int = 0


def freed(c: Context, load: Load) -> Freed:
    """A learner with ``net.max_peers`` = PEER_GEN and ``net.peer_idle_s`` = 1, one proxy and relay: a first
    generation of PEER_GEN simulated actors sends and stops, a second of new names sends after the first
    has been silent for longer than ``net.peer_idle_s``."""
    idle_s = 1.0
    path = _config_path(c, load)
    overrides = [*load.overrides(), f"net.max_peers={PEER_GEN}", f"net.peer_idle_s={idle_s:g}"]
    cfg = load_config(path, *overrides)
    run_dir = c.path("scale-freed")
    data, model, evals, snap = free_addr(), free_addr(), free_addr(), free_addr()
    sets = [a for o in overrides for a in ("--set", o)]
    common = {"config": str(path), "overrides": overrides, "messages": str(messages_file(c, load)),
              "n_buffer": load.n_buffer, "sndhwm": cfg.actor.send_hwm, "timeout_s": 600.0}
    result = Freed(PEER_GEN, idle_s)
    ip = host_ip(0)
    bind, stream, snapshot = host_addr(ip), host_addr(ip), host_addr(ip)
    with Procs(c.logs) as procs:
        procs.sweep_args.append(str(run_dir))
        bench = _Bench(run_dir / "summary.json", procs.procs)
        try:
            procs.start("scale-freed-learner", zmqrl_argv(
                "learner", str(path), "--run-dir", str(run_dir), "--bind-data", data, "--bind-model", model,
                "--bind-eval", evals, "--bind-snapshot", snap, *sets))
            bench.fresh_summary(180.0)
            procs.start("scale-freed-proxy", zmqrl_argv(
                "proxy", str(path), "--bind", bind, "--learner", data, "--models", model, "--snapshot", snap,
                "--relay", stream, "--relay-snapshot", snapshot, "--name", "host-0", *sets))
            bench.offer(load.rate_low / PEER_GEN)
            for gen in (0, 1):
                names = {f"gen{gen}-{gen * PEER_GEN + k}" for k in range(PEER_GEN)}
                proc = procs.child(f"scale-freed-gen{gen}", sim_host, {
                    **common, "host": gen, "first": gen * PEER_GEN, "count": PEER_GEN, "prefix": f"gen{gen}",
                    "proxy": bind, "stream": stream, "snapshot": snapshot, "control": bench.control,
                    "report": bench.report, "out": str(c.path(f"scale-freed-gen{gen}.json"))})
                bench.ready({gen}, 120.0)
                summary = bench.fresh_summary(60.0, _sent_from(names))
                if proc.stop(20.0) != 0:
                    raise proc.failure("a generation did not stop cleanly")
                procs.procs.remove(proc)
                if gen == 0:  # the first generation silent for longer than net.peer_idle_s (the condition measured)
                    bench.wait("the first generation silent", _after(time.monotonic() + 2 * idle_s), 10.0)
            held = set(summary.get("actors", {}))
            result.held_after = len(held)
            result.first_held = sum(a.startswith("gen0-") for a in held)
            result.second_accepted = sum(summary["actors"][a].get("transitions", 0) > 0 for a in held
                                         if a.startswith("gen1-"))
            result.refused = int(summary.get("messages", {}).get("peers_refused", -1))
        finally:
            bench.close()
    return result


def _after(deadline: float) -> Callable[[], bool]:
    return lambda: time.monotonic() >= deadline


def _sent_from(names: set[str]) -> Callable[[dict[str, Any]], bool]:
    """Whether a learner summary has taken transitions from every one of ``names``."""
    return lambda s: names <= {a for a, v in s.get("actors", {}).items() if v.get("transitions", 0) > 0}


# ------------------------------------------------------------------------------------- rows


def model_bytes_per_version(r: ScaleRun) -> float | None:
    """Bytes that left the learner's ports per version over the steady window, less its control messages
    (counted once per send by its publisher; each went to the H relays and the probe)."""
    if not r.versions or r.wire_bytes < 0:
        return None
    return (r.wire_bytes - r.publisher.get("control_bytes", 0) * (r.hosts + 1)) / r.versions


def _p(values: list[float], q: float) -> float | None:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.percentile(np.asarray(finite), q, method="higher")) if finite else None


def _fmt_s(x: float | None) -> str:
    return "-" if x is None else "never" if math.isinf(x) else f"{x * 1000:.0f} ms"


def rows_of(runs: list[ScaleRun], base: ScaleRun) -> list[Row]:
    """The rows of one config's runs, each against its N = 8 run (``base``)."""
    out: list[Row] = []
    for r in runs:
        name = f"scale_{r.config}_{r.n}"
        shape = f"N={r.n} ({r.hosts} hosts x {r.per_host})"
        model = r.model_bytes
        # bytes per version: what left the learner's ports (TCP), per version published in the window
        per_version, base_per = model_bytes_per_version(r), model_bytes_per_version(base)
        goal_bytes = (r.hosts + 1) * model
        pub = r.publisher
        out.append(make_row(
            f"{name}_bytes_per_version", per_version, goal_bytes, "bytes",
            f"{shape}: bytes that left the learner's XPUB and snapshot ports (TCP, acknowledged, `ss`) over "
            f"{r.steady_s:.1f}s of steady load, less the control messages (the publisher's "
            f"{pub.get('control_bytes', 0):,.0f} bytes, to each of the {r.hosts + 1} control subscribers; "
            f"{r.wire_bytes / max(r.versions, 1):,.0f} B "
            f"a version with them), per model version published ({r.versions}); baseline (H + 1) x the "
            f"model message ({model:,} B): its {r.hosts} relays and the bench's probe ({r.wire_connections} "
            f"connections on those ports); the publisher's own counts over the window: "
            f"{pub.get('models_published', 0):.0f} model sends of {pub.get('model_versions_sent', 0):.0f} versions, "
            f"snapshot model bytes "
            f"{pub.get('snapshot_model_bytes', 0):,.0f} (the relays took {r.relay_snapshot_models} models from "
            f"snapshots over the run: at start and any they missed); N=8: {base_per or 0:,.0f} B a version; "
            f"the goal's 1% is "
            f"ZMTP framing and heartbeats (a model more per version would be {1 + 1 / (r.hosts + 1):.3f})",
            ("<=", BYTES_SLACK)))
        out.append(make_row(
            f"{name}_intake", r.intake, base.intake, "transitions/s",
            f"{shape}: transitions/s the learner took in (its own count) over the steady window, "
            f"{r.offered:,.0f}/s offered in all ({r.offered / r.n:,.1f}/s per actor) in {r.n_buffer}-transition "
            f"batches; it trained {r.opt_steps_s:,.0f} opt steps/s (N=8: {base.opt_steps_s:,.0f}); vs N=8",
            (">=", 0.9) if r.n > base.n else None))
        reach = _p(r.version_reach, 99.0)
        out.append(make_row(
            f"{name}_version_reach", reach, 1.0, "s",
            f"{shape}: p99 over the {len(r.version_reach)} versions of the steady window of the time from the probe "
            f"on the learner's XPUB seeing a version to {REACH:g}% of actors holding it (or a newer one); median "
            f"{_fmt_s(_p(r.version_reach, 50))}, {r.version_missed} (actor, version) pairs never reached; "
            f"N=8: {_fmt_s(_p(base.version_reach, 99))}; goal 1 s", ("<=", 1.0), complete=r.version_missed == 0
            or reach is not None and math.isfinite(reach)))
        first = r.pause_reach[0] if r.pause_reach else None
        out.append(make_row(
            f"{name}_control_reach", first, 0.2, "s",
            f"{shape}: from the probe seeing the rate limiter's first pause of at least {LONG_PAUSE_S:g}s in the flood "
            f"({r.fair_offered:,.0f}/s offered; it came {r.pause_wait_s:.1f}s in) to {REACH:g}% of actors paused; "
            f"{len(r.pause_reach)} such pauses, worst {_fmt_s(max(r.pause_reach) if r.pause_reach else None)} "
            f"({r.pauses_seen} pauses in all); N=8: {_fmt_s(base.pause_reach[0] if base.pause_reach else None)}; "
            f"goal 200 ms", ("<=", 1.0)))
        if r.n > base.n and r.rss and base.rss:
            per_k = (r.rss - base.rss) / (r.n - base.n) * 1000 / 2**20
            out.append(make_row(
                f"{name}_rss_per_1000_peers", max(per_k, 1e-3), 50.0, "MiB",
                f"{shape}: learner VmRSS at the end of the steady window {r.rss / 2**20:,.0f} MiB against N=8's "
                f"{base.rss / 2**20:,.0f} MiB, the difference per 1,000 more peers (floored at 0.001); it held "
                f"{r.sockets} sockets; goal 50 MiB", ("<=", 1.0)))
        if r.fairness is not None:
            acc = np.asarray(r.fair_accepted)
            out.append(make_row(
                f"{name}_fairness", r.fairness, 1.0, "Jain index",
                f"{shape}: Jain's index of the transitions the learner accepted from each actor (its per-actor "
                f"accounts) over {PLANS['full'].fair_s:g}s of the flood, the rate limiter pausing them; per actor "
                f"min {acc.min():,} median {np.median(acc):,.0f} max {acc.max():,}; N=8: {base.fairness or 0:.3f}; "
                f"a fair limiter granting whole batches of {r.n_buffer} at random would read about "
                f"{granular_jain(acc, r.n_buffer):.3f} at this many batches per actor; goal 0.95", (">=", 0.95)))
        if r.joiner_waits:
            waits = sorted(r.joiner_waits)
            out.append(make_row(
                f"{name}_joiner_wait", max(waits), 1.0, "s",
                f"{shape}: {len(waits)} actors joining host 0's relay late, the longest wait from its stream's "
                f"making to its first model (median {_fmt_s(float(np.median(waits)))}); N=8: "
                f"{_fmt_s(max(base.joiner_waits) if base.joiner_waits else None)}; goal 1 s", ("<=", 1.0)))
            per = r.joiner_snapshot_bytes / len(waits)
            wire = f"{r.joiner_wire_bytes / len(waits):,.0f}" if r.joiner_wire_bytes >= 0 else "-"
            note = (f"{shape}: snapshot bytes (models and control) the learner sent while {len(waits)} actors joined, "
                    f"per joiner (its summaries); bytes that left its ports beyond its stream's versions, per "
                    f"joiner: {wire}; baseline one model ({model:,} B); the relays took {r.relay_snapshot_models} "
                    f"models from the learner's snapshots over the run (each at start, then any it missed on "
                    f"the stream: its PUB drops what a busy relay's queue cannot take)")
            ratio = per / model if model else None
            out.append(Row(f"{name}_joiner_bytes", float(per), float(model), ratio, "<= 1",
                           None if ratio is None else ratio <= 1.0, "bytes", note))
    return out


def relay_rows(off: ScaleRun, on: ScaleRun) -> list[Row]:
    """A host proxy's CPU per 1,000 transitions forwarded, relay on against relay off (K = RELAY_K)."""
    def per_k(cpu: float, r: ScaleRun) -> float | None:
        return 1000 * cpu / r.forwarded if r.forwarded else None

    main_on, main_off = per_k(on.proxy_main_cpu, on), per_k(off.proxy_main_cpu, off)
    all_on, all_off = per_k(on.proxy_cpu, on), per_k(off.proxy_cpu, off)
    return [make_row(
        f"scale_relay_proxy_cpu_k{on.per_host}", main_on, main_off, "CPU-s/1000 transitions",
        f"one host of {on.per_host} actors, {on.offered:,.0f} transitions/s offered: the proxy process's main "
        f"thread (the data path: read, check, count, forward) per 1,000 transitions forwarded over the steady "
        f"window, relay on (its thread relays models and control to the {on.per_host} actors) vs relay off (actors "
        f"subscribe to the learner, no --relay); every thread of the process: {all_on or 0:.4f} on vs "
        f"{all_off or 0:.4f} off (the relay thread's own count: {on.relay_cpu:.2f} CPU-s over the whole run; "
        f"{on.versions} versions of {on.model_bytes:,} B in the window)", ("<=", 1.1))]


def freed_row(f: Freed) -> Row:
    note = (f"a learner with net.max_peers={f.max_peers} and net.peer_idle_s={f.idle_s:g}: {PEER_GEN} actors sent and "
            f"stopped; after {2 * f.idle_s:g}s of their silence {PEER_GEN} new names sent: it then held {f.held_after} "
            f"peers ({f.first_held} of the first generation), took transitions from {f.second_accepted} of the "
            f"second, refused {f.refused}; baseline: both generations' names ({2 * PEER_GEN}); goal: only the "
            f"live generation held (the state of peers gone is forgotten when a newcomer needs the room, not "
            f"before; the process's memory is not returned to the system, only reused)")
    return make_row("scale_peer_state_freed", f.held_after, 2 * PEER_GEN, "peers", note, ("<=", 0.5),
                    complete=f.refused == 0 and f.second_accepted == PEER_GEN)


# ------------------------------------------------------------------------------------- figure


ROW_KINDS = (("bytes_per_version", "learner bytes per version / ((H+1) x model)", "ratio"),
             ("intake", "learner intake vs N=8", "ratio"),
             ("version_reach", "version reach, p99 (s)", "measured"),
             ("control_reach", "pause reach (s)", "measured"),
             ("rss_per_1000_peers", "learner MiB per 1,000 peers", "measured"),
             ("fairness", "Jain's index under the limiter", "measured"),
             ("joiner_wait", "joiner's wait for a model (s)", "measured"),
             ("joiner_bytes", "learner bytes per joiner / model", "ratio"))
GOAL_LINES = {"bytes_per_version": BYTES_SLACK, "intake": 0.9, "version_reach": 1.0, "control_reach": 0.2,
              "rss_per_1000_peers": 50.0, "fairness": 0.95, "joiner_wait": 1.0, "joiner_bytes": 1.0}


def plot(rows: list[dict[str, Any]], out: Path) -> bool:
    """Each row kind against N (one panel each, a line per config, the goal dashed); False without matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return False
    fig = Figure(figsize=(12, 10), layout="constrained")
    axes = fig.subplots(4, 2).ravel()
    for ax, (kind, title, what) in zip(axes, ROW_KINDS, strict=True):
        for config in sorted({r["name"].split("_")[1] + "_" + r["name"].split("_")[2] for r in rows
                              if r["name"].startswith("scale_") and r["name"].endswith(kind)}):
            points = []
            for r in rows:
                parts = r["name"].split("_")
                if r["name"].endswith(kind) and "_".join(parts[1:3]) == config and parts[3].isdigit():
                    value = r["ratio"] if what == "ratio" else r["measured"]
                    if value is not None:
                        points.append((int(parts[3]), float(value)))
            if points:
                points.sort()
                ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=config)
        ax.axhline(GOAL_LINES[kind], color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks([8, 64, 256, 1024], labels=["8", "64", "256", "1024"])
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("simulated actors N", fontsize=8)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle("zmqrl bench --only scale: each row against N (dashed: the goal)")
    fig.savefig(out, dpi=100)
    return True


# ------------------------------------------------------------------------------------- the group


def run(c: Context) -> list[Row]:
    plan = PLANS.get(c.settings.mode, PLANS["full"])
    rows: list[Row] = []
    raw: dict[str, Any] = {"runs": []}
    loads = [(CARTPOLE, plan.cartpole)] + ([(PONG, plan.pong)] if plan.pong and c.settings.config is None else [])
    for load, counts in loads:
        runs: list[ScaleRun] = []
        for n in counts:
            try:
                runs.append(measure(c, load, n, joiners=plan.joiners))
            except BenchError as exc:
                log.warning("bench scale: %s at N=%d failed: %s", load.config, n, exc)
                rows.append(Row(f"scale_{Path(load.config).stem}_{n}", None, None, None, None, False, "",
                                f"error: {type(exc).__name__}: {str(exc).splitlines()[0]} (logs kept in {c.work})"))
                break
        raw["runs"].extend(asdict(r) for r in runs)
        if runs:
            rows.extend(rows_of(runs, runs[0]))
        skipped = [n for n in SHAPES if n not in counts]
        if load is PONG and skipped and runs:
            for row in rows:
                if row.name.startswith("scale_pong_dqn_"):
                    row.note += (f"; Pong runs at N = {', '.join(map(str, counts))} only: at "
                                 f"{', '.join(map(str, skipped))} every version is "
                                 f"{runs[0].model_bytes / 2**20:.1f} MB copied N times on this machine's "
                                 f"{os.cpu_count()} cores")
    if plan.extras:
        off = measure(c, CARTPOLE, RELAY_K, hosts=1, relay=False, flood=False, tag=f"relay-off-{RELAY_K}")
        on = measure(c, CARTPOLE, RELAY_K, hosts=1, relay=True, flood=False, tag=f"relay-on-{RELAY_K}")
        raw["runs"].extend([asdict(off), asdict(on)])
        rows.extend(relay_rows(off, on))
        f = freed(c, CARTPOLE)
        raw["freed"] = asdict(f)
        rows.append(freed_row(f))
    raw["rows"] = [r.as_dict() for r in rows]
    (c.work / "scale.json").write_text(json.dumps(raw, default=float))
    plot(raw["rows"], c.work / "scale.png")
    return rows


def main(argv: list[str] | None = None) -> int:
    """``python -m zmqrl.bench.scale SCALE_JSON OUT_PNG``: draw a kept run's figure again."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m zmqrl.bench.scale SCALE_JSON OUT_PNG", file=sys.stderr)
        return 2
    rows = json.loads(Path(args[0]).read_text())["rows"]
    if not plot(rows, Path(args[1])):
        print("matplotlib is not installed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
