"""``zmqrl soak``: run a distributed job for a while and watch every role's memory.

The job is exactly what ``zmqrl local`` starts (learner, proxy, N actors, evaluator), kept
training for the whole soak (``trainer.stop_return=null`` and an unreachable ``max_opts``).
Every ``--interval-s`` seconds each role's resident set size (``VmRSS`` in ``/proc/PID/status``,
summed over the role process and any children of it) is sampled. At the end the job is stopped
with SIGTERM and a table shows, per role, RSS after the warm-up and at the end, the growth in MB
and MB/min, and a least-squares slope over the post-warm-up samples. Everything, samples
included, goes to ``RUN_DIR/soak.json``. The exit code is non-zero when the job died (or did not
stop cleanly), so the command can gate a CI job.

    zmqrl soak configs/cartpole_dqn.yaml --minutes 10 --actors 2

With ``--hostile`` (CartPole-v1) the soak also proves that one message never crashes, corrupts or ends
a run. Once the learner trains, a quiet phase (``--quiet-s``, default a third of ``--minutes``, at
least 30 s) measures the honest actors' intake (transitions the learner took in from ``actor-*`` per
second, from ``summary.json``, on the learner's own clock) and its opt steps/s; then the hostile client
(:mod:`zmqrl.bench.hostile`, its own process at the lowest CPU priority) sends every kind of bad message
for the rest of ``--minutes``, which count from the first optimisation step. The report adds, per attack
kind, the messages sent; what the learner and the proxy refused, by reason; each role alive or not at the
end, with any exit code, the attack then under way and the exception its log names; memory growth over
the hostile phase; the honest intake and opt steps/s the hostile phase kept (its rate over the quiet
phase's); and the learner's stop reason before the soak stopped it (it must still be empty). All of it
goes to ``soak.json`` under ``hostile``. Only a role that died, or a job that did not stop cleanly (or
never trained), makes the exit code non-zero: the other figures are reported, not judged.

    zmqrl soak configs/cartpole_dqn.yaml --hostile --minutes 10 --actors 2

The job runs with ``trainer.stop_return=null`` like any soak, so an evaluation cannot end it unless
``--set trainer.stop_return=...`` asks for that (an honest one of 500 then ends it too); the report says
how many evaluations the learner recorded against how many the evaluator sent, and how many were for
model versions the learner never published.

The launcher is started and stopped as the bench's processes are (:mod:`zmqrl.bench.harness`,
built on the local launcher's own :class:`~zmqrl.roles.launch.supervisor.Role`). This module never imports
torch: the sampler stays small.
"""

from __future__ import annotations

import argparse
import math
import re
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from zmqrl.bench.harness import Proc, alive, children, cmdline, descendants, kill_pids, read_text, zmqrl_argv
from zmqrl.run.rundir import read_json, write_json_atomic

MAX_OPTS = 1_000_000_000  # "never" for a soak: the job runs until the soak stops it
STOP_GRACE_S = 60.0  # the launcher's own grace (a few seconds per role) plus the learner's final save
ROLE_WAIT_S = 60.0  # how long the roles may take to appear under the launcher


HELP = "Run a distributed job for a while and report every role's memory growth."


# --- /proc -------------------------------------------------------------------------------------

def status_kb(pid: int, key: str = "VmRSS") -> int | None:
    """A ``kB`` field of ``/proc/PID/status`` (VmRSS, RssAnon, ...), or None when gone."""
    text = read_text(f"/proc/{pid}/status")
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return None


def role_name(argv: list[str]) -> str | None:
    """``learner``, ``proxy``, ``actor-3``, ``evaluator`` from a ``python -m zmqrl.cli ROLE ...`` command line."""
    try:
        role = argv[argv.index("zmqrl.cli") + 1]
    except (ValueError, IndexError):
        return None
    if role == "actor" and "--id" in argv[:-1]:
        return f"actor-{argv[argv.index('--id') + 1]}"
    if role == "proxy" and "--name" in argv[:-1]:
        return argv[argv.index("--name") + 1]
    return role


def find_roles(launcher: int) -> dict[str, int]:
    """``{role: pid}`` for the role processes the local launcher started.

    A child still between fork and exec carries the launcher's own command line: it is skipped.
    """
    own = cmdline(launcher)
    roles = {}
    for pid in children(launcher):
        argv = cmdline(pid)
        name = role_name(argv)
        if name is not None and argv != own and alive(pid):
            roles[name] = pid
    return roles


