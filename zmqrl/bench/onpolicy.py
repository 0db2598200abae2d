"""On-policy group: env steps/s of a ``zmqrl local`` APPO job vs a bare acting loop of the same envs and
policy, and what the learner's segment queue reports over the job: segments dropped for policy lag,
the lag batches were trained with, the update rate.

An on-policy learner trains on each batch ``agent.epochs`` times and pauses its actors while its queue
is full, so the job's env steps/s is at most its updates/s times the env steps of a batch over the
epochs; the notes give both.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from zmqrl.agents.impala.config import ImpalaConfig
from zmqrl.bench.harness import BenchError, Context, Procs, Row, load_config, make_row, wait_launcher, zmqrl_argv
from zmqrl.config import Config
from zmqrl.run.rundir import read_json

CONFIG = "cartpole_appo.yaml"
ACTORS = 2  # `zmqrl local`'s default
JOB_S = {"full": 40.0, "quick": 15.0, "smoke": 8.0}  # trainer.max_seconds of the job (it may end at max_opts first)
GOAL = 0.8  # the job's env steps/s, at least this share of the bare loop's
# The same job with one pass over each batch (IMPALA's way): a learner that is not the limit, so the row says
# what the acting, the wire and the queue cost
ONE_PASS = ("1epoch", ("agent.epochs=1",))


def job_window(c: Context, path: Path, seconds: float, sets: tuple[str, ...] = (),
               tag: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """The learner summaries of ``zmqrl local --actors 2 --no-evaluator`` (no stop return, ``seconds`` at
    most, ``sets`` more overrides) that open and close its measured window: the first with training under
    way, and the last."""
    run_dir = c.path(f"onpolicy-{path.stem}{'-' + tag if tag else ''}")
    summary_path = run_dir / "summary.json"
    argv = zmqrl_argv("local", str(path), "--actors", str(ACTORS), "--no-evaluator", "--run-dir", str(run_dir),
                      "--set", "run.seed=0", "--set", "trainer.stop_return=null",
                      "--set", f"trainer.max_seconds={seconds:g}", *(a for o in sets for a in ("--set", o)))
    first: dict[str, Any] | None = None
    with Procs(c.logs) as procs:
        procs.sweep_args.append(str(run_dir))
        proc = procs.start(f"onpolicy-{path.stem}", argv)
        deadline = time.monotonic() + seconds + 60.0
        while proc.alive() and time.monotonic() < deadline:
            summary = read_json(summary_path)
            if first is None and summary and summary.get("opt_steps", 0) > 0:
                first = summary
            time.sleep(0.2)
        code = wait_launcher(proc, max(1.0, deadline - time.monotonic()))
        last = read_json(summary_path)
        if code != 0 or last is None:
            raise proc.failure(f"zmqrl local exited with code {code}")
    if first is None or last["wall_s"] - first["wall_s"] < 1.0:
        raise BenchError(f"{path.name}: no two learner summaries a second apart with training under way "
                         f"(first {first and first['wall_s']}, last {last['wall_s']} s)")
    return first, last


def bare_rate(cfg: Config, seconds: float) -> tuple[float, str]:
    """Env steps/s of one acting loop per actor (each ``env.num_envs`` envs and the actors' policy, numpy
    for an MLP), stepped in turn in this process with nothing else running; and the policy's class."""
    import torch

    from zmqrl.run.acting import ActingLoop, make_task

    torch.set_num_threads(1)
    task = make_task(cfg)
    loops = [ActingLoop(cfg, task.policy(cfg.run.seed + 1000 + i, backend=cfg.actor.backend), task.exploration(i),
                        cfg.run.seed + 1000 + i) for i in range(ACTORS)]
    try:
        n, start = 0, time.perf_counter()
        while n < 1024 or time.perf_counter() - start < seconds:
            for loop in loops:
                n += loop.step().env_steps
        return n / (time.perf_counter() - start), type(loops[0].policy).__name__
    finally:
        for loop in loops:
            loop.close()


def _per_actor(first: dict[str, Any], last: dict[str, Any]) -> str:
    """Each actor's env steps/s over the window and its share of the whole run spent paused by the learner."""
    span = last["wall_s"] - first["wall_s"]
    before = first.get("actors", {})
    parts = []
    for name, a in sorted(last.get("actors", {}).items()):
        rate = (a.get("env_steps", 0) - before.get(name, {}).get("env_steps", 0)) / span
        paused = a.get("paused_s", 0.0) / max(last["wall_s"], 1e-9)
        parts.append(f"{name} {rate:,.0f}/s, paused {paused:.0%} of the run")
    return "; ".join(parts)


