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

:class:`Soak` has hooks (``_tick``, ``_end``, ``_before_stop``, ``_extend``, ``_print_more``) for a
soak that does more while the job runs: the hostile soak under ``tests/hostile/`` attacks it.

The launcher is started and stopped as the bench's processes are (:mod:`zmqrl.bench.harness`,
built on the local launcher's own :class:`~zmqrl.roles.launch.supervisor.Role`). This module never imports
torch: the sampler stays small.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zmqrl.bench.harness import Proc, zmqrl_argv
from zmqrl.bench.procfs import alive, children, cmdline, descendants, kill_pids, read_text
from zmqrl.run.rundir import read_json, write_json_atomic

if TYPE_CHECKING:
    from zmqrl.config import Config

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
        """After each sample (a hook for subclasses)."""

    def _before_stop(self) -> None:
        """Before the job is stopped (a hook for subclasses)."""

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
        """Add to soak.json's ``result`` (a hook for subclasses); a non-empty return is why the soak failed."""
        return ""

    def _print_more(self, result: dict[str, Any]) -> None:
        """Print more after the memory table (a hook for subclasses)."""


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


@dataclass(frozen=True)
class Job:
    """The job a soak runs, as its command line describes it."""

    cfg: Config
    argv: list[str]  # the launcher's command line
    run_dir: Path
    expected: list[str]  # the roles it starts
    duration_s: float


def job_from_args(args: argparse.Namespace) -> Job:
    """The job of :func:`add_arguments`' flags, checked before anything starts (ConfigError otherwise)."""
    from zmqrl.config import ConfigError, load

    if args.minutes <= 0:
        raise ConfigError(f"--minutes must be > 0, got {args.minutes}")
    if args.interval_s <= 0:
        raise ConfigError(f"--interval-s must be > 0, got {args.interval_s}")
    if args.actors < 1:
        raise ConfigError(f"--actors must be >= 1, got {args.actors}")
    cfg = load(args.config, list(args.overrides))  # a bad config fails here, not in five child processes
    run_dir = Path(args.run_dir or f"runs/soak-{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    expected = ["learner", "proxy", *[f"actor-{i}" for i in range(args.actors)]]
    expected += [] if args.no_evaluator else ["evaluator"]
    argv = launcher_argv(args.config, args.actors, run_dir, list(args.overrides), evaluator=not args.no_evaluator)
    return Job(cfg, argv, run_dir, expected, 60.0 * args.minutes)


def cmd_soak(args: argparse.Namespace) -> int:
    """The ``zmqrl soak`` handler."""
    job = job_from_args(args)
    warmup = default_warmup_s(job.duration_s) if args.warmup_s is None else min(args.warmup_s, job.duration_s)
    return Soak(job.argv, job.run_dir, job.expected, job.duration_s, args.interval_s, warmup).run()


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
