"""The hostile soak: a soak (:mod:`zmqrl.bench.soak`) that proves one message never crashes, corrupts
or ends a run. It takes ``zmqrl soak``'s flags and its own (:func:`add_arguments`).

For CartPole-v1 configs. Once the learner trains, a quiet phase (``--quiet-s``, default a third of ``--minutes``, at
least 30 s) measures the honest actors' intake (transitions the learner took in from ``actor-*`` per
second, from ``summary.json``, on the learner's own clock) and its opt steps/s; then the hostile client
(:mod:`hostile.client`, its own process at the lowest CPU priority) sends every kind of bad message
for the rest of ``--minutes``, which count from the first optimisation step. The report adds, per attack
kind, the messages sent; what the learner and the proxy refused, by reason; each role alive or not at the
end, with any exit code, the attack then under way and the exception its log names; memory growth over
the hostile phase; the honest intake and opt steps/s the hostile phase kept (its rate over the quiet
phase's); and the learner's stop reason before the soak stopped it (it must still be empty). All of it
goes to ``soak.json`` under ``hostile``. Only a role that died, or a job that did not stop cleanly (or
never trained), makes the exit code non-zero: the other figures are reported, not judged.

    python tests/hostile soak configs/cartpole_dqn.yaml --minutes 10 --actors 2

The job runs with ``trainer.stop_return=null`` like any soak, so an evaluation cannot end it unless
``--set trainer.stop_return=...`` asks for that (an honest one of 500 then ends it too); the report says
how many evaluations the learner recorded against how many the evaluator sent, and how many were for
model versions the learner never published.

"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hostile.client import parse_kinds
from zmqrl.bench.harness import Proc
from zmqrl.bench.procfs import alive, read_text
from zmqrl.bench.soak import ROLE_WAIT_S, Soak, growth_table, job_from_args
from zmqrl.bench.soak import add_arguments as add_soak_arguments
from zmqrl.config import ConfigError
from zmqrl.run.rundir import read_json

HELP = "Run a distributed job, attack it after a quiet phase, and report what it refused and what it kept."
PACKAGE = Path(__file__).resolve().parent  # ``python PACKAGE client ...`` starts the client
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
    actors' intake alone; then :mod:`hostile.client` attacks for the rest of ``duration_s``."""

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


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``zmqrl soak``'s flags and the attack's."""
    add_soak_arguments(p)
    g = p.add_argument_group("attack", "once the learner trains, a quiet phase measures the honest actors' intake, "
                             "then the hostile client sends every kind of bad message for the rest of --minutes "
                             "(counted from the first optimisation step)")
    g.add_argument("--quiet-s", type=float, default=None,
                   help="seconds of quiet phase (default: a third of --minutes, at least 30)")
    g.add_argument("--rate", type=float, default=300.0,
                   help="the hostile client's messages per second, all kinds together (default 300)")
    g.add_argument("--kinds", default="all", help="comma-separated attack kinds (default all)")
    g.add_argument("--slot-s", type=float, default=2.0, help="seconds per attack kind per turn (default 2)")
    g.add_argument("--many-frames", type=int, default=200_000,
                   help="frames in the many_frames attack's message (default 200000)")


def hostile_soak(args: argparse.Namespace) -> HostileSoak:
    """The :class:`HostileSoak` the flags describe (ConfigError for ones that cannot work)."""
    job = job_from_args(args)
    if job.cfg.env.id != "CartPole-v1":
        raise ConfigError(f"the hostile client sends CartPole-v1 batches; this config's env.id is {job.cfg.env.id!r}")
    try:
        kinds = parse_kinds(args.kinds)
    except ValueError as exc:
        raise ConfigError(f"--kinds: {exc}") from None
    quiet = default_quiet_s(job.duration_s) if args.quiet_s is None else args.quiet_s
    if quiet <= 0 or job.duration_s - quiet < MIN_HOSTILE_S:
        raise ConfigError(f"--minutes {args.minutes:g} leaves {job.duration_s - quiet:.0f}s of attacks after a "
                          f"{quiet:.0f}s quiet phase; at least {MIN_HOSTILE_S:.0f}s are needed")
    if args.rate <= 0 or args.slot_s <= 0 or args.many_frames < 2:
        raise ConfigError("--rate and --slot-s must be > 0, --many-frames >= 2")
    client = [sys.executable, str(PACKAGE), "client", args.config, "--run-dir", str(job.run_dir),
              "--rate", f"{args.rate:g}", "--slot-s", f"{args.slot_s:g}", "--kinds", ",".join(kinds),
              "--many-frames", str(args.many_frames), "--out", str(job.run_dir / HOSTILE_FILE),
              *[a for o in args.overrides for a in ("--set", o)]]
    return HostileSoak(job.argv, job.run_dir, job.expected, job.duration_s, args.interval_s, quiet, client)


def main(argv: list[str] | None = None) -> int:
    """``python tests/hostile soak CONFIG --minutes N ...``: 0 when every role stayed up and the job stopped
    cleanly, 1 otherwise, 2 for flags or a config that cannot work."""
    parser = argparse.ArgumentParser(prog="python tests/hostile soak", description=HELP)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        soak = hostile_soak(args)
    except ConfigError as exc:
        print(f"hostile soak: config error: {exc}", file=sys.stderr)
        return 2
    return soak.run()
