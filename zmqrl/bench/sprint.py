"""``zmqrl sprint``: one prepared command that measures a host with a GPU, inside a fixed budget.

In order, all inside ``--budget-s`` (default 540 s, so the whole command fits 9 minutes):

1. the host: cores, torch, the GPU;
2. the CUDA tests (``pytest tests/agents/test_graphs.py tests/replay/test_device_replay.py -k test_cuda_``:
   each algorithm's update captured as a CUDA graph equals its eager update; replay on the GPU is the numpy
   replay's and never makes the host wait for the device), within ``TESTS_SHARE`` of the budget, into
   ``tests_cuda.log``; they come before the run, which trains with graphs (``agent.compile: auto``);
3. the ``cnn`` bench group (the learner's Nature-CNN update on real Pong batches: on CPU, and on
   CUDA at batch 32, 256 and 512 with pinned staging against plain copies, captured as a CUDA
   graph against eager, and in the learner's loop with replay on the GPU against host replay; and
   prioritized sampling over 1M items with the sum tree's copy on the GPU against the host's) into
   ``bench_cnn.json``, within ``BENCH_SHARE`` of the budget;
4. ``zmqrl local`` with the sprint's config (``configs/pong_dqn_gpu.yaml``: Pong, the learner and
   its replay on the GPU) and cores − 2 actors, for whatever wall time is left less a reserve for stopping and
   reporting, or ``--train-s`` if less (``trainer.max_seconds``); its run directory is ``OUTDIR/run``;
5. ``OUTDIR/summary.json`` (the run's), ``config.yaml`` (what ran), ``curve.png`` (``zmqrl plot``),
   ``sprint.json`` (everything the report says, as numbers) and ``report.txt``, the one-screen
   report that is also printed: evaluations, updates/s in the job and alone (the bench's row at
   the job's batch and device), samples per insert, where the learner's time went (its loop's
   parts, its intake thread, what it published), actor env steps/s per core with every core busy,
   bytes per transition on the wire.

The exit code is 0 when the run stopped by itself (its wall-time limit or its goal) and the files
were written. CI runs it on CPU with a tiny budget on Catch (``tests/bench/test_sprint.py``), so
the command cannot rot between the times a GPU host is at hand.

    launch/gpu_sprint.sh OUTDIR                 # zmqrl sprint OUTDIR
    zmqrl sprint OUTDIR --config configs/catch_dqn.yaml --budget-s 90 --actors 1 --device cpu
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zmqrl.bench.harness import Proc, zmqrl_argv
from zmqrl.run.rundir import CONFIG_FILE, SUMMARY_FILE, read_json, write_json_atomic

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO / "configs" / "pong_dqn_gpu.yaml"
CUDA_TESTS = (REPO / "tests" / "agents" / "test_graphs.py", REPO / "tests" / "replay" / "test_device_replay.py")
STOP_RESERVE_S = 45.0  # after max_seconds: the learner's final checkpoint, every role's exit, the plot
TESTS_SHARE = 0.15  # at most this part of the budget for the CUDA tests (their set takes under 60 s on an H100)
# At most this part of the budget for the bench group: about 90 s on an H100 before the rows of replay on the
# device, which add about 35 s there (9 loops of the learner at 3 batch sizes, 6 sum-tree windows, their replays).
BENCH_SHARE = 0.35
MIN_RUN_S = 20.0


@dataclass
class Sprint:
    """One sprint: its settings, and what it found as it went."""

    out: Path
    config: Path
    budget_s: float
    actors: int
    device: str
    bench: str  # quick, smoke or none
    tests: str = "cuda"  # cuda (the CUDA tests: captured updates, replay on the GPU) or none
    train_s: float | None = None  # at most this many seconds of training (None: what the budget leaves)
    overrides: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    found: dict[str, Any] = field(default_factory=dict)

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def say(self, text: str) -> None:
        print(f"[sprint {time.monotonic() - self.started:6.1f}s] {text}", flush=True)


# --- steps ---------------------------------------------------------------------------------------

def host_facts(device: str) -> dict[str, Any]:
    """Cores, Python, torch and the GPU (its name and memory) of this host."""
    import torch

    facts: dict[str, Any] = {"cores": len(os.sched_getaffinity(0)), "python": platform.python_version(),
                             "torch": torch.__version__, "cuda": torch.cuda.is_available(), "device": device,
                             "hostname": platform.node()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                     cuda_version=torch.version.cuda)
    return facts


def run_bounded(argv: list[str], log: Path, timeout_s: float) -> int | None:
    """Run ``argv`` as the bench runs its processes (:class:`~zmqrl.bench.harness.Proc`: its own session,
    output to ``log``), stopped with SIGTERM, then SIGKILL, at ``timeout_s``. Returns the exit code, or
    None when it had to be stopped."""
    proc = Proc(log.stem, argv, log.parent)
    rc = proc.wait(max(timeout_s, 1.0))
    if rc is None:
        proc.stop(grace_s=20.0)
    return rc


def cuda_tests(s: Sprint) -> dict[str, Any]:
    """The CUDA tests, bounded by ``TESTS_SHARE`` of the budget: their counts (passed, failed,
    skipped, ...) and exit code, or why they did not run. A failure is one of the sprint's problems."""
    if s.tests == "none":
        return {"ran": False, "why": "--tests none"}
    missing = [path for path in CUDA_TESTS if not path.is_file()]
    if missing or importlib.util.find_spec("pytest") is None:
        why = f"no {missing[0].relative_to(REPO)} here" if missing else "pytest is not installed"
        s.found.setdefault("problems", []).append(f"cuda tests not run: {why}")
        return {"ran": False, "why": why}
    log = s.out / "tests_cuda.log"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "test_cuda_",
            *map(str, CUDA_TESTS)]
    s.say(f"tests: pytest {' '.join(argv[3:])}")
    started = time.monotonic()
    rc = run_bounded(argv, log, TESTS_SHARE * s.budget_s)
    text = log.read_text(errors="replace") if log.is_file() else ""
    summary = text.strip().splitlines()[-1] if text.strip() else ""
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary)}
    if rc != 0:
        s.found.setdefault("problems", []).append(
            f"cuda tests {'stopped at their share of the budget' if rc is None else f'exited {rc}'} "
            f"(log: tests_cuda.log): {summary}")
    return {"ran": True, "exit": rc, "seconds": round(time.monotonic() - started, 1), "summary": summary, **counts}


