"""Fanin group: how far one learner scales with many connected senders.

One real :class:`~zmqrl.roles.learner.Learner` (CartPole DQN, replay prefilled, rate limiter off)
runs in its own process; several real ``zmqrl proxy`` processes forward to it, as a multi-host
run has one proxy per host; N senders, spread over a few processes, each with its own PUSH
socket to a proxy, its own SUB socket on the learner's models and its own name and incarnation,
send pre-encoded ``actor.n_buffer``-transition batches with an actor's meta. The bench tells the
sender processes the total rate to offer over a control socket.

Per N: the learner's opt steps/s with the senders connected but silent (idle), then offered
rates doubling from ``RATE0`` until the learner falls below ``KEEP`` x idle, then bisection
between the last rate it kept and the first it did not. The row's figure is the most transitions/s
the learner took in (its own ``transitions_inserted``, between two of its summaries) at an offered
rate where it kept ``KEEP`` x idle. Its memory (VmRSS) and sockets are read from ``/proc``.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from zmqrl.bench.fanin_workers import GOAL_RATE, INTAKE_PASSES, intake, learn, send_many
from zmqrl.bench.harness import (
    HOST,
    BenchError,
    Context,
    Proc,
    Procs,
    Row,
    child_result,
    free_addr,
    make_row,
    zmqrl_argv,
)
from zmqrl.bench.learner import learner_config, prefill_pool
from zmqrl.bench.procfs import cpu_seconds, open_sockets, rss_bytes
from zmqrl.bench.scaling import LIMITER_OFF
from zmqrl.run.lifecycle import Every
from zmqrl.run.rundir import read_json

CONFIG = "cartpole_dqn.yaml"
PROXIES = 4  # zmqrl proxy processes (hosts, in a real run)
PROCESSES = 4  # sender processes; the senders are spread over them
KEEP = 0.9  # the learner must keep this share of its idle opt steps/s
RATE0 = 25_000.0  # the first offered rate, transitions/s in all
RATE_MAX = 400_000.0  # offered rates double up to this
SATURATED = 0.8  # taking in less than this share of the offer: offering more gains nothing
OVERRIDES = (LIMITER_OFF,)  # the learner's summaries (the figures read) come at its default net.stats_interval_s
INTAKE_SENDERS = 64  # the intake row's senders (names, incarnations, sequences the learner accounts)


# ------------------------------------------------------------------------------------- measurement


@dataclass
class Step:
    """One measured window: the total rate offered and what the learner did."""

    offered: float
    opt_s: float
    ingest_s: float
    seconds: float
    cpu: dict[str, float] = field(default_factory=dict)  # cores used: learner thread, learner, proxies, senders
    reference: float = 0.0  # idle opt steps/s around this window (the silent windows just before and after)

    def opt_per_cpu(self) -> float:
        """Opt steps per CPU-second of the learner's thread: what it does with the CPU it gets."""
        return self.opt_s / max(self.cpu.get("learner thread", 0.0), 1e-9)


@dataclass
class Fanin:
    """What one learner run with ``senders`` senders gave."""

    senders: int
    proxies: int
    processes: int
    idle_opt_s: float
    steps: list[Step] = field(default_factory=list)
    rss_start: int = 0  # learner VmRSS, bytes, when the first offered rate began
    rss_end: int = 0  # ... when the last window closed
    sockets: int = 0  # sockets the learner held during the last window
    actors: int = 0  # senders the learner accounted for (its final summary)
    proxies_seen: int = 0
    inserted: int = 0
    batches: int = 0
    rejected: int = 0
    lost: int = 0
    sent: int = 0  # batches the senders sent in all

    idle: Step | None = None

    idle_windows: list[Step] = field(default_factory=list)  # the first idle window, then one after each step

    def reference(self, step: Step) -> float:
        """The idle opt steps/s a step is judged against: its neighbours' where measured (the machine's
        other load drifts over a run by more than the 10% judged), else the first idle window's."""
        return step.reference or self.idle_opt_s

    def kept(self, step: Step) -> bool:
        return step.opt_s >= KEEP * self.reference(step)

    def best(self) -> Step | None:
        """The kept step with the most transitions taken in."""
        kept = [s for s in self.steps if self.kept(s)]
        return max(kept, key=lambda s: s.ingest_s) if kept else None


