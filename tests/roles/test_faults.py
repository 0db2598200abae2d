"""Faults: processes killed with SIGKILL, graceful shutdown with peers gone, bad input from rogue peers.

Real role processes on 127.0.0.1 random ports. Summaries refresh every 0.5 s here
(``net.stats_interval_s``) so the tests can watch counters move.
"""

from __future__ import annotations

import os
import pickle
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from procs import Proc, Procs, wait_for
from zmqrl.roles.addresses import free_port
from zmqrl.run.rundir import read_json
from zmqrl.wire import encode

FAST = ["net.stats_interval_s=0.5", "trainer.warmup=200", "trainer.stop_return=null", "trainer.max_opts=10000000",
        "trainer.eval_interval=100000", "actor.n_buffer=64"]


class Job:
    """Addresses and process starters for one hand-wired distributed job."""

    def __init__(self, procs: Procs, run_dir: Path, extra: list[str] | None = None) -> None:
        self.procs, self.run_dir = procs, run_dir
        self.ports = {k: free_port() for k in ("data", "model", "eval", "proxy")}
        self.overrides = FAST + (extra or [])

    def addr(self, key: str) -> str:
        return f"tcp://127.0.0.1:{self.ports[key]}"

    def learner(self, name: str = "learner", *extra: str) -> Proc:
        return self.procs.role(name, "learner", "--run-dir", str(self.run_dir), "--bind-data", self.addr("data"),
                               "--bind-model", self.addr("model"), "--bind-eval", self.addr("eval"), *extra,
                               overrides=self.overrides)

    def proxy(self, name: str = "proxy") -> Proc:
        return self.procs.role(name, "proxy", "--bind", self.addr("proxy"), "--learner", self.addr("data"),
                               "--run-dir", str(self.run_dir), overrides=self.overrides)

    def actor(self, index: int, name: str | None = None) -> Proc:
        return self.procs.role(name or f"actor-{index}", "actor", "--id", str(index), "--proxy", self.addr("proxy"),
                               "--learner", self.addr("model"), "--run-dir", str(self.run_dir),
                               overrides=self.overrides + ["actor.num_actors=2"])

    def summary(self) -> dict[str, Any]:
        return read_json(self.run_dir / "summary.json") or {}

    def received(self, actor: str | None = None) -> int:
        s = self.summary()
        if actor is None:
            return int(s.get("messages", {}).get("batches_received", 0))
        return int(s.get("actors", {}).get(actor, {}).get("batches", 0))

    def opt_steps(self) -> int:
        return int(self.summary().get("opt_steps", 0))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_actor_killed_learner_keeps_training_and_restarted_actor_rejoins(tmp_path: Path, procs: Procs) -> None:
    job = Job(procs, tmp_path / "run")
    job.learner(), job.proxy(), job.actor(0), job.actor(1)
    wait_for(lambda: job.received("actor-0") > 0 and job.received("actor-1") > 0 and job.opt_steps() > 0, 60,
             "batches from both actors", procs.describe)
    procs["actor-1"].kill()
    assert procs["actor-1"].wait(10) is not None
    before = job.opt_steps()
    wait_for(lambda: job.opt_steps() > before + 200, 30, "training to go on without actor-1", procs.describe)

    job.actor(1, name="actor-1-again")
    wait_for(lambda: job.summary().get("actors", {}).get("actor-1", {}).get("incarnations") == 2, 60,
             "the restarted actor-1 (a new incarnation) to be accepted", procs.describe)
    after = job.received("actor-1")
    wait_for(lambda: job.received("actor-1") > after + 5, 30, "more batches from the new actor-1", procs.describe)
    assert procs["learner"].alive() and procs["actor-0"].alive()
    print(f"after actor SIGKILL: {job.summary()['messages']}, actor-1 {job.summary()['actors']['actor-1']}")


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_proxy_killed_actor_blocks_bounded_and_resumes_with_exact_accounting(tmp_path: Path, procs: Procs) -> None:
    job = Job(procs, tmp_path / "run")
    job.learner(), job.proxy(), job.actor(0)
    wait_for(lambda: job.received("actor-0") > 20, 60, "batches from actor-0", procs.describe)
    actor = procs["actor-0"]
    procs["proxy"].kill()
    assert procs["proxy"].wait(10) is not None
    rss_before = rss_mb(actor.pid)
    wait_for(lambda: "is not taking batches" in actor.text(), 30, "actor-0 to notice the proxy is gone", procs.describe)
    stalled = job.received("actor-0")
    deadline = time.monotonic() + 4.0  # the outage: the actor must hold still, not buffer without bound
    while time.monotonic() < deadline:
        assert actor.alive(), procs.describe()
        time.sleep(0.2)
    assert rss_mb(actor.pid) - rss_before < 20, "actor memory grew while the proxy was away"

    job.proxy(name="proxy-again")
    wait_for(lambda: job.received("actor-0") > stalled + 20, 60, "batches to flow again through the new proxy",
             procs.describe)
    assert actor.stop(10) == 0, procs.describe(names=["actor-0"])
    sent = read_json(job.run_dir / "roles" / "actor-0.json")
    assert sent is not None and sent["blocked_s"] > 1.0, sent
    wait_for(lambda: job.received() + job.summary()["messages"]["batches_lost"] >= sent["sent_seq"], 30,
             "the learner to account for every batch actor-0 sent", procs.describe)
    assert procs["learner"].stop(15) == 0
    final = job.summary()["messages"]
    assert final["batches_received"] + final["batches_lost"] == sent["sent_seq"], (final, sent)
    print(f"after proxy SIGKILL: sent {sent['sent_seq']}, {final}")


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_learner_killed_resumes_from_latest_and_actors_follow(tmp_path: Path, procs: Procs) -> None:
    job = Job(procs, tmp_path / "run", ["trainer.latest_interval_s=1", "trainer.sync_interval=20"])
    job.learner(), job.proxy(), job.actor(0)
    latest = job.run_dir / "checkpoints" / "latest" / "state.json"
    wait_for(lambda: (read_json(latest) or {}).get("opt_steps", 0) > 300, 90, "a latest checkpoint past 300 steps",
             procs.describe)
    procs["learner"].kill()
    assert procs["learner"].wait(10) is not None
    saved = read_json(latest)
    assert saved is not None

    job.learner("learner-resumed", "--resume")
    resumed = procs["learner-resumed"]
    wait_for(lambda: "resumed from" in resumed.text(), 60, "the resume log line", procs.describe)
    wait_for(lambda: job.summary().get("model_version", 0) > saved["version"] + 5 and job.received() > 10, 60,
             "versions past the checkpoint's and batches from the running actor", procs.describe)
    summary = job.summary()
    assert summary["opt_steps"] > saved["opt_steps"]
    assert procs["actor-0"].alive() and procs["proxy"].alive(), "actor and proxy must ride through the restart"
    wait_for(lambda: job.summary().get("policy_lag", {}).get("mean") is not None, 30,
             "batches stamped with the resumed learner's versions", procs.describe)
    print(f"after learner SIGKILL: checkpoint opt {saved['opt_steps']} v{saved['version']}; resumed: "
          f"opt {job.summary()['opt_steps']} v{job.summary()['model_version']}, {job.summary()['messages']}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("role", ["actor", "proxy", "learner", "evaluator"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.slow
def test_role_stops_within_5s_when_its_peers_are_gone(tmp_path: Path, procs: Procs, role: str, sig: int) -> None:
    job = Job(procs, tmp_path / "run")
    if role == "actor":
        proc = job.actor(0)
    elif role == "proxy":
        proc = job.proxy()
    elif role == "learner":
        proc = job.learner()
    else:
        proc = procs.role("evaluator", "evaluator", "--learner", job.addr("model"), "--report", job.addr("eval"),
                          "--run-dir", str(job.run_dir), overrides=job.overrides)
    ready = {"actor": "waiting for the first model", "proxy": "actors connect to", "learner": "learner: ready",
             "evaluator": "waiting for models"}[role]
    wait_for(lambda: ready in proc.text(), 60, f"{role} to be up", procs.describe)
    started = time.monotonic()
    proc.signal(sig)
    code = proc.wait(5.0)
    assert code == 0, f"{role} exit {code} after {time.monotonic() - started:.1f}s\n{proc.tail()}"
    if role == "learner":
        assert (job.run_dir / "summary.json").is_file() and (job.run_dir / "checkpoints" / "latest").is_dir()


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_resume_from_corrupt_checkpoint_names_the_file_and_keeps_it(tmp_path: Path, procs: Procs) -> None:
    run_dir = tmp_path / "run"
    latest = run_dir / "checkpoints" / "latest"
    latest.mkdir(parents=True)
    (latest / "state.json").write_text('{"opt_steps": 5}')
    (latest / "agent.pt").write_bytes(os.urandom(512))
    (run_dir / "config.yaml").write_text("# the config of the run that wrote this checkpoint\n")

    def tree() -> dict[str, tuple[bytes, int]]:
        return {str(p.relative_to(run_dir)): (p.read_bytes(), p.stat().st_mtime_ns)
                for p in sorted(run_dir.rglob("*")) if p.is_file()}

    before = tree()
    job = Job(procs, run_dir)
    proc = job.learner("learner", "--resume")
    assert proc.wait(60) == 2, proc.tail()
    assert str(latest / "agent.pt") in proc.text() and "Traceback" not in proc.text(), proc.tail()
    logs = {k for k in tree() if k.startswith("logs/")}  # the test's own log files of the role
    assert {k: v for k, v in tree().items() if k not in logs} == before, "nothing in the run dir may change"

    missing = Job(procs, tmp_path / "empty").learner("learner-missing", "--resume")
    assert missing.wait(60) == 2, missing.tail()
    assert "checkpoints/latest" in missing.text() and "Traceback" not in missing.text(), missing.tail()


class Bomb:
    """Unpickling this creates a marker file: proof that something unpickled network bytes."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_rogue_flood_is_rejected_while_valid_peers_keep_training(tmp_path: Path, procs: Procs) -> None:
    job = Job(procs, tmp_path / "run")
    job.learner(), job.proxy(), job.actor(0)
    wait_for(lambda: job.received("actor-0") > 10 and job.opt_steps() > 0, 60, "training", procs.describe)
    marker = tmp_path / "unpickled"
    bomb = pickle.dumps(Bomb(str(marker)))
    header_ok = encode("batch", sender="rogue", incarnation="r", seq=0, arrays={"reward": np.zeros(3, np.float32)})
    garbage: list[list[bytes]] = [
        [bomb], [bomb, b"x"], [os.urandom(64)], [b"{}"], [b'{"p":"zmqrl","v":99}'],
        [bytes(header_ok[0]), b"short"],  # frame length does not match the header
        [bytes(header_ok[0])],  # missing frame
        [b"\x00" * 70_000],  # oversized header
    ]
    ctx = zmq.Context()
    sent = 0
    try:
        socks = []
        for key in ("proxy", "data", "eval"):
            s = ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, 1000)
            s.connect(job.addr(key))
            socks.append(s)
        before = job.received("actor-0")
        for i in range(3000):  # bounded flood
            for s in socks:
                try:
                    s.send_multipart(garbage[i % len(garbage)], zmq.NOBLOCK)
                    sent += 1
                except zmq.Again:
                    pass
    finally:
        ctx.destroy(linger=0)
    assert sent > 1000
    wait_for(lambda: job.received("actor-0") > before + 20, 60, "valid batches to keep arriving", procs.describe)
    wait_for(lambda: job.summary().get("messages", {}).get("rejected_total", 0) > 100
             and job.summary().get("proxies", {}).get("proxy", {}).get("rejected_total", 0) > 100, 30,
             "rejections from the learner and the proxy in summary.json", procs.describe)
    assert procs["learner"].alive() and procs["proxy"].alive() and procs["actor-0"].alive()
    assert not marker.exists(), "network bytes were unpickled"