def bench_rows(s: Sprint) -> list[dict[str, Any]]:
    """The ``cnn`` group's rows (``bench_cnn.json``); an empty list when skipped or failed."""
    if s.bench == "none":
        return []
    path = s.out / "bench_cnn.json"
    argv = zmqrl_argv("bench", "--only", "cnn", f"--{s.bench}", "--json", str(path))
    s.say(f"bench: {' '.join(argv[2:])}")
    rc = run_bounded(argv, s.out / "bench_cnn.log", BENCH_SHARE * s.budget_s)
    rows = json.loads(path.read_text()) if path.is_file() else []
    if rc != 0:
        s.found.setdefault("problems", []).append(f"bench exited {rc} (log: bench_cnn.log)")
    return rows if isinstance(rows, list) else []


def train(s: Sprint) -> tuple[int | None, float]:
    """``zmqrl local`` for the time left; returns its exit code (None: stopped by the sprint) and its max_seconds."""
    run_dir = s.out / "run"
    seconds = max(MIN_RUN_S, s.left_s() - STOP_RESERVE_S)
    if s.train_s is not None:
        seconds = min(seconds, s.train_s)
    seconds = float(round(seconds))  # whole seconds: the value the run gets
    sets = [f"run.device={s.device}", f"trainer.max_seconds={seconds:.0f}", *s.overrides]
    argv = zmqrl_argv("local", str(s.config), "--actors", str(s.actors), "--run-dir", str(run_dir),
                      *[a for kv in sets for a in ("--set", kv)])
    s.say(f"train: {s.config.name} with {s.actors} actor(s), learner on {s.device}, {seconds:.0f}s "
          f"(logs in {run_dir / 'logs'})")
    rc = run_bounded(argv, s.out / "local.log", seconds + STOP_RESERVE_S + 60.0)
    return rc, seconds