class RunBench:
    """The bench side of one run: the control PUB (rates), the report PULL (ready), the learner's summaries."""

    def __init__(self, summary_path: Path, procs: list[Proc]) -> None:  # (procs: the list, filled later)
        self.ctx = zmq.Context(io_threads=1)
        self.pub = self.ctx.socket(zmq.PUB)
        self.control = f"tcp://{HOST}:{self.pub.bind_to_random_port(f'tcp://{HOST}')}"
        self.pull = self.ctx.socket(zmq.PULL)
        self.report = f"tcp://{HOST}:{self.pull.bind_to_random_port(f'tcp://{HOST}')}"
        self.summary_path, self.procs = summary_path, procs
        self.rate, self.resend = 0.0, Every(0.2)
        self._mtime = 0
        self.summary: dict[str, Any] = {}

    def close(self) -> None:
        self.pub.close(linger=0)
        self.pull.close(linger=0)
        self.ctx.term()

    def offer(self, rate: float) -> None:
        self.rate = rate
        self.pub.send_json({"rate": rate})

    def tick(self, wait_s: float = 0.05) -> None:
        """Re-broadcast the rate now and then (a late subscriber gets it too), check every process, wait a little."""
        if self.resend():
            self.pub.send_json({"rate": self.rate})
        for proc in self.procs:
            if not proc.alive():
                raise proc.failure(f"{proc.name} exited")
        self.pull.poll(int(wait_s * 1000), zmq.POLLIN)

    def ready(self, processes: int, timeout_s: float) -> float:
        """Wait for every sender process to say all its senders have a model; returns the seconds it took."""
        start, seen = time.monotonic(), set[int]()
        while len(seen) < processes:
            if time.monotonic() - start > timeout_s:
                raise BenchError(f"{len(seen)} of {processes} sender processes ready within {timeout_s:.0f}s")
            self.tick()
            while self.pull.poll(0, zmq.POLLIN):
                report: dict[str, Any] = self.pull.recv_json()  # type: ignore[assignment]
                seen.add(int(report["ready"]))
        return time.monotonic() - start

    def fresh_summary(self, timeout_s: float, accept: Callable[[dict[str, Any]], bool] = lambda s: True
                      ) -> dict[str, Any]:
        """The learner's next summary written from now on that ``accept`` takes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.tick()
            try:
                mtime = os.stat(self.summary_path).st_mtime_ns
            except OSError:
                continue
            if mtime == self._mtime:
                continue
            summary = read_json(self.summary_path)
            if summary is not None:
                self._mtime = mtime
                self.summary = summary
                if accept(summary):
                    return summary
        raise BenchError(f"no fitting learner summary in {self.summary_path} within {timeout_s:.0f}s")

    def window(self, rate: float, settle_s: float, seconds: float) -> Step:
        """Offer ``rate``, let it settle, then the learner's opt steps/s and intake between two summaries."""
        self.offer(rate)
        settle = time.monotonic() + settle_s
        while time.monotonic() < settle:
            self.tick()
        first = self.fresh_summary(30.0)
        t0, cpu0 = time.monotonic(), self.cpu()
        last = self.fresh_summary(seconds + 30.0, lambda s: s["wall_s"] >= first["wall_s"] + seconds)
        t1, cpu1 = time.monotonic(), self.cpu()
        span = last["wall_s"] - first["wall_s"]
        return Step(rate, (last["opt_steps"] - first["opt_steps"]) / span,
                    (last["transitions_inserted"] - first["transitions_inserted"]) / span, span,
                    {k: (cpu1[k] - cpu0[k]) / (t1 - t0) for k in cpu0})

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far: the learner's thread, the learner process, the proxies, the sender processes."""
        out = {"learner thread": 0.0, "learner": 0.0, "proxies": 0.0, "senders": 0.0}
        for proc in self.procs:
            pid, kind = proc.popen.pid, proc.name.split("-")[2]  # fanin-N-learner, fanin-N-proxy-i, fanin-N-send-i
            if kind == "learner":
                out["learner thread"] += cpu_seconds(pid, pid)
                out["learner"] += cpu_seconds(pid)
            else:
                out["proxies" if kind == "proxy" else "senders"] += cpu_seconds(pid)
        return out


