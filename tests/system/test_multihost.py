"""Multi-host tests: the roles on three "hosts" (network namespaces on one switched LAN).

Topology (tests/netns.py), one per test module run, names suffixed with the test's pid:

    learner   10.231.X.1   learner: data PULL, model PUB, eval PULL bound on its own address
    actors    10.231.X.2   proxy (bound on 127.0.0.1 inside this host) and actors 0 and 1
    evaluator 10.231.X.3   evaluator

Each role reaches the others only through the LAN. The partition test takes the actors host's
switch port down for 10 s, then heals it: the roles must notice within a few seconds, reconnect
by themselves and carry on without restarts or lost batches.

    sudo .venv/bin/pytest -m multihost tests/system/test_multihost.py -s   # -s prints the measured times

The soak smoke test at the bottom needs no root and is not marked ``multihost``.
"""

from __future__ import annotations

import math
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from netns import Lan, unavailable_reason  # noqa: E402
from procs import Proc, Procs, wait_for, zmqrl_argv  # noqa: E402
from zmqrl.run.rundir import read_json

HOSTS = ("learner", "actors", "evaluator")
ACTORS = ("actor-0", "actor-1")
PARTITION_S = 10.0
OVERRIDES = [
    "run.seed=7",
    "trainer.stop_return=null",  # keep training through the whole test
    "trainer.max_opts=10000000",
    "trainer.warmup=500",
    "trainer.eval_interval=300",
    "trainer.eval_episodes=3",
    "trainer.save_interval=0",
    "actor.num_actors=2",
]
LOST = re.compile(r"link (?P<what>.+?) lost \(")
RESTORED = re.compile(r"link (?P<what>.+?) restored after (?P<secs>[0-9.]+)s")


@dataclass
class Cluster:
    """The LAN, the role processes on it and where they write."""

    lan: Lan
    procs: Procs
    run_dir: Path
    measured: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any] | None:
        return read_json(self.run_dir / "summary.json")

    def describe(self, lines: int = 25) -> str:
        return self.procs.describe(lines)


def _actor_batches(summary: dict[str, Any] | None) -> dict[str, int]:
    actors = (summary or {}).get("actors") or {}
    return {name: int(actors.get(name, {}).get("batches", 0)) for name in ACTORS}


def _new_lines(proc: Proc, offset: int) -> str:
    return proc.text()[offset:]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Learner, proxy + 2 actors and evaluator on three namespaces; everything torn down at the end."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"multi-host test skipped: {reason}")
    root = tmp_path_factory.mktemp("multihost")
    run_dir = root / "run"
    lan = Lan.create(HOSTS)
    procs = Procs(root)
    try:
        lrn = lan.addr("learner")
        data, model, evals = f"tcp://{lrn}:5555", f"tcp://{lrn}:5556", f"tcp://{lrn}:5558"
        proxy_bind = "tcp://127.0.0.1:5557"

        def start(name: str, host: str, role: str, *args: str) -> Proc:
            return procs.start(name, lan.exec_argv(host, zmqrl_argv(role, *args, overrides=OVERRIDES)))

        start("learner", "learner", "learner", "--run-dir", str(run_dir), "--bind-data", data,
              "--bind-model", model, "--bind-eval", evals)
        start("proxy", "actors", "proxy", "--bind", proxy_bind, "--learner", data, "--run-dir", str(run_dir))
        for i, name in enumerate(ACTORS):
            start(name, "actors", "actor", "--id", str(i), "--proxy", proxy_bind, "--learner", model,
                  "--run-dir", str(run_dir))
        start("evaluator", "evaluator", "evaluator", "--learner", model, "--report", evals,
              "--run-dir", str(run_dir))
        yield Cluster(lan, procs, run_dir)
    finally:
        try:
            procs.stop_all(timeout=10.0)
        finally:
            errors = lan.destroy()
            assert not errors, f"namespace teardown failed: {errors}"