def curve(s: Sprint) -> Path | None:
    """``OUTDIR/curve.png`` from the run directory (None when there is nothing to draw)."""
    from zmqrl.tools.plot import plot_runs

    path = s.out / "curve.png"
    try:
        plot_runs([s.out / "run"], path, x="wall_s")
    except Exception as exc:  # noqa: BLE001 - a missing curve is reported, the rest of the report still matters
        s.found.setdefault("problems", []).append(f"no curve: {exc}")
        return None
    return path


# --- the report ----------------------------------------------------------------------------------

def actor_rates(summary: dict[str, Any], cores: int) -> dict[str, Any]:
    """Env steps/s per actor process (one core each) and how long they were held by the rate limiter."""
    actors = summary.get("actors") or {}
    rates = [float(a.get("env_steps_per_s") or 0.0) for a in actors.values()]
    paused = [float(a.get("paused_s") or 0.0) for a in actors.values()]
    wall = float(summary.get("wall_s") or 0.0)
    proxy_bytes = sum(float(p.get("bytes") or 0.0) for p in (summary.get("proxies") or {}).values())
    inserted = float(summary.get("transitions_inserted") or 0.0)
    per_core = sum(rates) / len(rates) if rates else 0.0
    paused_share = (sum(paused) / (len(paused) * wall)) if paused and wall > 0 else 0.0
    return {"actors": len(rates), "cores": cores, "env_steps_per_s_per_actor": per_core,
            "env_steps_per_s_per_actor_unpaused": per_core / (1.0 - paused_share) if paused_share < 0.99 else None,
            "paused_share": paused_share, "env_steps_per_s_total": sum(rates),
            "wire_bytes_per_transition": proxy_bytes / inserted if inserted else None}


