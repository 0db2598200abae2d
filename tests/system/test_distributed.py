"""Integration tests of the distributed roles: real processes, real sockets on 127.0.0.1, real CartPole.

Each role runs as ``python -m zmqrl.cli ROLE ...`` (see tests/procs.py). The machine these run on
has two cores shared by every process, so the runs are small and use at most two actors. Every
wait has a deadline; every process is stopped (SIGTERM, then SIGKILL) when a test ends, pass or fail.

    .venv/bin/pytest tests/system/test_distributed.py              # everything (~3-4 min on 2 cores)
    .venv/bin/pytest -m slow tests/system/test_distributed.py      # the learning run only
    .venv/bin/pytest -m "not slow" tests/system/test_distributed.py  # the quick ones (~5-15 s each)
"""

from __future__ import annotations

import collections
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from procs import Proc, Procs, log_tail, wait_for, zmqrl_argv  # noqa: E402
from zmqrl.bench.procfs import alive, cmdline, pids_with_arg  # noqa: E402
from zmqrl.roles.addresses import free_port
from zmqrl.run.checkpoint import POLICY_FILE
from zmqrl.run.rundir import read_json
from zmqrl.tools.enjoy import load_policy
from zmqrl.wire import BATCH, BUNDLE, STATS, Limits, WireError, decode, unbundle

SEED = "run.seed=7"
GOT_MODEL = re.compile(r"got model version (\d+) after ([0-9.]+)s")