def _training_seen(c: Cluster, min_batches: int = 1, min_opts: int = 1) -> dict[str, Any] | None:
    """The learner's summary once it shows batches from both actors, opt steps and an evaluation."""
    s = c.summary()
    batches = _actor_batches(s)
    if s and min(batches.values()) >= min_batches and s.get("opt_steps", 0) >= min_opts and s.get("evals"):
        return s
    dead = [p.name for p in c.procs.procs.values() if not p.alive()]
    assert not dead, f"role(s) {dead} exited\n{c.describe()}"
    return None


@pytest.mark.multihost
@pytest.mark.timeout(150)
@pytest.mark.slow
def test_training_across_hosts(cluster: Cluster) -> None:
    """(a) Batches from both actors reach the learner across the LAN; it optimises; the evaluator reports."""
    t0 = time.monotonic()
    s = wait_for(lambda: _training_seen(cluster), 90, "batches from both actors, opt steps and an evaluation "
                 "in summary.json", diag=cluster.describe, interval=0.2)
    assert s is not None
    assert s["messages"]["rejected_total"] == 0, s["messages"]
    print(f"\ntraining across hosts after {time.monotonic() - t0:.1f}s: opt {s['opt_steps']}, "
          f"batches {_actor_batches(s)}, evals {len(s['evals'])}")


@pytest.mark.multihost
@pytest.mark.timeout(150)
@pytest.mark.slow
def test_partition_and_heal(cluster: Cluster) -> None:
    """(b) The actors' host is cut off for 10 s: links are reported lost within seconds, restored after the
    heal, and batches flow again with no role restarted and no batch lost."""
    c, procs = cluster, cluster.procs
    wait_for(lambda: _training_seen(c, min_batches=20, min_opts=300), 90, "steady training before the cut",
             diag=c.describe, interval=0.2)
    pids = {name: p.pid for name, p in procs.procs.items()}
    watched = [procs[n] for n in (*ACTORS, "proxy", "evaluator")]
    offsets = {p.name: len(p.text()) for p in watched}

    t_cut = time.monotonic()
    c.lan.cut("actors")
    lost_at: dict[str, float] = {}

    def first_lost() -> bool:
        now = time.monotonic() - t_cut
        for p in watched:
            if p.name not in lost_at and LOST.search(_new_lines(p, offsets[p.name])):
                lost_at[p.name] = now
        return any(n in lost_at for n in ACTORS)

    try:
        wait_for(first_lost, 8.0, "an actor to log its learner link lost", diag=c.describe, interval=0.1)
        detect_s = min(lost_at[n] for n in ACTORS if n in lost_at)
        # The rest of the deliberate partition: keep noting which roles saw it.
        while time.monotonic() - t_cut < PARTITION_S:
            first_lost()
            time.sleep(0.1)
        during = c.summary()
    finally:
        c.lan.heal("actors")
    t_heal = time.monotonic()
    before = _actor_batches(during)
    opt_before = int((during or {}).get("opt_steps", 0))
    lost_lines = {p.name: LOST.findall(_new_lines(p, offsets[p.name])) for p in watched}

    restored_at: dict[str, float] = {}

    def actors_restored() -> bool:
        now = time.monotonic() - t_heal
        for p in watched:
            if p.name not in restored_at and RESTORED.search(_new_lines(p, offsets[p.name])):
                restored_at[p.name] = now
        return all(n in restored_at for n in ACTORS)

    wait_for(actors_restored, 30.0, "both actors to log their learner link restored", diag=c.describe)

    def grown() -> dict[str, Any] | None:
        s = c.summary()
        now = _actor_batches(s)
        return s if s and all(now[n] > before[n] for n in ACTORS) and s["opt_steps"] > opt_before else None

    after = wait_for(grown, 30.0, f"batches from both actors past their values during the cut {before}",
                     diag=c.describe, interval=0.2)
    resume_s = time.monotonic() - t_heal

    restarted = {n: p.returncode for n, p in procs.procs.items() if not p.alive() or p.pid != pids[n]}
    assert not restarted, f"role(s) exited during the partition: {restarted}\n{c.describe()}"

    restore_secs = {p.name: [float(m.group("secs")) for m in RESTORED.finditer(_new_lines(p, offsets[p.name]))]
                    for p in watched}
    c.measured.update(detect_s=detect_s, lost_at=lost_at, restored_at=restored_at, resume_s=resume_s)
    print(f"\npartition {PARTITION_S:.0f}s: first 'link lost' {detect_s:.2f}s after the cut "
          f"({ {k: round(v, 2) for k, v in lost_at.items()} }); lost links: {lost_lines}")
    print(f"heal: 'restored' logged {({k: round(v, 2) for k, v in restored_at.items()})}s after the heal "
          f"(outages reported {restore_secs}); learner batches past the cut-time count "
          f"{resume_s:.1f}s after the heal (summary.json refreshes every 5 s): {before} -> {_actor_batches(after)}")
    assert detect_s <= 5.0, f"the cut took {detect_s:.1f}s to be noticed (heartbeat timeout 2 s)\n{c.describe()}"

    # Graceful stop, senders first: once the learner has counted every batch the actors sent (they write
    # roles/actor-N.json as they exit), the proxy, evaluator and learner follow.
    stop_cleanly(c, list(ACTORS))
    sent = {n: (read_json(c.run_dir / "roles" / f"{n}.json") or {}).get("sent_seq") for n in ACTORS}
    assert all(isinstance(v, int) and v > 0 for v in sent.values()), sent
    wait_for(lambda: _actor_batches(c.summary()) == sent, 30.0, f"the learner to receive all batches sent {sent}",
             diag=lambda: f"received {_actor_batches(c.summary())}\n{c.describe()}", interval=0.2)
    stop_cleanly(c, ["proxy"])
    stop_cleanly(c, ["evaluator", "learner"])
    def final_summary() -> dict[str, Any] | None:
        s = c.summary()
        return s if s and s.get("stop_reason") else None

    final = wait_for(final_summary, 5.0, "the final summary.json")
    assert final is not None
    msgs = final["messages"]
    print(f"final: {msgs}; sent {sent}")
    assert msgs["batches_lost"] == 0, f"batches lost across the partition: {msgs}\n{c.describe()}"
    assert msgs["rejected_total"] == 0, msgs
    assert _actor_batches(final) == sent, f"sent {sent}, the learner counted {_actor_batches(final)}"