def report(s: Sprint, summary: dict[str, Any], rows: list[dict[str, Any]], rc: int | None, seconds: float) -> str:
    """The one-screen report (also kept in ``sprint.json`` as numbers)."""
    host = s.found["host"]
    actors = s.found["actors"]
    evals = summary.get("evals") or []
    cost = summary.get("compute_cost") or {}
    lines = [
        f"zmqrl sprint: {s.config.name} on {host.get('gpu') or 'CPU'} ({host['cores']} cores, torch {host['torch']})",
        f"run              {seconds:.0f}s of training asked, {float(summary.get('wall_s') or 0):.0f}s ran; stop: "
        f"{summary.get('stop_reason') or '-'}; zmqrl local exit {rc if rc is not None else 'stopped by the sprint'}; "
        f"restarts {restarts(summary)}",
        f"evaluations      best {fmt(summary.get('best_eval_return'))}, last {fmt(summary.get('last_eval_return'))} "
        f"({len(evals)} evaluations, greedy, full games)",
    ]
    for e in evals[-8:]:
        lines.append(f"  at {e.get('wall_s', 0):>6.0f}s  opt {e.get('opt_steps', 0):>8,}  "
                     f"env {e.get('env_steps', 0):>11,.0f}  "
                     f"return {e.get('return_mean', 0):6.1f} ± {e.get('return_std', 0):.1f}")
    tests = s.found.get("cuda_tests") or {}
    lines.append("cuda tests       " + (f"{tests.get('summary') or 'no summary'} ({tests.get('seconds')}s, exit "
                                        f"{tests.get('exit')}; tests_cuda.log)" if tests.get("ran")
                                        else f"not run: {tests.get('why', '-')}"))
    alone = learner_alone(rows, s.found.get("batch_size"), s.device)
    in_job = summary.get("opt_steps_per_s")
    intake, published = summary.get("intake") or {}, summary.get("publisher") or {}
    wall = float(summary.get("wall_s") or 0.0)
    lines += [
        f"learner          {summary.get('opt_steps', 0):,} updates ({fmt(in_job)}/s) of batch "
        f"{s.found.get('batch_size')}, replay on {summary.get('replay_device') or '-'}; samples per insert "
        f"{fmt(summary.get('samples_per_insert'))}; skipped {summary.get('updates_skipped', 0)}, models withheld "
        f"{summary.get('models_withheld', 0)}",
        "learner alone    " + (f"{fmt(alone['measured'])} updates/s ({alone['name']}); in the job "
                               f"{fmt(in_job)}/s, {float(in_job or 0) / alone['measured']:.2f} of it"
                               if alone else "no bench row at the job's batch and device"),
        "learner's time   " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(cost.items(), key=lambda kv: -kv[1]))
        + (f"; intake thread {100 * float(intake.get('cpu_s') or 0) / wall:.0f}% of a core" if wall else "")
        + f"; published {published.get('models_published', 0)} models of {published.get('model_versions_sent', 0)} "
        f"versions, {published.get('controls_sent', 0)} controls",
        f"actors           {actors['actors']} on {actors['cores']} cores: {fmt(actors['env_steps_per_s_per_actor'])} "
        f"env steps/s each ({fmt(actors['env_steps_per_s_total'])} in all), held by the rate limiter "
        f"{100 * actors['paused_share']:.0f}% of the time"
        + (f" (unheld: {fmt(actors['env_steps_per_s_per_actor_unpaused'])} each)"
           if actors["paused_share"] > 0.01 and actors["env_steps_per_s_per_actor_unpaused"] else ""),
        f"data             {summary.get('env_steps', 0):,.0f} env steps, {summary.get('transitions_inserted', 0):,} "
        f"inserted, {fmt(actors['wire_bytes_per_transition'])} bytes per transition on the wire, "
        f"{summary.get('messages', {}).get('batches_lost', 0)} batches lost",
    ]
    measured = [r for r in rows if r.get("measured") is not None]
    for r in measured:
        lines.append(f"bench {r['name']:<35} {fmt(r.get('measured'))} {r.get('unit', '')}"
                     f" (baseline {fmt(r.get('baseline'))}): {r.get('note', '')[:90]}")
    if len(measured) < len(rows):
        lines.append(f"bench            {len(rows) - len(measured)} rows not measured here (bench_cnn.json says why)")
    for p in s.found.get("problems", []):
        lines.append(f"problem          {p}")
    return "\n".join(lines)


def learner_alone(rows: list[dict[str, Any]], batch_size: Any, device: str) -> dict[str, Any] | None:
    """The bench row that times the learner's loop alone (sample, update, priorities) at the job's batch
    size on its device, where the bench measured one."""
    kind = "cuda" if str(device).startswith("cuda") else "cpu"
    names = ([f"cnn_learner_b{batch_size}_cuda_device_replay", f"cnn_learner_b{batch_size}_cuda_pinned"]
             if kind == "cuda" else [f"cnn_learner_b{batch_size}_cpu"])
    by_name = {r.get("name"): r for r in rows if r.get("measured")}
    return next((by_name[n] for n in names if n in by_name), None)


def restarts(summary: dict[str, Any]) -> str:
    """``none``, or ``learner 1, actor-3 2``: the roles the launcher restarted."""
    counts = {k: v for k, v in (summary.get("restarts") or {}).items() if v}
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"
    return str(value)


# --- the command ---------------------------------------------------------------------------------