def _search(step: Callable[[float], Step], result: Fanin, refine: int) -> None:
    """Offered rates: double from ``RATE0`` until one is not kept (or the intake saturates), then bisect."""
    lo: float | None = None
    hi: float | None = None
    rate = RATE0
    while rate <= RATE_MAX:
        st = step(rate)
        result.steps.append(st)
        if not result.kept(st):
            hi = rate
            break
        lo = rate
        if st.ingest_s < SATURATED * rate:
            break  # the learner took in what it could: more offered is not more taken in
        rate *= 2
    if lo is None:  # not even the first rate: try lower ones
        rate = RATE0
        for _ in range(3):
            rate /= 2
            st = step(rate)
            result.steps.append(st)
            if result.kept(st):
                lo = rate
                break
            hi = rate
    for _ in range(refine):
        if lo is None or hi is None:
            break
        mid = math.sqrt(lo * hi)
        st = step(mid)
        result.steps.append(st)
        lo, hi = (mid, hi) if result.kept(st) else (lo, mid)


def _pool(c: Context, cfg: Any) -> Path:
    """The transitions file the learner prefills from and the senders send (made once per bench run)."""
    path = c.path("fanin-pool.npz")
    if not path.exists():
        prefill_pool(c, cfg, path.name)
    return path


def measure(c: Context, senders: int, proxies: int = PROXIES, processes: int = PROCESSES) -> Fanin:
    """One learner run with ``senders`` senders in ``processes`` processes through ``proxies`` proxies."""
    s = c.settings
    path = c.configs(CONFIG)[0]
    cfg = learner_config(path, *OVERRIDES)
    processes = max(1, min(processes, senders))
    pool = _pool(c, cfg)
    run_dir = c.path(f"fanin-{senders}")
    data, model, evals = free_addr(), free_addr(), free_addr()
    proxy_addrs = [free_addr() for _ in range(proxies)]
    common = {"config": str(path), "overrides": list(OVERRIDES), "pool": str(pool)}
    settle = s.fanin_window_s / 3
    sets = [a for o in (*OVERRIDES, "run.log_level=warning") for a in ("--set", o)]
    with Procs(c.logs) as procs:
        bench = RunBench(run_dir / "summary.json", procs.procs)
        try:
            learner = procs.child(f"fanin-{senders}-learner", learn, {
                **common, "run_dir": str(run_dir), "data": data, "model": model, "eval": evals,
                "out": str(c.path(f"fanin-{senders}-learner.json"))})
            bench.fresh_summary(180.0, lambda x: x["opt_steps"] > 0)  # torch loaded, training on the prefill
            for i, addr in enumerate(proxy_addrs):
                procs.start(f"fanin-{senders}-proxy-{i}", zmqrl_argv(
                    "proxy", str(path), "--bind", addr, "--learner", data, "--models", model, "--name",
                    f"proxy-{i}", *sets))
            split = [senders // processes + (i < senders % processes) for i in range(processes)]
            outs = [c.path(f"fanin-{senders}-send-{i}.json") for i in range(processes)]
            for i, count in enumerate(split):
                procs.child(f"fanin-{senders}-send-{i}", send_many, {
                    **common, "proxies": proxy_addrs, "models": model, "control": bench.control,
                    "report": bench.report, "first": sum(split[:i]), "count": count, "share": count / senders,
                    "n_buffer": cfg.actor.n_buffer, "sndhwm": cfg.actor.send_hwm, "out": str(outs[i]),
                    "timeout_s": 900.0})
            bench.ready(processes, 60.0 + senders * 0.5)
            idle = bench.window(0.0, settle, s.fanin_window_s)
            result = Fanin(senders, proxies, processes, idle.opt_s, idle=idle, idle_windows=[idle])
            result.rss_start = rss_bytes(learner.popen.pid) or 0

            def step(rate: float) -> Step:
                """A window at ``rate`` between two silent ones, judged against their mean."""
                loaded = bench.window(rate, settle, s.fanin_window_s)
                after = bench.window(0.0, settle, s.fanin_window_s)
                loaded.reference = (result.idle_windows[-1].opt_s + after.opt_s) / 2
                result.idle_windows.append(after)
                return loaded

            _search(step, result, s.fanin_refine)
            result.rss_end = rss_bytes(learner.popen.pid) or 0
            result.sockets = open_sockets(learner.popen.pid)
            bench.offer(0.0)
            for proc in procs.procs[::-1]:  # senders first, the learner last: its final summary counts everything
                code = proc.stop(10.0)
                if code != 0:
                    raise proc.failure(f"{proc.name} did not stop cleanly")
        finally:
            bench.close()
    final = read_json(run_dir / "summary.json") or {}
    messages = final.get("messages", {})
    result.actors, result.proxies_seen = len(final.get("actors", {})), len(final.get("proxies", {}))
    result.inserted = int(final.get("transitions_inserted", 0))
    result.batches = int(messages.get("batches_received", 0))
    result.rejected, result.lost = int(messages.get("rejected_total", -1)), int(messages.get("batches_lost", -1))
    result.sent = sum(int((read_json(out) or {}).get("sent", 0)) for out in outs)
    return result


# ------------------------------------------------------------------------------------- rows


def projected(r: Fanin) -> float | None:
    """Transitions/s at which the learner's thread, on a core of its own, would keep ``KEEP`` x its idle
    opt steps/s: from the share of its CPU that went elsewhere than optimising at the busiest window
    (``1 - opt steps per thread CPU-second / idle's``), taken as growing in proportion to the intake."""
    if r.idle is None or not r.steps:
        return None
    busiest = max(r.steps, key=lambda st: st.ingest_s)
    elsewhere = 1.0 - busiest.opt_per_cpu() / r.idle.opt_per_cpu()
    return busiest.ingest_s * (1.0 - KEEP) / elsewhere if elsewhere > 0.02 else None


def _detail(r: Fanin, n_buffer: int) -> str:
    idle = r.idle or Step(0.0, r.idle_opt_s, 0.0, 0.0)
    steps = "; ".join(f"{st.offered / 1000:,.1f}k -> {st.ingest_s:,.0f} at {st.opt_s / r.reference(st):.2f}x "
                      f"(thread {st.cpu.get('learner thread', 0):.2f} core, "
                      f"{st.opt_per_cpu() / idle.opt_per_cpu():.2f}x per thread CPU-s)" for st in r.steps)
    busiest = max(r.steps, key=lambda st: st.ingest_s) if r.steps else idle
    cpu = ", ".join(f"{k} {v:.2f}" for k, v in busiest.cpu.items())
    ahead = projected(r)
    silent = sorted(w.opt_s for w in r.idle_windows) or [r.idle_opt_s]
    return (f"idle {r.idle_opt_s:,.0f} opt steps/s (senders connected, silent; learner thread "
            f"{idle.cpu.get('learner thread', 0):.2f} core; {len(silent)} silent windows {silent[0]:,.0f}-"
            f"{silent[-1]:,.0f}); offered/s -> taken in/s at opt steps/s vs the mean of the silent windows just "
            f"before and after (per thread CPU-s: vs the first): {steps}; "
            f"cores used at {busiest.offered:,.0f} offered: {cpu}"
            + (f"; the learner thread, on a core of its own, would keep {KEEP:g}x up to ~{ahead:,.0f} transitions/s "
               f"(projected from its CPU per opt step)" if ahead else "")
            + f"; {r.batches:,} batches of {n_buffer} in replay from {r.actors} senders via {r.proxies_seen} "
              f"proxies, {r.rejected} rejected, {r.lost} lost")


def rows(c: Context, results: list[Fanin]) -> list[Row]:
    """A row per run (the first judged against ``GOAL_RATE``, the others against the first), and the
    learner's memory over the largest run's offered rates."""
    path = c.configs(CONFIG)[0]
    n_buffer = learner_config(path).actor.n_buffer
    out: list[Row] = []
    first: float | None = None
    for i, r in enumerate(results):
        best = r.best()
        fallback = min(r.steps, key=lambda st: st.offered) if r.steps else None
        measured = best.ingest_s if best is not None else fallback.ingest_s if fallback is not None else None
        setup = (f"{path.name}, rate limiter off ({LIMITER_OFF}): the real Learner in its own process (replay "
                 f"prefilled), {r.proxies} `zmqrl proxy` processes, {r.senders} senders in {r.processes} processes "
                 f"(each its own PUSH to a proxy, SUB on the learner's models, name and incarnation) sending "
                 f"pre-encoded {n_buffer}-transition batches; {os.cpu_count()} CPUs for all of it")
        if best is not None:
            what = (f"most transitions/s the learner took in (its own count) at >= {KEEP:g}x its idle opt steps/s: "
                    f"{best.ingest_s:,.0f} at {best.offered:,.0f} offered")
        else:
            what = (f"at no offered rate did the learner keep {KEEP:g}x its idle opt steps/s; the figure is what it "
                    f"took in at the lowest rate offered, not a kept rate")
        note = f"{what}. {setup}. {_detail(r, n_buffer)}"
        if i == 0:
            out.append(make_row(f"fanin_{r.senders}_senders", measured, GOAL_RATE, "transitions/s",
                                f"vs the goal of {GOAL_RATE:,.0f}/s: {note}", (">=", 1.0), complete=best is not None))
            first = measured
        else:
            out.append(make_row(f"fanin_{r.senders}_senders", measured, first, "transitions/s",
                                f"vs the {results[0].senders}-sender row: {note}"))
    if results:
        r = max(results, key=lambda x: x.senders)
        mib = 2**20
        out.append(make_row(
            f"fanin_{r.senders}_senders_rss", r.rss_end / mib, r.rss_start / mib, "MiB",
            f"learner VmRSS at the end of the {r.senders}-sender run's offered rates vs at their start "
            f"({sum(st.seconds for st in r.steps):.0f}s of windows, {r.batches:,} batches taken in); it then held "
            f"{r.sockets} sockets ({r.senders} model subscribers, {r.proxies} proxy links, its 3 listeners) and "
            f"accounted {r.actors} senders", ("<=", 1.05)))
    return out


def intake_row(c: Context, bundled: bool = False) -> Row:
    """The learner thread's CPU per batch taken in, against what the goal leaves it: at ``GOAL_RATE``
    transitions/s of ``actor.n_buffer``-transition batches, taking them in may cost the thread at most
    ``1 - KEEP`` of its time (the rest is for optimising). ``bundled``: the batches come joined as each
    of ``PROXIES`` proxies joins them at that rate (what it reads in one ``net.proxy_hold_ms``)."""
    path = c.configs(CONFIG)[0]
    cfg = learner_config(path, *OVERRIDES)
    n_buffer, batches = cfg.actor.n_buffer, c.settings.intake_batches
    hold_s = cfg.net.proxy_hold_ms / 1000.0
    bundle = max(2, round(GOAL_RATE / n_buffer / PROXIES * hold_s)) if bundled else 1
    name = "fanin_intake_us_per_batch" if bundle == 1 else "fanin_intake_bundled_us_per_batch"
    out = c.path(f"{name}.json")
    with Procs(c.logs) as procs:
        proc = procs.child(f"fanin-intake-{bundle}-learner", intake, {
            "config": str(path), "overrides": list(OVERRIDES), "pool": str(_pool(c, cfg)),
            "run_dir": str(c.path(f"fanin-intake-{bundle}")), "batches": batches, "senders": INTAKE_SENDERS,
            "bundle": bundle, "out": str(out)})
        result = child_result(proc, out, 300.0)
    taken, expected = int(result["batches"]), INTAKE_PASSES * batches
    if taken != expected or result["rejected"]:
        raise BenchError(f"the intake helper took in {taken} of {expected} batches, {result['rejected']} rejected")
    passes = sorted(1e6 * x for x in result["per_batch_s"])
    budget = 1e6 * (1.0 - KEEP) * n_buffer / GOAL_RATE
    how = ("each its own message, as actors send them" if bundle == 1 else
           f"joined {bundle} to a message as a proxy sends them (what each of {PROXIES} proxies reads per "
           f"{hold_s * 1000:g} ms hold at the goal's rate)")
    return make_row(
        name, passes[len(passes) // 2], budget, "us",
        f"the learner thread's CPU per {n_buffer}-transition batch from its data socket into replay (receive, "
        f"decode, header and batch checks, sequence, insert, accounting), median of {len(passes)} passes of "
        f"{batches} queued batches from {result['actors']} senders with actors' meta, {how} (passes "
        f"{passes[0]:.1f}-{passes[-1]:.1f} us); the budget: at the goal's {GOAL_RATE:,.0f} transitions/s in "
        f"{n_buffer}-transition batches ({GOAL_RATE / n_buffer:,.0f}/s), taking them in may use {1 - KEEP:.0%} of "
        f"the learner's thread; {path.name}", ("<=", 1.0))


def run(c: Context) -> list[Row]:
    """The learner's intake cost (batches as actors send them, then as proxies join them), then one
    learner run per sender count in ``settings.fanin``."""
    return [intake_row(c), intake_row(c, bundled=True), *rows(c, [measure(c, n) for n in c.settings.fanin])]