def rss_mb(pid: int, key: str = "VmRSS") -> float | None:
    """``key`` of ``pid`` plus all its descendants, in MB (2**20 bytes); None when ``pid`` is gone."""
    own = status_kb(pid, key)
    if own is None:
        return None
    total = own + sum(status_kb(p, key) or 0 for p in descendants(pid))
    return total / 1024.0


# --- numbers --------------------------------------------------------------------------------------

def slope_per_min(ts: list[float], ys: list[float]) -> float:
    """Least-squares slope of ``ys`` over ``ts`` (seconds), per minute; nan with fewer than 2 distinct times."""
    n = len(ts)
    if n < 2:
        return math.nan
    mt, my = sum(ts) / n, sum(ys) / n
    var = sum((t - mt) ** 2 for t in ts)
    if var <= 0:
        return math.nan
    return 60.0 * sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / var


def growth_table(samples: list[dict[str, Any]], roles: Iterable[str], warmup_s: float) -> list[dict[str, Any]]:
    """One row per role: RSS at the first sample after ``warmup_s`` and at the last, growth, MB/min, slope."""
    rows = []
    for role in roles:
        points = [(s["t"], s["rss_mb"][role]) for s in samples if s["rss_mb"].get(role) is not None]
        after = [(t, y) for t, y in points if t >= warmup_s] or points[-1:]
        row: dict[str, Any] = {"role": role, "samples": len(points)}
        if not after:
            row.update(start_mb=None, end_mb=None, peak_mb=None, growth_mb=None, mb_per_min=None,
                       slope_mb_per_min=None, window_s=0.0)
            rows.append(row)
            continue
        (t0, y0), (t1, y1) = after[0], after[-1]
        window = t1 - t0
        growth = y1 - y0
        row.update(start_t=round(t0, 1), start_mb=round(y0, 2), end_mb=round(y1, 2),
                   peak_mb=round(max(y for _, y in points), 2), growth_mb=round(growth, 2),
                   mb_per_min=round(60.0 * growth / window, 3) if window > 0 else math.nan,
                   slope_mb_per_min=round(slope_per_min([t for t, _ in after], [y for _, y in after]), 3),
                   window_s=round(window, 1))
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The growth table as aligned text."""
    def num(v: Any, fmt: str) -> str:
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    head = f"{'role':<12}{'start MB':>10}{'end MB':>10}{'peak MB':>10}{'growth MB':>11}{'MB/min':>9}" \
           f"{'slope MB/min':>14}{'samples':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['role']:<12}{num(r['start_mb'], '.1f'):>10}{num(r['end_mb'], '.1f'):>10}"
                     f"{num(r['peak_mb'], '.1f'):>10}{num(r['growth_mb'], '+.1f'):>11}"
                     f"{num(r['mb_per_min'], '+.2f'):>9}{num(r['slope_mb_per_min'], '+.2f'):>14}{r['samples']:>9}")
    return "\n".join(lines)


def default_warmup_s(duration_s: float) -> float:
    """20% of the run, but at least 30 s, and never more than half of it."""
    return min(max(0.2 * duration_s, 30.0), 0.5 * duration_s)


# --- the soak -------------------------------------------------------------------------------------

def launcher_argv(config: str | None, actors: int, run_dir: Path, overrides: list[str],
                  evaluator: bool = True) -> list[str]:
    """``python -m zmqrl.cli local ...`` that trains for ever (the user's ``--set`` come last and win)."""
    sets = ["trainer.stop_return=null", f"trainer.max_opts={MAX_OPTS}", "trainer.max_seconds=0", *overrides]
    argv = zmqrl_argv("local", *([config] if config else []), "--actors", str(actors), "--run-dir", str(run_dir),
                      *[a for s in sets for a in ("--set", s)])
    argv.append("--fail-fast")  # a role that dies is the finding: the launcher must not restart it
    return argv + ([] if evaluator else ["--no-evaluator"])


class Soak:
    """One soak: start the job, sample, stop, report."""

    def __init__(self, argv: list[str], run_dir: Path, expected: list[str], duration_s: float, interval_s: float,
                 warmup_s: float, echo: Callable[[str], None] = print) -> None:
        self.argv, self.run_dir, self.expected = argv, run_dir, expected
        self.duration_s, self.interval_s, self.warmup_s = duration_s, interval_s, warmup_s
        self.echo = echo
        self.samples: list[dict[str, Any]] = []
        self.pids: dict[str, int] = {}
        self.events: list[str] = []
        self.proc: Proc | None = None  # the launcher
        self.died = False
        self.stop_rc: int | None = None
        self.interrupted = False
        self.started = 0.0

    def _event(self, text: str) -> None:
        t = time.monotonic() - self.started
        self.events.append(f"{t:.1f}s {text}")
        self.echo(f"soak: {text}")

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.interrupted = True

    def _wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` unless the job exits or we are interrupted; True when the job exited."""
        assert self.proc is not None
        deadline = time.monotonic() + seconds
        while not self.interrupted:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self.proc.wait(min(left, 0.2)) is not None:
                return True
        return False

    def sample(self) -> None:
        assert self.proc is not None
        found = find_roles(self.proc.popen.pid)
        for name, pid in found.items():
            for other in [n for n, p in self.pids.items() if p == pid and n != name]:
                del self.pids[other]  # seen under an earlier name (e.g. mid-exec): one pid, one role
            old = self.pids.get(name)
            if old is None:
                self.pids[name] = pid
            elif old != pid:
                self._event(f"{name} restarted: pid {old} -> {pid}")
                self.pids[name] = pid
        rss: dict[str, float | None] = {}
        anon: dict[str, float | None] = {}
        for name in sorted(set(self.pids) | set(found)):
            pid = self.pids[name]
            rss[name] = rss_mb(pid)
            anon[name] = rss_mb(pid, "RssAnon")
        own = status_kb(self.proc.popen.pid, "VmRSS")  # the launcher alone, not its children (the roles)
        rss["launcher"] = None if own is None else own / 1024.0
        self.samples.append({"t": round(time.monotonic() - self.started, 2), "wall": time.time(),
                             "rss_mb": rss, "anon_mb": anon})

    def run(self) -> int:
        """Start, sample for the duration, stop, write soak.json; returns the exit code."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        log_path = self.run_dir / "soak-launcher.log"
        try:
            self.started = time.monotonic()
            self.proc = Proc("soak-launcher", self.argv, self.run_dir)
            self._event(f"started zmqrl local (pid {self.proc.popen.pid}); roles' logs in {self.run_dir / 'logs'}")
            try:
                self._loop()
            finally:
                self._stop()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        return self._report(log_path)

    def _loop(self) -> None:
        assert self.proc is not None
        deadline = self.started + ROLE_WAIT_S
        while not self.interrupted and not set(self.expected) <= set(find_roles(self.proc.popen.pid)):
            if self._wait(0.2):
                break
            if time.monotonic() > deadline:
                self._event(f"roles {sorted(set(self.expected) - set(find_roles(self.proc.popen.pid)))} did not "
                            f"appear within {ROLE_WAIT_S:.0f}s")
                break
        next_sample = time.monotonic()
        while not self.interrupted:
            if not self.proc.alive():
                self.died = True
                self._event(f"the job exited by itself with code {self.proc.returncode}")
                return
            gone = [n for n, p in self.pids.items() if not alive(p)]
            if gone:
                self.died = True
                self._event(f"role(s) {', '.join(sorted(gone))} exited")
                return
            self.sample()
            self._tick()
            now, end = time.monotonic(), self._end()
            if now >= end:
                return
            next_sample = max(next_sample + self.interval_s, now)
            self._wait(min(next_sample, end) - now)
        self._event("interrupted: stopping the job")

    def _end(self) -> float:
        """When sampling ends (monotonic)."""
        return self.started + self.duration_s

    def _tick(self) -> None:
        """After each sample (a hook for :class:`HostileSoak`)."""

    def _before_stop(self) -> None:
        """Before the job is stopped (a hook for :class:`HostileSoak`)."""

    def _stop(self) -> None:
        """SIGTERM the launcher (it stops every role), SIGKILL it if it overstays, then any role left over."""
        if self.proc is None:
            return
        self._before_stop()
        family = descendants(self.proc.popen.pid)  # before the stop: orphans are reparented
        if self.proc.alive():
            self.stop_rc = self.proc.stop(STOP_GRACE_S)
            if self.stop_rc == -signal.SIGKILL:
                self._event(f"the job did not stop within {STOP_GRACE_S:.0f}s of SIGTERM; killed it")
                self.stop_rc = None
        leftovers = sorted({p for p in [*family, *self.pids.values()] if alive(p)})
        kill_pids(leftovers, grace_s=0.0)
        if leftovers:
            self._event(f"killed leftover process(es) {leftovers}")

    def _report(self, log_path: Path) -> int:
        names = [n for n in self.expected if n in self.pids] + sorted(set(self.pids) - set(self.expected))
        rows = growth_table(self.samples, [*names, "launcher"], self.warmup_s)
        summary = read_json(self.run_dir / "summary.json")
        clean = not self.died and self.stop_rc == 0
        missing = sorted(set(self.expected) - set(self.pids))
        job: dict[str, Any] = {k: summary.get(k) for k in ("opt_steps", "env_steps", "wall_s", "model_version",
                                                           "best_eval_return", "stop_reason", "messages")} \
            if summary else {}
        result = {
            "argv": self.argv, "run_dir": str(self.run_dir), "duration_s": self.duration_s,
            "interval_s": self.interval_s, "warmup_s": self.warmup_s, "expected_roles": self.expected,
            "pids": self.pids, "missing_roles": missing, "died": self.died, "interrupted": self.interrupted,
            "stop_exit_code": self.stop_rc, "ok": clean and not missing, "events": self.events,
            "job": job or None,
            "table": rows, "samples": self.samples,
        }
        failed = self._extend(result)
        write_json_atomic(self.run_dir / "soak.json", result)
        self.echo(f"\nsoak: {len(self.samples)} samples over {self.samples[-1]['t'] if self.samples else 0:.0f}s "
                  f"(every {self.interval_s:g}s; growth measured after a {self.warmup_s:.0f}s warm-up); "
                  f"job: {job.get('opt_steps')} opt steps, {job.get('env_steps')} env steps")
        self.echo(format_table(rows))
        self._print_more(result)
        self.echo(f"soak: samples and table in {self.run_dir / 'soak.json'}")
        if failed:
            self.echo(f"soak: {failed}")
            return 1
        if self.died or missing:
            self.echo(f"soak: the job failed ({'; '.join(self.events[-3:])}); launcher log {log_path}, "
                      f"roles' logs in {self.run_dir / 'logs'}")
            return 1
        if self.stop_rc != 0:
            self.echo(f"soak: the job did not stop cleanly (exit code {self.stop_rc}); see {log_path}")
            return 1
        return 0

    def _extend(self, result: dict[str, Any]) -> str:
        """Add to soak.json's ``result`` (a hook for :class:`HostileSoak`); a non-empty return is why the
        soak failed."""
        return ""

    def _print_more(self, result: dict[str, Any]) -> None:
        """Print more after the memory table (a hook for :class:`HostileSoak`)."""


# --- the hostile soak -----------------------------------------------------------------------------

HOSTILE_FILE = "hostile.json"  # the hostile client's counts, in the run directory
TRAIN_WAIT_S = 180.0  # how long the learner may take to start training once the roles are up
MIN_QUIET_S = 30.0
MIN_HOSTILE_S = 10.0
EXCEPTION_LINE = re.compile(r"^\w+(\.\w+)*(Error|Exception|Interrupt)\b.*")


def default_quiet_s(duration_s: float) -> float:
    """The quiet phase: a third of the soak, at least 30 s."""
    return max(duration_s / 3.0, MIN_QUIET_S)


def learner_sample(t: float, summary: dict[str, Any]) -> dict[str, Any] | None:
    """What the throughput figures need from one ``summary.json``: the learner's clock and counters, and
    per honest actor (``actor-*``) the transitions it took in and the env steps the actor reports."""
    wall = summary.get("wall_s")
    if not isinstance(wall, (int, float)):
        return None
    actors = summary.get("actors")
    if not isinstance(actors, dict):
        actors = {}
    honest = {n: a for n, a in actors.items() if n.startswith("actor-") and isinstance(a, dict)}
    return {"t": round(t, 2), "wall_s": float(wall), "opt_steps": summary.get("opt_steps") or 0,
            "env_steps": summary.get("env_steps"), "model_version": summary.get("model_version"),
            "stop_reason": summary.get("stop_reason") or "",
            "transitions": {n: a.get("transitions") or 0 for n, a in honest.items()},
            "actor_env_steps": {n: a.get("env_steps") or 0 for n, a in honest.items()}}


def rates(samples: list[dict[str, Any]], t0: float, t1: float) -> dict[str, Any] | None:
    """Honest transitions/s (per actor and in all) and opt steps/s between the first and last learner
    samples taken in ``[t0, t1]``, timed by the learner's own clock; None with fewer than two."""
    window = [s for s in samples if t0 <= s["t"] <= t1]
    if len(window) < 2 or window[-1]["wall_s"] <= window[0]["wall_s"]:
        return None
    a, b = window[0], window[-1]
    dt = b["wall_s"] - a["wall_s"]
    names = sorted(set(a["transitions"]) | set(b["transitions"]))
    actors = {n: round(max(0, b["transitions"].get(n, 0) - a["transitions"].get(n, 0)) / dt, 2) for n in names}
    return {"from_t": a["t"], "to_t": b["t"], "seconds": round(dt, 2), "actors": actors,
            "all": round(sum(actors.values()), 2), "opt_steps_per_s": round((b["opt_steps"] - a["opt_steps"]) / dt, 2)}


def kept(before: float | None, after: float | None) -> float | None:
    """``after / before`` (what the hostile phase kept of the quiet phase's figure); None if not measurable."""
    if before is None or after is None or before <= 0:
        return None
    return round(after / before, 3)


def kind_at(timeline: list[list[Any]], wall: float) -> str | None:
    """The attack kind whose turn covered Unix time ``wall`` (None before the first turn)."""
    current = None
    for started, kind in timeline:
        if started > wall:
            break
        current = kind
    return current


def error_line(path: Path) -> str | None:
    """The last line of a log that names an exception (``ValueError: ...``), if any."""
    text = read_text(str(path))
    if not text:
        return None
    found = [line for line in text.splitlines() if EXCEPTION_LINE.match(line.strip())]
    return found[-1].strip()[:300] if found else None


class HostileSoak(Soak):
    """The soak with a hostile client: once the learner trains, ``quiet_s`` seconds measure the honest
    actors' intake alone; then :mod:`zmqrl.bench.hostile` attacks for the rest of ``duration_s``."""

    def __init__(self, argv: list[str], run_dir: Path, expected: list[str], duration_s: float, interval_s: float,
                 quiet_s: float, hostile_argv: list[str], echo: Callable[[str], None] = print) -> None:
        super().__init__(argv, run_dir, expected, duration_s, interval_s, warmup_s=0.0, echo=echo)
        self.quiet_s, self.hostile_argv = quiet_s, hostile_argv
        self.hostile: Proc | None = None
        self.hostile_rc: int | None = None
        self.learner: list[dict[str, Any]] = []  # learner samples (see learner_sample)
        self.train_t: float | None = None  # soak times (s since the launcher started)
        self.hostile_t: float | None = None
        self.end_t: float | None = None
        self.alive_at_end: dict[str, bool] = {}

    def _t(self) -> float:
        return time.monotonic() - self.started

    def _tick(self) -> None:
        t = self._t()
        summary = read_json(self.run_dir / "summary.json")
        sample = learner_sample(t, summary) if summary else None
        if sample is not None:
            self.learner.append(sample)
            if self.train_t is None and sample["opt_steps"] > 0:
                self.train_t = t
                self._event(f"the learner trains: {self.quiet_s:.0f}s of quiet phase")
        if self.train_t is not None and self.hostile_t is None and t >= self.train_t + self.quiet_s:
            seconds = self.duration_s - self.quiet_s
            self.hostile = Proc("hostile", [*self.hostile_argv, "--seconds", f"{seconds:g}"], self.run_dir)
            self.hostile_t = self.warmup_s = t  # memory growth is measured over the hostile phase
            self._event(f"hostile phase: {seconds:.0f}s of attacks (pid {self.hostile.popen.pid}, log "
                        f"{self.hostile.log_path})")

    def _end(self) -> float:
        if self.train_t is None:
            return self.started + ROLE_WAIT_S + TRAIN_WAIT_S
        return self.started + self.train_t + self.duration_s

    def _before_stop(self) -> None:
        self.end_t = self._t()
        self.alive_at_end = {name: alive(pid) for name, pid in self.pids.items()}
        if self.train_t is None and not (self.died or self.interrupted):
            self._event(f"the learner did not start training within {ROLE_WAIT_S + TRAIN_WAIT_S:.0f}s")
        if self.hostile is not None:
            self.hostile_rc = self.hostile.stop(10.0) if self.hostile.alive() else self.hostile.returncode

    # --- the report
    def _roles(self, timeline: list[list[Any]]) -> dict[str, dict[str, Any]]:
        """Per role: alive at the end of the soak (before the stop), its exits (code, soak time, the attack
        kind then under way) and the last exception its log names."""
        status = read_json(self.run_dir / "supervisor" / "local.json") or {}
        known = status.get("roles")
        if not isinstance(known, dict):
            known = {}
        wall0 = time.time() - self._t()  # the soak's time 0 as a Unix time
        out: dict[str, dict[str, Any]] = {}
        for name in [*self.expected, *sorted(set(known) - set(self.expected))]:
            info = known.get(name) or {}
            exits = [{"exit": e.get("exit"), "t": round(e["time"] - wall0, 1), "kind": kind_at(timeline, e["time"])}
                     for e in info.get("exits") or [] if isinstance(e.get("time"), (int, float))]
            out[name] = {"alive_at_end": self.alive_at_end.get(name, False), "exits": exits,
                         "error": error_line(self.run_dir / "logs" / f"{name}.log")}
        return out

    def _refused(self, summary: dict[str, Any]) -> dict[str, Any]:
        """What the learner and the proxy refused, by reason (the proxy's own file once it stopped, else what
        it last reported to the learner)."""
        messages = summary.get("messages") or {}
        learner = {"rejected": messages.get("rejected") or {}, "rejected_total": messages.get("rejected_total"),
                   "peers_refused": messages.get("peers_refused"), "dropped_old": messages.get("batches_dropped_old"),
                   "lost": messages.get("batches_lost"), "priorities": summary.get("priorities") or {}}
        proxy = read_json(self.run_dir / "roles" / "proxy.json") or (summary.get("proxies") or {}).get("proxy") or {}
        return {"learner": learner, "proxy": {"rejected": proxy.get("rejected") or {},
                                              "rejected_total": proxy.get("rejected_total"),
                                              "peers_refused": proxy.get("peers_refused")}}

    def _extend(self, result: dict[str, Any]) -> str:
        client = read_json(self.run_dir / HOSTILE_FILE) or {}
        timeline = client.get("timeline") or []
        summary = read_json(self.run_dir / "summary.json") or {}
        last = self.learner[-1] if self.learner else {}
        end_t = self.end_t if self.end_t is not None else self._t()
        quiet = hostile = None
        if self.train_t is not None:
            settle = 0.2 * self.quiet_s  # the first part of the quiet phase: replay warming, actors starting
            quiet = rates(self.learner, self.train_t + settle, self.hostile_t if self.hostile_t is not None else end_t)
        if self.hostile_t is not None:
            hostile = rates(self.learner, self.hostile_t, end_t)
        q_actors = (quiet or {}).get("actors", {})
        h_actors = (hostile or {}).get("actors", {})
        evals = [e for e in summary.get("evals") or [] if isinstance(e, dict)]
        evaluated = (read_json(self.run_dir / "roles" / "evaluator.json") or {}).get("evaluated")
        published = summary.get("model_version") if isinstance(summary.get("model_version"), int) else None
        result["hostile"] = {
            "quiet_s": self.quiet_s, "hostile_s": self.duration_s - self.quiet_s, "train_t": self.train_t,
            "hostile_t": self.hostile_t, "end_t": round(end_t, 1), "client_exit_code": self.hostile_rc,
            "client": {k: client.get(k) for k in ("rate", "slot_s", "many_frames", "seconds", "finished")},
            "order": client.get("order") or [], "kinds": client.get("kinds") or {},
            "refused": self._refused(summary),
            "roles": self._roles(timeline),
            "throughput": {"quiet": quiet, "hostile": hostile, "kept": {
                "actors": {n: kept(q_actors.get(n), h_actors.get(n)) for n in sorted(set(q_actors) | set(h_actors))},
                "all": kept((quiet or {}).get("all"), (hostile or {}).get("all")),
                "opt_steps_per_s": kept((quiet or {}).get("opt_steps_per_s"), (hostile or {}).get("opt_steps_per_s"))}},
            "stop_reason_before_stop": last.get("stop_reason"),
            "evaluations": {"recorded": len(evals), "evaluator_sent": evaluated,
                            "best_eval_return": summary.get("best_eval_return"),
                            "model_version": published,
                            "at_unpublished_versions": None if published is None else sum(
                                1 for e in evals if isinstance(e.get("version"), int) and e["version"] > published)},
            "env_steps": {"learner": last.get("env_steps"),
                          "honest_actors_report": sum((last.get("actor_env_steps") or {}).values())},
            "quiet_table": growth_table([s for s in self.samples if s["t"] <= (self.hostile_t or end_t)],
                                        [*self.expected, "launcher"], self.train_t or 0.0),
            "learner_samples": self.learner,
        }
        if self.hostile_t is None and not (self.died or self.interrupted):
            return "the hostile phase never began (the learner did not train); see the roles' logs"
        return ""

    def _print_more(self, result: dict[str, Any]) -> None:
        self.echo(format_hostile(result["hostile"]))


def _num(value: Any, fmt: str = ".1f") -> str:
    return "-" if not isinstance(value, (int, float)) or isinstance(value, bool) else format(value, fmt)


def _reasons(counts: dict[str, Any]) -> str:
    items = [f"{k} {v}" for k, v in sorted(counts.items()) if v]
    return ", ".join(items) or "none"


def format_hostile(h: dict[str, Any]) -> str:
    """The hostile soak's report as text: attacks sent, refusals, roles, throughput kept, stop reason."""
    client = h["client"]
    lines = [f"\nhostile: quiet phase from {_num(h['train_t'], '.0f')}s, attacks from "
             f"{_num(h['hostile_t'], '.0f')}s to {_num(h['end_t'], '.0f')}s ({_num(client.get('rate'), 'g')} msg/s, "
             f"{_num(client.get('slot_s'), 'g')}s per kind per turn; client exit code {h['client_exit_code']})",
             f"{'attack kind':<16}{'sent':>9}{'unsent':>9}{'errors':>8}  targets", "-" * 72]
    for kind in [*h["order"], *sorted(set(h["kinds"]) - set(h["order"]))]:
        c = h["kinds"].get(kind) or {}
        targets = ", ".join(f"{t} {n}" for t, n in sorted((c.get("targets") or {}).items()))
        lines.append(f"{kind:<16}{c.get('sent', 0):>9}{c.get('unsent', 0):>9}{c.get('errors', 0):>8}  {targets}"
                     + (f"  [{c['last_error'][:60]}]" if c.get("last_error") else ""))
    learner, proxy = h["refused"]["learner"], h["refused"]["proxy"]
    lines.append(f"refused by the learner: {_reasons(learner['rejected'])} (total {learner['rejected_total']}); "
                 f"peers refused {learner['peers_refused']}, dropped as old {learner['dropped_old']}, "
                 f"lost {learner['lost']}; priorities {_reasons(learner['priorities'])}")
    lines.append(f"refused by the proxy: {_reasons(proxy['rejected'])} (total {proxy['rejected_total']}); "
                 f"peers refused {proxy['peers_refused']}")
    def state(r: dict[str, Any]) -> str:
        if r["alive_at_end"]:
            return "alive"
        return f"exited {r['exits'][-1]['exit']}" if r["exits"] else "gone"

    lines.append("roles at the end of the attacks: " + ", ".join(f"{n} {state(r)}" for n, r in h["roles"].items()))
    for name, r in h["roles"].items():
        for e in r["exits"]:
            if e["exit"] != 0:
                lines.append(f"  {name} exited {e['exit']} at {e['t']}s"
                             + (f" during {e['kind']}" if e["kind"] else "")
                             + (f": {r['error']}" if r["error"] else ""))
    tp = h["throughput"]
    quiet, hostile = tp["quiet"] or {}, tp["hostile"] or {}
    lines.append(f"{'honest intake (transitions/s)':<34}{'quiet':>10}{'hostile':>10}{'kept':>8}")
    for name, k in tp["kept"]["actors"].items():
        lines.append(f"  {name:<32}{_num(quiet.get('actors', {}).get(name)):>10}"
                     f"{_num(hostile.get('actors', {}).get(name)):>10}{_num(k, '.2f'):>8}")
    lines.append(f"  {'all':<32}{_num(quiet.get('all')):>10}{_num(hostile.get('all')):>10}"
                 f"{_num(tp['kept']['all'], '.2f'):>8}")
    lines.append(f"{'learner opt steps/s':<34}{_num(quiet.get('opt_steps_per_s')):>10}"
                 f"{_num(hostile.get('opt_steps_per_s')):>10}{_num(tp['kept']['opt_steps_per_s'], '.2f'):>8}")
    ev = h["evaluations"]
    reason = h["stop_reason_before_stop"]
    lines.append(f"stop reason at the end of the attacks: {reason!r}" + ("" if reason else " (still running)")
                 + f"; evaluations the learner recorded {ev['recorded']} (the evaluator sent {ev['evaluator_sent']}; "
                 f"{ev['at_unpublished_versions']} for versions never published, the last being "
                 f"{ev['model_version']}), best return {ev['best_eval_return']}")
    lines.append(f"env steps: the learner counts {h['env_steps']['learner']}, the honest actors report "
                 f"{h['env_steps']['honest_actors_report']}")
    lines.append("memory below: growth over the hostile phase")
    return "\n".join(lines)


# --- command line ---------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML config file")
    p.add_argument("--minutes", type=float, required=True, help="how long to run the job")
    p.add_argument("--actors", type=int, default=2, help="number of actor processes (default 2)")
    p.add_argument("--run-dir", help="run directory (default runs/soak-<name>-<time>)")
    p.add_argument("--interval-s", type=float, default=5.0, help="seconds between memory samples (default 5)")
    p.add_argument("--warmup-s", type=float, default=None,
                   help="growth is measured from the first sample after this (default: 20%% of the run, "
                        "at least 30 s, at most half of it)")
    p.add_argument("--no-evaluator", action="store_true", help="run without the evaluator")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value for the job (repeatable)")
    g = p.add_argument_group("hostile soak", "--hostile: once the learner trains, a quiet phase measures the honest "
                             "actors' intake, then a hostile client (python -m zmqrl.bench.hostile) sends every kind "
                             "of bad message for the rest of --minutes (counted from the first optimisation step)")
    g.add_argument("--hostile", action="store_true", help="attack the job after a quiet phase (CartPole-v1 configs)")
    g.add_argument("--quiet-s", type=float, default=None,
                   help="seconds of quiet phase (default: a third of --minutes, at least 30)")
    g.add_argument("--hostile-rate", type=float, default=300.0,
                   help="the hostile client's messages per second, all kinds together (default 300)")
    g.add_argument("--hostile-kinds", default="all", help="comma-separated attack kinds (default all)")
    g.add_argument("--hostile-slot-s", type=float, default=2.0, help="seconds per attack kind per turn (default 2)")
    g.add_argument("--many-frames", type=int, default=200_000,
                   help="frames in the many_frames attack's message (default 200000)")


def cmd_soak(args: argparse.Namespace) -> int:
    """The ``zmqrl soak`` handler."""
    from zmqrl.config import ConfigError, load

    if args.minutes <= 0:
        raise ConfigError(f"--minutes must be > 0, got {args.minutes}")
    if args.interval_s <= 0:
        raise ConfigError(f"--interval-s must be > 0, got {args.interval_s}")
    if args.actors < 1:
        raise ConfigError(f"--actors must be >= 1, got {args.actors}")
    cfg = load(args.config, list(args.overrides))  # a bad config fails here, not in five child processes
    run_dir = Path(args.run_dir or f"runs/soak-{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    duration = 60.0 * args.minutes
    warmup = default_warmup_s(duration) if args.warmup_s is None else min(args.warmup_s, duration)
    expected = ["learner", "proxy", *[f"actor-{i}" for i in range(args.actors)]]
    expected += [] if args.no_evaluator else ["evaluator"]
    argv = launcher_argv(args.config, args.actors, run_dir, list(args.overrides), evaluator=not args.no_evaluator)
    if args.hostile:
        return hostile_soak(args, cfg, argv, run_dir, expected, duration).run()
    return Soak(argv, run_dir, expected, duration, args.interval_s, warmup).run()


def hostile_soak(args: argparse.Namespace, cfg: Any, argv: list[str], run_dir: Path, expected: list[str],
                 duration: float) -> HostileSoak:
    """The :class:`HostileSoak` the ``--hostile`` flags describe (ConfigError for ones that cannot work)."""
    from zmqrl.bench.hostile import parse_kinds
    from zmqrl.config import ConfigError

    if cfg.env.id != "CartPole-v1":
        raise ConfigError(f"--hostile sends CartPole-v1 batches; this config's env.id is {cfg.env.id!r}")
    try:
        kinds = parse_kinds(args.hostile_kinds)
    except ValueError as exc:
        raise ConfigError(f"--hostile-kinds: {exc}") from None
    quiet = default_quiet_s(duration) if args.quiet_s is None else args.quiet_s
    if quiet <= 0 or duration - quiet < MIN_HOSTILE_S:
        raise ConfigError(f"--minutes {args.minutes:g} leaves {duration - quiet:.0f}s of attacks after a {quiet:.0f}s "
                          f"quiet phase; at least {MIN_HOSTILE_S:.0f}s are needed")
    if args.hostile_rate <= 0 or args.hostile_slot_s <= 0 or args.many_frames < 2:
        raise ConfigError("--hostile-rate and --hostile-slot-s must be > 0, --many-frames >= 2")
    client = [sys.executable, "-m", "zmqrl.bench.hostile", args.config, "--run-dir", str(run_dir),
              "--rate", f"{args.hostile_rate:g}", "--slot-s", f"{args.hostile_slot_s:g}", "--kinds", ",".join(kinds),
              "--many-frames", str(args.many_frames), "--out", str(run_dir / HOSTILE_FILE),
              *[a for o in args.overrides for a in ("--set", o)]]
    return HostileSoak(argv, run_dir, expected, duration, args.interval_s, quiet, client)


def main(argv: list[str] | None = None) -> int:
    """``python -m zmqrl.bench.soak CONFIG --minutes N ...`` (the same as ``zmqrl soak``)."""
    from zmqrl.config import ConfigError

    parser = argparse.ArgumentParser(prog="zmqrl soak", description=HELP)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return cmd_soak(args)
    except ConfigError as exc:
        print(f"zmqrl soak: config error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