def run_sprint(s: Sprint) -> int:
    from zmqrl import config as config_mod

    s.out.mkdir(parents=True, exist_ok=True)
    if (s.out / "run").exists():
        print(f"zmqrl sprint: {s.out / 'run'} exists; give an empty OUTDIR", file=sys.stderr)
        return 2
    try:
        cfg = config_mod.load(s.config, s.overrides)  # a bad config or --set fails here, before anything runs
    except config_mod.ConfigError as exc:
        print(f"zmqrl sprint: {exc}", file=sys.stderr)
        return 2
    s.found["batch_size"] = cfg.agent.batch_size
    s.found["host"] = host_facts(s.device)
    s.say(f"host: {json.dumps(s.found['host'])}")
    s.found["cuda_tests"] = cuda_tests(s)
    rows = bench_rows(s)
    rc, seconds = train(s)
    summary = read_json(s.out / "run" / SUMMARY_FILE) or {}
    if not summary:
        s.found.setdefault("problems", []).append("the run wrote no summary.json (see local.log and run/logs)")
    else:
        shutil.copyfile(s.out / "run" / SUMMARY_FILE, s.out / SUMMARY_FILE)
    if (s.out / "run" / CONFIG_FILE).is_file():
        shutil.copyfile(s.out / "run" / CONFIG_FILE, s.out / CONFIG_FILE)
    s.found["actors"] = actor_rates(summary, s.found["host"]["cores"])
    curve(s)
    text = report(s, summary, rows, rc, seconds)
    write_json_atomic(s.out / "sprint.json", {"config": str(s.config), "budget_s": s.budget_s, "actors_asked": s.actors,
                                               "train_seconds": seconds, "local_exit": rc, **s.found,
                                               "bench": rows, "elapsed_s": round(time.monotonic() - s.started, 1)})
    (s.out / "report.txt").write_text(text + "\n")
    print(text, flush=True)
    stopped_by_itself = rc == 0 and bool(summary.get("stop_reason"))
    return 0 if stopped_by_itself and not s.found.get("problems") else 1


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``zmqrl sprint``'s flags."""
    p.add_argument("out", metavar="OUTDIR",
                   help="where the report, summary, curve and bench rows go (the run: OUTDIR/run)")
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help=f"config to train (default {DEFAULT_CONFIG.name})")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="seconds for the whole command, start-up, bench and report included (default 540)")
    p.add_argument("--actors", type=int, help="actor processes (default: cores - 2, at least 1)")
    p.add_argument("--device", help="the learner's device (default: cuda where there is one, else cpu)")
    p.add_argument("--bench", choices=("quick", "smoke", "none"), default="quick",
                   help="the cnn bench group's length (default quick; smoke for a plumbing check)")
    p.add_argument("--tests", choices=("cuda", "none"), default="cuda",
                   help="cuda: first run the CUDA tests (captured updates, replay on the GPU: -k test_cuda_)")
    p.add_argument("--train-s", type=float,
                   help="at most this many seconds of training (default: what the budget leaves; a check of a host)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (repeatable)")


def cmd_sprint(args: argparse.Namespace) -> int:
    """The ``zmqrl sprint`` entry point."""
    config = Path(args.config)
    if not config.is_file():
        print(f"zmqrl sprint: --config: no config file {args.config}", file=sys.stderr)
        return 2
    if args.train_s is not None and args.train_s <= 0:
        print(f"zmqrl sprint: --train-s must be positive, not {args.train_s:g}", file=sys.stderr)
        return 2
    cores = len(os.sched_getaffinity(0))
    actors = args.actors if args.actors is not None else max(1, cores - 2)
    sprint = Sprint(out=Path(args.out), config=config.resolve(), budget_s=args.budget_s, actors=actors,
                    device=args.device or default_device(), bench=args.bench, tests=args.tests,
                    train_s=args.train_s, overrides=list(args.overrides))
    return run_sprint(sprint)