def measure(c: Context, path: Path) -> list[Row]:
    """The job's env steps/s against the bare loop's (goal >= GOAL) and against what its learner's update rate
    takes in; the share of segments not dropped for lag and the lag batches were trained with (the last three
    reported only)."""
    cfg = load_config(path)
    tag, ac, tc = cfg.run.name, cfg.agent, cfg.trainer
    if not isinstance(ac, ImpalaConfig):
        raise BenchError(f"{path.name}: agent.algo={ac.algo} is not on-policy (impala or appo)")
    first, last = job_window(c, path, JOB_S.get(c.settings.mode, JOB_S["full"]))
    span = last["wall_s"] - first["wall_s"]
    env_rate = (last["env_steps"] - first["env_steps"]) / span
    update_rate = (last["opt_steps"] - first["opt_steps"]) / span
    batch_steps = ac.batch_size * ac.unroll_length  # env steps of one batch (fewer where an episode ended early)
    seconds = 2 * c.settings.actor_s
    bare, policy = bare_rate(cfg, seconds)
    store, lag = last.get("store"), last.get("policy_lag", {})
    if store is None:
        raise BenchError(f"{path.name}: the learner's summary has no segment queue (store)")
    job = (f"`zmqrl local {path.name} --actors {ACTORS} --no-evaluator`, trainer.stop_return=null, stopped by "
           f"{last.get('stop_reason')} at {last['wall_s']:.1f} s, learner ({ac.algo}, device {cfg.run.device}) on the "
           f"same {os.cpu_count()} CPUs")
    room = update_rate * batch_steps / ac.epochs  # the env steps/s the learner's updates take in
    learner = (f"{update_rate:.0f} updates/s ({update_rate / max(tc.sync_interval, 1):.1f} versions/s, "
               f"{tc.sync_interval} updates each), at {ac.epochs} epochs of {batch_steps} env steps a batch room for "
               f"at most {room:,.0f} env steps/s")
    rate_note = (f"{job}; window {first['wall_s']:.1f}-{last['wall_s']:.1f} s of learner summaries (training under "
                 f"way); {_per_actor(first, last)}; the learner: {learner}; baseline: one ActingLoop per actor "
                 f"({cfg.env.num_envs} {cfg.env.id} envs, {policy}) stepped in turn in the bench process, "
                 f"{seconds:g} s, nothing else running")
    added, dropped = int(store.get("added", 0)), int(store.get("dropped_lag", 0))
    drop_note = (f"segments within trainer.max_policy_lag={tc.max_policy_lag} versions of the learner's: "
                 f"{dropped:,} of {added:,} dropped for lag ({dropped / max(added, 1):.2%}; ratio = 1 - that share); "
                 f"other drops: {store.get('dropped_overflow', 0)} overflow, {store.get('dropped_other_line', 0)} "
                 f"other line; queue full {store.get('full_pauses', 0)} times (actors paused); whole run of {job}")
    lag_note = (f"mean versions between the model that acted for a segment and the learner's when its batch was "
                f"first trained on (queue wait in; max {store.get('trained_lag_max')}), against the bound "
                f"trainer.max_policy_lag; on arrival: mean {lag.get('mean', 0.0):.2f}, p90 {lag.get('p90', 0.0):g}, "
                f"max {lag.get('max', 0)} versions; {learner}; whole run of {job}")
    room_note = (f"the job's env steps/s (the row onpolicy_{tag}_local_vs_bare) vs the env steps/s its learner's "
                 f"update rate takes in: {learner} (an upper bound: a segment whose episode ended early is shorter); "
                 f"near 1, the actors keep up with the learner and wait for it (paused while its queue is full)")
    rows = [make_row(f"onpolicy_{tag}_local_vs_bare", env_rate, bare, "env steps/s", rate_note, (">=", GOAL)),
            make_row(f"onpolicy_{tag}_local_vs_update_rate", env_rate, room, "env steps/s", room_note),
            make_row(f"onpolicy_{tag}_kept_under_lag_bound", added - dropped, added, "segments", drop_note),
            make_row(f"onpolicy_{tag}_trained_lag", store.get("trained_lag_mean"), tc.max_policy_lag, "versions",
                     lag_note)]
    return rows + one_pass(c, path, tag, bare, policy)


def one_pass(c: Context, path: Path, tag: str, bare: float, policy: str) -> list[Row]:
    """The job again with ``agent.epochs=1`` (:data:`ONE_PASS`) against the same bare loop (goal >= GOAL): where
    the learner keeps up, what the rest of the job costs."""
    name, sets = ONE_PASS
    first, last = job_window(c, path, JOB_S.get(c.settings.mode, JOB_S["full"]), sets, name)
    span = last["wall_s"] - first["wall_s"]
    env_rate = (last["env_steps"] - first["env_steps"]) / span
    update_rate = (last["opt_steps"] - first["opt_steps"]) / span
    ac = load_config(path, *sets).agent
    assert isinstance(ac, ImpalaConfig)  # (measure checked the config)
    room = update_rate * ac.batch_size * ac.unroll_length / ac.epochs
    note = (f"`zmqrl local {path.name} --actors {ACTORS} --no-evaluator` with {', '.join(sets)} (one pass over each "
            f"batch, as IMPALA), trainer.stop_return=null, stopped by {last.get('stop_reason')} at "
            f"{last['wall_s']:.1f} s; window {first['wall_s']:.1f}-{last['wall_s']:.1f} s; {_per_actor(first, last)}; "
            f"the learner: {update_rate:.0f} updates/s, room for {room:,.0f} env steps/s; baseline: the bare loop of "
            f"the row onpolicy_{tag}_local_vs_bare ({policy})")
    return [make_row(f"onpolicy_{tag}_{name}_local_vs_bare", env_rate, bare, "env steps/s", note, (">=", GOAL))]


def run(c: Context) -> list[Row]:
    return [row for path in c.configs(CONFIG) for row in measure(c, path)]