def stop_cleanly(c: Cluster, names: list[str], timeout: float = 20.0) -> None:
    """SIGTERM ``names`` together; each must exit 0 within ``timeout``."""
    for name in names:
        c.procs[name].signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for name in names:
        rc = c.procs[name].wait(max(0.1, deadline - time.monotonic()))
        assert rc == 0, f"{name} did not stop cleanly on SIGTERM (rc {rc})\n{c.describe()}"


# --------------------------------------------------------------------------------------------------
# the soak tool, briefly (no root needed)


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_soak_smoke(tmp_path: Path) -> None:
    """``zmqrl soak`` for ~20 s: samples for every role, finite growth numbers, a clean stop."""
    from zmqrl.bench import soak

    run_dir = tmp_path / "soak"
    rc = soak.main([str(Path(__file__).resolve().parents[2] / "configs" / "cartpole_dqn.yaml"),
                    "--minutes", "0.3", "--actors", "2", "--interval-s", "2", "--run-dir", str(run_dir),
                    "--set", "run.seed=3"])
    report = read_json(run_dir / "soak.json")
    assert report is not None, f"no soak.json (rc {rc})"
    assert rc == 0, f"soak exited {rc}: {report['events']}"
    roles = ["learner", "proxy", "actor-0", "actor-1", "evaluator"]
    samples = report["samples"]
    assert len(samples) >= 3, samples
    for role in roles:
        values = [s["rss_mb"].get(role) for s in samples]
        assert all(v is not None and v > 0 for v in values), (role, values)
    rows = {r["role"]: r for r in report["table"]}
    for role in roles:
        for key in ("start_mb", "end_mb", "growth_mb", "mb_per_min", "slope_mb_per_min"):
            assert isinstance(rows[role][key], (int, float)) and math.isfinite(rows[role][key]), (role, key, rows[role])
    assert report["ok"] and not report["died"] and report["stop_exit_code"] == 0, report["events"]