def tcp(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


def learner_ports() -> dict[str, int]:
    return {k: free_port() for k in ("data", "model", "eval", "proxy")}


def learner_args(run_dir: Path, ports: dict[str, int]) -> list[str]:
    return ["--run-dir", str(run_dir), "--bind-data", tcp(ports["data"]),
            "--bind-model", tcp(ports["model"]), "--bind-eval", tcp(ports["eval"])]


def proxy_args(run_dir: Path, ports: dict[str, int], learner_data: int | None = None) -> list[str]:
    return ["--bind", tcp(ports["proxy"]), "--learner", tcp(learner_data or ports["data"]), "--run-dir", str(run_dir)]


def actor_args(run_dir: Path, ports: dict[str, int], index: int) -> list[str]:
    return ["--id", str(index), "--proxy", tcp(ports["proxy"]), "--learner", tcp(ports["model"]),
            "--run-dir", str(run_dir)]


def got_model(proc: Proc) -> tuple[int, float] | None:
    """(version, seconds waited) from an actor's "got model version V after X s" line, once logged."""
    m = GOT_MODEL.search(proc.text())
    return (int(m.group(1)), float(m.group(2))) if m else None


def summary_field(summary: dict[str, Any] | None, *keys: str) -> Any:
    value: Any = summary
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def assert_stopped_cleanly(procs: Procs, names: list[str], timeout: float = 15.0) -> None:
    """SIGTERM the named roles and require each to exit 0 (a graceful stop) within ``timeout``."""
    for name in names:
        procs[name].signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for name in names:
        rc = procs[name].wait(max(0.1, deadline - time.monotonic()))
        assert rc == 0, f"{name} did not stop cleanly on SIGTERM (rc {rc})\n{procs.describe()}"


# --------------------------------------------------------------------------------------------------
# (a) the whole system learns CartPole


@pytest.mark.slow
@pytest.mark.timeout(330)
def test_local_launcher_solves_cartpole(tmp_path: Path, procs: Procs) -> None:
    run_dir = tmp_path / "run"
    procs.sweep_args.append(str(run_dir))
    started = time.monotonic()
    local = procs.start("local", zmqrl_argv("local", "--actors", "2", "--run-dir", str(run_dir),
                                            overrides=["trainer.min_samples_per_insert=8", "run.seed=0"]))
    rc = local.wait(timeout=240)
    elapsed = time.monotonic() - started

    def diag() -> str:
        logs = "\n".join(f"--- {p.name}\n{log_tail(p, 15)}" for p in sorted((run_dir / "logs").glob("*.log")))
        return f"{procs.describe(40)}\n{logs}"

    assert rc is not None, f"zmqrl local still running after 240 s\n{diag()}"
    assert rc == 0, f"zmqrl local exited with {rc} after {elapsed:.0f}s\n{diag()}"
    print(f"zmqrl local solved CartPole in {elapsed:.1f}s wall")

    summary = read_json(run_dir / "summary.json")
    assert summary is not None, f"no summary.json\n{diag()}"
    assert summary["best_eval_return"] is not None and summary["best_eval_return"] >= 475, \
        f"best eval return {summary['best_eval_return']} < 475 ({summary['stop_reason']})\n{diag()}"
    assert "stop_return" in summary["stop_reason"], summary["stop_reason"]
    assert {"sample", "update", "priorities", "insert", "publish", "other"} <= set(summary["compute_cost"])
    assert 0.99 <= sum(summary["compute_cost"].values()) <= 1.01, summary["compute_cost"]
    assert summary["transitions_inserted_per_s"] > 0 and summary["replay_samples_per_s"] > 0
    solving = next(e for e in summary["evals"] if e["return_mean"] >= 475)
    assert summary["solved"]["opt_steps"] == solving["opt_steps"] <= summary["opt_steps"]  # the model's step

    actors = summary.get("actors", {})
    for name in ("actor-0", "actor-1"):
        assert name in actors, f"no per-actor stats for {name} in summary: {sorted(actors)}"
        assert actors[name]["batches"] > 0 and actors[name]["env_steps"] > 0, actors[name]
        assert actors[name]["host"] and actors[name]["model_updates"] > 0, actors[name]  # (not on every batch)
        stats = read_json(run_dir / "roles" / f"{name}.json")
        assert stats is not None and stats["sent_seq"] > 0, f"roles/{name}.json: {stats}\n{diag()}"

    lag = summary.get("policy_lag", {})
    for key in ("mean", "p50", "p90", "max", "histogram"):
        assert key in lag, f"policy_lag lacks {key}: {lag}"
    assert sum(lag["histogram"].values()) > 0, lag
    assert lag.get("updates_per_version") == 50, lag  # the config's trainer.sync_interval: lag's unit in updates
    assert summary["messages"]["batches_lost"] == 0, summary["messages"]
    assert summary["messages"]["rejected_total"] == 0, summary["messages"]
    # The start-up quota: each actor makes ~warmup transitions (a few batches more) while the
    # learner loads torch, where without it 4k-18k reached replay before the first update.
    first = read_json(run_dir / "first_update.json")
    assert first is not None and first["replay_size"] <= 2 * (1000 + 4 * 64), first

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    needed = {"perf/env_steps_per_s", "perf/opt_steps_per_s", "perf/samples_per_insert", "perf/policy_lag_mean",
              "perf/model_version", "perf/replay_size", "perf/priority_max", "perf/priority_mean",
              "perf/priorities_clamped", "perf/transitions_inserted_per_s", "perf/replay_samples_per_s",
              "cost/sample", "cost/update", "cost/priorities", "cost/insert", "cost/publish", "cost/other",
              "perf/intake_cpu_s", "perf/bytes_published"}
    assert needed <= tags, f"missing TensorBoard tags {sorted(needed - tags)}; have {sorted(tags)}"

    best = run_dir / "checkpoints" / "best"
    assert best.is_dir() and any(best.iterdir()), f"checkpoints/best missing or empty: {best}"
    assert (best / POLICY_FILE).is_file(), sorted(p.name for p in best.iterdir())  # the evaluator's: no torch
    assert load_policy(run_dir, "best").state["source"] == "evaluator"
    assert not pids_with_arg(str(run_dir)), "processes of the run are still alive after zmqrl local exited"


# --------------------------------------------------------------------------------------------------
# (b) roles started in reverse order still connect


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_roles_started_in_reverse_order_connect(tmp_path: Path, procs: Procs) -> None:
    run_dir, ports = tmp_path / "run", learner_ports()
    overrides = [SEED, "trainer.warmup=500", "trainer.stop_return=null", "trainer.eval_interval=500",
                 "trainer.eval_episodes=2", "actor.num_actors=2"]
    procs.role("evaluator", "evaluator", "--learner", tcp(ports["model"]), "--report", tcp(ports["eval"]),
               "--run-dir", str(run_dir), overrides=overrides)
    for i in (0, 1):
        procs.role(f"actor-{i}", "actor", *actor_args(run_dir, ports, i), overrides=overrides)
    procs.role("proxy", "proxy", *proxy_args(run_dir, ports), overrides=overrides)

    # Everyone but the learner is up, and says it waits for the learner, before the learner starts.
    def peers_waiting() -> bool:
        return (all("waiting for the first model" in procs[f"actor-{i}"].text() for i in (0, 1))
                and "waiting for models" in procs["evaluator"].text()
                and "actors connect to" in procs["proxy"].text())

    wait_for(peers_waiting, 60, "evaluator, actors and proxy to wait for the learner", procs.describe)
    for name in ("evaluator", "actor-0", "actor-1", "proxy"):
        assert procs[name].alive(), f"{name} exited before the learner started\n{procs.describe()}"

    learner = procs.role("learner", "learner", *learner_args(run_dir, ports), overrides=overrides)

    def connected() -> dict[str, Any] | None:
        assert learner.alive(), f"the learner exited\n{procs.describe()}"
        summary = read_json(run_dir / "summary.json")
        actors = summary_field(summary, "actors") or {}
        ok = summary and summary["opt_steps"] > 0 and summary["evals"] and \
            all(actors.get(f"actor-{i}", {}).get("batches", 0) > 0 for i in (0, 1))
        return summary if ok else None

    wait_for(connected, 45, "opt steps, batches from both actors and an evaluation at the learner", procs.describe)
    # The learner stops last, so no role is left talking to a learner that is gone.
    assert_stopped_cleanly(procs, ["evaluator", "actor-0", "actor-1", "proxy"])
    assert_stopped_cleanly(procs, ["learner"])
    summary = read_json(run_dir / "summary.json")
    assert summary is not None and summary["stop_reason"] == "stopped by SIGTERM", summary
    assert summary["opt_steps"] > 0, summary
    for i in (0, 1):
        assert summary["actors"][f"actor-{i}"]["batches"] > 0, summary["actors"]
    assert summary["messages"]["batches_lost"] == 0, summary["messages"]


# --------------------------------------------------------------------------------------------------
# (c) a late joiner gets the current model at once


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_late_actor_gets_current_model_within_a_second(tmp_path: Path, procs: Procs) -> None:
    run_dir, ports = tmp_path / "run", learner_ports()
    # No sync, no periodic republish and no rate-limiter pause/resume (which also re-sends the model)
    # within the test: only the republish on a new subscriber can deliver the model to a late actor.
    overrides = [SEED, "trainer.sync_interval=1000000", "net.republish_s=60", "trainer.min_samples_per_insert=0",
                 "trainer.max_samples_per_insert=0", "trainer.stop_return=null", "trainer.warmup=500",
                 "actor.num_actors=2"]
    procs.role("learner", "learner", *learner_args(run_dir, ports), overrides=overrides)
    procs.role("proxy", "proxy", *proxy_args(run_dir, ports), overrides=overrides)
    procs.role("actor-0", "actor", *actor_args(run_dir, ports, 0), overrides=overrides)
    first = wait_for(lambda: got_model(procs["actor-0"]), 60, "actor-0's first model", procs.describe)

    # The learner is past warm-up and optimising (as its periodically refreshed summary.json shows).
    wait_for(lambda: summary_field(read_json(run_dir / "summary.json"), "opt_steps"), 30,
             "the learner to optimise", procs.describe)
    late = procs.role("actor-1", "actor", *actor_args(run_dir, ports, 1), overrides=overrides)
    version, waited = wait_for(lambda: got_model(late), 30, "actor-1's first model", procs.describe)
    print(f"late actor-1 got model v{version} after {waited:.3f}s of waiting")
    assert waited <= 1.0, f"late actor-1 waited {waited:.2f}s for model v{version}\n{procs.describe()}"
    assert version == first[0], f"actor-1 got v{version}, actor-0 had v{first[0]} (no sync should happen)"
    # And it acts on it: its batches reach the learner.
    wait_for(lambda: summary_field(read_json(run_dir / "summary.json"), "actors", "actor-1", "batches"), 15,
             "batches from actor-1 at the learner", procs.describe)
    assert_stopped_cleanly(procs, ["actor-0", "actor-1", "proxy", "learner"])
    summary = read_json(run_dir / "summary.json")
    assert summary is not None and summary["model_version"] == version, \
        f"the learner moved to version {summary and summary['model_version']}; the test needs no sync"


# --------------------------------------------------------------------------------------------------
# (d) model versions carried by batches increase; sequence numbers are consecutive


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_batch_model_versions_increase(tmp_path: Path, procs: Procs) -> None:
    run_dir, ports = tmp_path / "run", learner_ports()
    overrides = [SEED, "trainer.sync_interval=10", "trainer.warmup=256", "trainer.stop_return=null",
                 "actor.num_actors=2"]
    ctx = zmq.Context()
    # A tap between the proxy and the learner: the proxy forwards to this PULL, the test decodes each
    # message and passes the same frames on to the learner's data socket (so the learner trains).
    tap_in = ctx.socket(zmq.PULL)
    tap_out = ctx.socket(zmq.PUSH)
    for sock in (tap_in, tap_out):
        sock.setsockopt(zmq.LINGER, 0)
    tap_out.setsockopt(zmq.SNDTIMEO, 2000)
    tap_port = tap_in.bind_to_random_port("tcp://127.0.0.1")
    tap_out.connect(tcp(ports["data"]))
    try:
        procs.role("learner", "learner", *learner_args(run_dir, ports), overrides=overrides)
        procs.role("proxy", "proxy", *proxy_args(run_dir, ports, learner_data=tap_port), overrides=overrides)
        for i in (0, 1):
            procs.role(f"actor-{i}", "actor", *actor_args(run_dir, ports, i), overrides=overrides)

        seen: dict[str, list[tuple[str, int, int, int]]] = collections.defaultdict(list)  # inc, seq, ver, max_ver
        limits = Limits.only({BATCH, BUNDLE, STATS})

        def enough() -> bool:
            return len(seen) == 2 and all(len({v for _, _, v, _ in b}) >= 4 and len(b) >= 40 for b in seen.values())

        deadline = time.monotonic() + 60
        while not enough():
            assert time.monotonic() < deadline, \
                f"batches seen: { {k: len(v) for k, v in seen.items()} }, versions " \
                f"{ {k: sorted({x[2] for x in v}) for k, v in seen.items()} }\n{procs.describe()}"
            if not tap_in.poll(100):
                continue
            frames = tap_in.recv_multipart(copy=False)
            try:
                msg = decode(frames, limits)
            except WireError as exc:
                raise AssertionError(f"the proxy forwarded a message that does not decode: {exc}") from None
            for batch in unbundle(msg) if msg.kind == BUNDLE else [msg] if msg.kind == BATCH else []:
                seen[batch.sender].append((batch.incarnation, batch.seq, batch.version,
                                           batch.meta.get("max_version", -1)))
            tap_out.send_multipart(frames, copy=False)

        assert sorted(seen) == ["actor-0", "actor-1"], sorted(seen)
        print({k: (len(v), sorted({x[2] for x in v})) for k, v in seen.items()})
        for sender, batches in seen.items():
            incs = {inc for inc, _, _, _ in batches}
            assert len(incs) == 1, f"{sender}: several incarnations {incs}"
            seqs = [s for _, s, _, _ in batches]
            assert seqs == list(range(len(seqs))), f"{sender}: sequence numbers not 0,1,2,...: {seqs[:50]}"
            versions = [v for _, _, v, _ in batches]
            assert versions == sorted(versions), f"{sender}: versions go back: {versions}"
            assert versions[-1] > versions[0], f"{sender}: versions never increase: {versions}"
            assert all(mx >= v for _, _, v, mx in batches), f"{sender}: meta max_version below version: {batches}"

        assert_stopped_cleanly(procs, ["actor-0", "actor-1", "proxy", "learner"])
        summary = read_json(run_dir / "summary.json")
        assert summary is not None, procs.describe()
        assert summary["model_version"] >= 5, summary["model_version"]
        lag = summary.get("policy_lag", {})
        assert {"mean", "p50", "p90", "max"} <= set(lag) and lag["max"] >= 0, lag
        assert lag["other_line_batches"] == 0, lag
    finally:
        tap_in.close(linger=0)
        tap_out.close(linger=0)
        ctx.term()


# --------------------------------------------------------------------------------------------------
# (e) exact accounting: sent = received + lost


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_batch_accounting_is_exact(tmp_path: Path, procs: Procs) -> None:
    run_dir, ports = tmp_path / "run", learner_ports()
    overrides = [SEED, "trainer.stop_return=null", "trainer.warmup=500", "actor.num_actors=2"]
    procs.role("learner", "learner", *learner_args(run_dir, ports), overrides=overrides)
    procs.role("proxy", "proxy", *proxy_args(run_dir, ports), overrides=overrides)
    for i in (0, 1):
        procs.role(f"actor-{i}", "actor", *actor_args(run_dir, ports, i), overrides=overrides)

    def both_sending() -> bool:
        actors = summary_field(read_json(run_dir / "summary.json"), "actors") or {}
        return all(actors.get(f"actor-{i}", {}).get("batches", 0) >= 20 for i in (0, 1))

    wait_for(both_sending, 60, "20 batches from each actor at the learner", procs.describe)
    assert_stopped_cleanly(procs, ["actor-0", "actor-1"])
    sent = {}
    for i in (0, 1):
        stats = read_json(run_dir / "roles" / f"actor-{i}.json")
        assert stats is not None, f"no roles/actor-{i}.json after a graceful stop\n{procs.describe()}"
        sent[f"actor-{i}"] = stats["sent_seq"]
        assert stats["batches"] == stats["sent_seq"], stats
    total = sum(sent.values())

    def learner_caught_up() -> bool:
        msgs = summary_field(read_json(run_dir / "summary.json"), "messages") or {}
        return msgs.get("batches_received", 0) + msgs.get("batches_lost", 0) >= total

    wait_for(learner_caught_up, 20, f"the learner's summary to account for all {total} batches sent",
             procs.describe)
    assert_stopped_cleanly(procs, ["proxy"])  # first, so it has nothing left to forward when the learner stops
    assert_stopped_cleanly(procs, ["learner"])

    summary = read_json(run_dir / "summary.json")
    assert summary is not None and summary["stop_reason"] == "stopped by SIGTERM", summary
    msgs = summary["messages"]
    assert msgs["batches_received"] + msgs["batches_lost"] == total, \
        f"actors sent {sent} = {total}; learner received {msgs['batches_received']}, lost {msgs['batches_lost']}"
    assert msgs["batches_lost"] == 0 and msgs["batches_dropped_old"] == 0 and msgs["rejected_total"] == 0, msgs
    for name, n in sent.items():
        assert summary["actors"][name]["batches"] + summary["actors"][name]["lost"] == n, (name, summary["actors"])

    proxy = read_json(run_dir / "roles" / "proxy.json")
    assert proxy is not None, procs.describe()
    assert proxy["forwarded"] == msgs["batches_received"] + msgs["batches_lost"], (proxy, msgs)
    assert proxy["rejected_total"] == 0, proxy
    for name, n in sent.items():
        counts = proxy["actors"].get(name, {})
        assert counts.get("batches", 0) + counts.get("lost", 0) == n, (name, counts, n)


# --------------------------------------------------------------------------------------------------
# (f), (g) the local launcher: clean stop on SIGTERM, and a dead role stops the run


def start_local(procs: Procs, run_dir: Path, *extra: str, flags: tuple[str, ...] = ()) -> Proc:
    procs.sweep_args.append(str(run_dir))
    # eval_interval 2000: after its first evaluation (of version 0) the evaluator stays idle for a few
    # seconds, so a SIGTERM does not find it mid-evaluation (see test_evaluator_stops_when_learner_is_gone).
    overrides = [SEED, "trainer.stop_return=null", "trainer.warmup=500", "trainer.eval_interval=2000",
                 "trainer.eval_episodes=2", *extra]
    return procs.start("local", zmqrl_argv("local", "--actors", "2", "--run-dir", str(run_dir), *flags,
                                           overrides=overrides))


def wait_local_running(procs: Procs, run_dir: Path) -> dict[str, int]:
    """Wait until both actors act and the evaluator has evaluated and saved; return {role: pid} of the children."""
    logs = run_dir / "logs"

    def diag() -> str:
        roles = "\n".join(f"--- {p.name}\n{log_tail(p, 15)}" for p in sorted(logs.glob("*.log")))
        return f"{procs.describe()}\n{roles}"

    def running() -> bool:
        def has(name: str, text: str) -> bool:
            try:
                return text in (logs / f"{name}.log").read_text(errors="replace")
            except OSError:
                return False
        # checkpoints/best appears (atomically) once the evaluator has saved its first best model:
        # from then on it is idle until the learner reaches trainer.eval_interval.
        return has("actor-0", "got model version") and has("actor-1", "got model version") and \
            has("evaluator", "evaluator: model v") and (run_dir / "checkpoints" / "best").is_dir()

    wait_for(running, 60, "every role of zmqrl local to run", diag)
    assert procs["local"].alive(), diag()
    children = {}
    for pid in pids_with_arg(str(run_dir)):
        argv = cmdline(pid)
        if pid == procs["local"].pid or "zmqrl.cli" not in argv:
            continue
        role = argv[argv.index("zmqrl.cli") + 1]
        children[f"{role}-{argv[argv.index('--id') + 1]}" if role == "actor" else role] = pid
    assert sorted(children) == ["actor-0", "actor-1", "evaluator", "learner", "proxy"], (children, diag())
    return children


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_local_launcher_sigterm_stops_every_role(tmp_path: Path, procs: Procs) -> None:
    run_dir = tmp_path / "run"
    local = start_local(procs, run_dir)
    children = wait_local_running(procs, run_dir)

    local.signal(signal.SIGTERM)
    sent = time.monotonic()
    wait_for(lambda: not any(alive(p) for p in children.values()), 5.0,
             "every child of zmqrl local to stop within 5 s of SIGTERM",
             lambda: f"alive: {[n for n, p in children.items() if alive(p)]}\n{procs.describe()}", interval=0.05)
    stopped_in = time.monotonic() - sent
    rc = local.wait(timeout=10)
    assert rc == 0, f"zmqrl local exited with {rc} after SIGTERM\n{procs.describe()}"
    assert not pids_with_arg(str(run_dir)), "orphans: processes of the run survive the launcher"
    # Each role stopped gracefully (not killed): its stats file and the learner's final summary exist.
    for name in ("actor-0", "actor-1", "proxy", "evaluator"):
        assert (run_dir / "roles" / f"{name}.json").exists(), f"{name} wrote no roles/{name}.json: killed?"
    summary = read_json(run_dir / "summary.json")
    assert summary is not None and summary["stop_reason"] == "stopped by SIGTERM", summary
    assert "did not stop within" not in local.text(), local.tail()
    print(f"children stopped {stopped_in:.2f}s after SIGTERM")


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_local_launcher_reports_a_dead_role(tmp_path: Path, procs: Procs) -> None:
    """With --fail-fast a dead role ends the run (without it the role is restarted: tests/roles/test_supervision.py)."""
    run_dir = tmp_path / "run"
    local = start_local(procs, run_dir, flags=("--fail-fast",))
    children = wait_local_running(procs, run_dir)

    os.kill(children["actor-0"], signal.SIGKILL)
    rc = local.wait(timeout=20)
    assert rc is not None, f"zmqrl local still running 20 s after actor-0 was killed\n{procs.describe()}"
    assert rc != 0, f"zmqrl local exited 0 although actor-0 died\n{procs.describe()}"
    out = local.text()
    assert re.search(r"actor-0 exited with code -9", out), f"launcher output does not name actor-0:\n{out}"
    actor_log = (run_dir / "logs" / "actor-0.log").read_text(errors="replace").strip().splitlines()
    assert actor_log and actor_log[-1].strip() in out, \
        f"launcher output lacks actor-0's log tail ({actor_log[-1:]}):\n{out}"
    wait_for(lambda: not pids_with_arg(str(run_dir)), 5, "every role to stop after the launcher exited",
             lambda: str({p: cmdline(p) for p in pids_with_arg(str(run_dir))}))
    for name in ("actor-1", "proxy", "evaluator"):
        assert (run_dir / "roles" / f"{name}.json").exists(), f"{name} was not stopped gracefully"


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_local_launcher_starts_over_when_a_port_is_taken(tmp_path: Path, procs: Procs,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A port handed to the learner is taken before it binds: the run starts again on new ports and trains."""
    from zmqrl import config as config_mod
    from zmqrl.roles.launch import local

    run_dir = tmp_path / "run"
    procs.sweep_args.append(str(run_dir))
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    handed: list[int] = []

    def first_one_taken(host: str = "127.0.0.1") -> int:
        handed.append(taken if not handed else free_port(host))
        return handed[-1]

    monkeypatch.setattr(local, "free_port", first_one_taken)
    overrides = [SEED, "trainer.stop_return=null", "trainer.warmup=300", "trainer.max_opts=200"]
    cfg = config_mod.load("configs/cartpole_dqn.yaml", [*overrides, "actor.num_actors=1"])
    try:
        with caplog.at_level(logging.INFO, logger="zmqrl"):
            code = local.run_local(cfg, "configs/cartpole_dqn.yaml", overrides, 1, str(run_dir), evaluator=False)
    finally:
        squatter.close()
    assert code == 0, caplog.text
    assert "learner found its port taken by another process (attempt 1 of 3)" in caplog.text, caplog.text
    endpoints = read_json(run_dir / "endpoints.json")
    assert endpoints is not None and endpoints["learner"]["data"] != tcp(taken), endpoints
    summary = read_json(run_dir / "summary.json")
    assert summary is not None and summary["opt_steps"] >= 200 and summary["stop_reason"] != "", summary
    assert not pids_with_arg(str(run_dir)), "processes of the run are still alive after run_local returned"


# --------------------------------------------------------------------------------------------------
# (h) the evaluator stops on SIGTERM even when the learner it reports to is gone
#     (regression: a blocking send of the report to a gone learner hung it, SIGTERM included; fixed in 7f1c613)


def py_spy_stack(pid: int) -> str | None:
    """The Python stack of ``pid`` from py-spy, or None where py-spy is missing or not allowed to look."""
    py_spy = Path(sys.executable).with_name("py-spy")
    if not py_spy.exists():
        return None
    try:
        out = subprocess.run([str(py_spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_evaluator_stops_when_learner_is_gone(tmp_path: Path, procs: Procs, cartpole_cfg: Any) -> None:
    from zmqrl.run.acting import make_task
    from zmqrl.wire import encode_model, new_incarnation

    cfg = cartpole_cfg(SEED)
    params = make_task(cfg).agent(seed=7).params()
    model = encode_model("learner", new_incarnation(), 0, params, meta={"opt_steps": 0, "pause": False})
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)  # the test plays the learner's model stream; nobody listens on the report address
    pub.setsockopt(zmq.LINGER, 0)
    try:
        model_port = pub.bind_to_random_port("tcp://127.0.0.1")
        evaluator = procs.role("evaluator", "evaluator", "--learner", tcp(model_port), "--report", tcp(free_port()),
                               "--run-dir", str(tmp_path / "run"), overrides=[SEED, "trainer.eval_episodes=1"])

        def evaluated_or_stuck() -> bool:
            pub.send_multipart(model)
            if "evaluator: model v0" in evaluator.text():
                return True  # the report went out (or was dropped) and the evaluator carried on
            assert evaluator.alive(), evaluator.tail()
            # A regression blocks in the send and never logs: py-spy (where it may look) shows it at once;
            # without py-spy the wait below times out instead, and the test fails either way.
            stack = py_spy_stack(evaluator.pid) or ""
            return "send_frames" in stack and "Evaluator.step" in stack

        wait_for(evaluated_or_stuck, 60, "the evaluator to evaluate model v0", procs.describe, interval=0.2)
        evaluator.signal(signal.SIGTERM)
        rc = evaluator.wait(timeout=10)
        stack = py_spy_stack(evaluator.pid) if rc is None else ""
        assert rc == 0, f"evaluator still running 10 s after SIGTERM (rc {rc}); stack:\n{stack}\n{evaluator.tail()}"
        stats = read_json(tmp_path / "run" / "roles" / "evaluator.json")
        assert stats is not None and stats["evaluated"] >= 1, f"roles/evaluator.json: {stats}\n{evaluator.tail()}"
    finally:
        pub.close(linger=0)
        ctx.term()
