"""The scale bench's simulated actors against the real learner and relays: 64 actors over 4 hosts.

The quick-tier test runs every part in this process, each on threads of its own with its own ZeroMQ
context (the quick tier starts no process): the real :class:`~zmqrl.roles.learner.Learner` (its loop,
intake and publisher), per host a real :class:`~zmqrl.roles.proxy.Proxy` with its relay, bound on
the host's own loopback address, and the group's :func:`~zmqrl.bench.scale_hosts.sim_host` with 16
simulated actors. What it checks is what the group measures at scale: every actor gets the newest
version through its relay, the learner sends a model per version to each relay and no more, and
every actor's transitions reach replay. The slow test runs the group's own measurement (processes:
``zmqrl learner``, ``zmqrl proxy --relay``, the simulated hosts) at its smallest size.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from zmqrl import config
from zmqrl.bench import harness, registry, scale
from zmqrl.bench.data import TRANSITION_KEYS, transition_pool
from zmqrl.bench.feeders import save_messages
from zmqrl.bench.scale_hosts import sim_host
from zmqrl.roles.addresses import free_port
from zmqrl.roles.learner import Learner
from zmqrl.roles.proxy import Proxy

REPO = Path(__file__).resolve().parents[2]
CARTPOLE = REPO / "configs" / "cartpole_dqn.yaml"
HOSTS, PER_HOST = 4, 16
N_BUFFER = 16
RATE = 16.0  # transitions/s each simulated actor offers: a batch a second
OVERRIDES = ["run.seed=0", "run.device=cpu", "run.log_level=warning", "trainer.stop_return=null",
             "trainer.save_interval=0", "trainer.warmup=256", "trainer.sync_interval=10",
             "trainer.min_samples_per_insert=0", "trainer.max_samples_per_insert=2", f"actor.n_buffer={N_BUFFER}",
             "net.stats_interval_s=0.5"]


class Flag:
    """A stop flag the roles' loops read (``set``), set by the test."""

    def __init__(self) -> None:
        self.set = False
        self.signal_name = ""


def tcp(host: str = "127.0.0.1") -> str:
    return f"tcp://{host}:{free_port(host)}"


def wait_for(what: str, cond: Callable[[], bool], timeout_s: float, threads: list[threading.Thread]) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert all(t.is_alive() for t in threads), f"a thread ended while waiting for {what}"
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f}s"
        time.sleep(0.02)


def test_scale_is_a_group_with_a_plan_per_mode() -> None:
    assert registry.group("scale") is scale.run
    assert scale.PLANS["full"].cartpole == (8, 64, 256, 1024)
    assert all(scale.SHAPES[n][0] * scale.SHAPES[n][1] == n for n in scale.SHAPES)
    assert scale.PLANS["smoke"].cartpole == (8,)
    assert len({scale.host_ip(h) for h in range(64)}) == 64 and scale.host_ip(0) == "127.0.0.2"


def test_reach_and_fairness_figures() -> None:
    published = {3: 10.0, 4: 11.0, 5: 30.0}  # version 5 outside the window
    actors = [{"versions": [[3, 10.05], [4, 11.2]]}, {"versions": [[4, 10.5]]}]  # the second skipped 3 for 4
    reach, missed = scale.version_reach(published, (9.0, 20.0), actors)
    assert reach == pytest.approx([0.5, 0.2]) and missed == 0  # 99% of two: both
    reach, missed = scale.version_reach({6: 12.0}, (9.0, 20.0), actors)
    assert reach == [float("inf")] and missed == 2
    pauses = [(7, True, 20.0), (9, False, 21.0), (12, True, 22.0), (13, False, 22.1)]  # the second too short
    actors = [{"pauses": [[7, True, 20.01]]}, {"pauses": [[8, True, 20.1]]}]
    assert scale.pause_reach(pauses, 19.0, actors) == pytest.approx([0.1])
    assert scale.jain([5, 5, 5, 5]) == pytest.approx(1.0)
    assert scale.jain([1, 0, 0, 0]) == pytest.approx(0.25)
    assert scale.jain([0, 0]) is None


@pytest.mark.timeout(120)
def test_64_simulated_actors_over_4_hosts_through_the_real_learner_and_relays(tmp_path: Path) -> None:
    cfg = config.load(CARTPOLE, OVERRIDES)
    pool = transition_pool(cfg, 512, seed=1)
    pool["priority"] = np.random.default_rng(1).uniform(0.1, 1.0, 512).astype(np.float32)
    messages = save_messages(tmp_path / "messages.npz", [{k: pool[k][lo:lo + N_BUFFER] for k in
                                                          (*TRANSITION_KEYS, "priority")}
                                                         for lo in range(0, 512, N_BUFFER)])
    data, model, evals, snap = tcp(), tcp(), tcp(), tcp()
    learner = Learner(cfg, tmp_path / "run", data, model, evals, bind_snapshot=snap)
    flags: list[Flag] = []
    threads: list[threading.Thread] = []
    results: dict[int, dict[str, Any]] = {}
    proxies: list[Proxy] = []
    ctx = zmq.Context(io_threads=1)
    rates = ctx.socket(zmq.PUB)
    rates_addr = f"tcp://127.0.0.1:{rates.bind_to_random_port('tcp://127.0.0.1')}"
    reports = ctx.socket(zmq.PULL)
    reports_addr = f"tcp://127.0.0.1:{reports.bind_to_random_port('tcp://127.0.0.1')}"

    def start(target: Callable[[Flag], Any], name: str) -> None:
        flag = Flag()
        flags.append(flag)
        thread = threading.Thread(target=target, args=(flag,), name=name, daemon=True)
        threads.append(thread)
        thread.start()

    try:
        start(learner.run, "learner")
        for h in range(HOSTS):
            ip = scale.host_ip(h)
            bind, stream, snapshot = tcp(ip), tcp(ip), tcp(ip)
            proxy = Proxy(cfg, bind, data, f"host-{h}", model_addr=model, snapshot_addr=snap, relay=(stream, snapshot))
            proxies.append(proxy)
            start(proxy.run, f"proxy-{h}")
            params = {"config": str(CARTPOLE), "overrides": OVERRIDES, "messages": str(messages), "host": h,
                      "first": h * PER_HOST, "count": PER_HOST, "proxy": bind, "stream": stream, "snapshot": snapshot,
                      "control": rates_addr, "report": reports_addr, "n_buffer": N_BUFFER, "sndhwm": 4,
                      "timeout_s": 100.0}
            start(lambda flag, p=params: results.__setitem__(p["host"], sim_host(p, flag)), f"host-{h}")
        ready: set[int] = set()

        def all_ready() -> bool:
            rates.send_json({"rate": RATE})
            while reports.poll(0):
                ready.add(int(reports.recv_json()["ready"]))  # type: ignore[index,call-overload]
            return len(ready) == HOSTS

        wait_for("every simulated actor holding a model", all_ready, 60.0, threads)
        names = {f"sim-{i}" for i in range(HOSTS * PER_HOST)}

        def accepted() -> set[str]:
            try:
                return {name for name, a in learner.peers.actors.items() if a.transitions > 0}
            except RuntimeError:  # (the learner's loop added a peer meanwhile) look again next time
                return set()

        wait_for("transitions from every simulated actor in replay", lambda: names <= accepted(), 60.0, threads)
        versions = learner.book.version
        wait_for("three versions more", lambda: learner.book.version >= versions + 3, 60.0, threads)
        rates.send_json({"rate": 0.0})
        newest = learner.book.version

        holding: set[int] = set()

        def every_actor_holds() -> bool:
            rates.send_json({"want": newest})
            while reports.poll(0):
                report = reports.recv_json()
                if isinstance(report, dict) and report.get("version") == newest:
                    holding.add(int(report["holding"]))
            return len(holding) == HOSTS

        wait_for("every simulated actor holding the newest version", every_actor_holds, 30.0, threads)
    finally:
        for flag in flags[1 + HOSTS:]:  # the simulated hosts first, then the proxies, then the learner
            flag.set = True
        for thread in threads[1 + HOSTS:]:
            thread.join(30.0)
        for flag in flags:
            flag.set = True
        for thread in threads:
            thread.join(30.0)
        stats = learner.publisher.stats()
        for proxy in proxies:
            proxy.close()
        learner.close()
        rates.close(linger=0)
        reports.close(linger=0)
        ctx.term()
    assert not any(t.is_alive() for t in threads)
    actors = [a for h in range(HOSTS) for a in results[h]["actors"]]
    assert len(actors) == HOSTS * PER_HOST and {a["name"] for a in actors} == names
    # every simulated actor got the newest version (through its host's relay)
    assert all(max(v for v, _ in a["versions"]) >= newest for a in actors), [a["versions"][-1:] for a in actors]
    # transitions were accepted from every actor, none refused or lost
    assert names <= accepted()
    assert learner.intake.summary()["rejected_total"] == 0
    # the learner's model bytes per version: one model to each relay (its only model subscribers), plus snapshots
    model_size = stats["model_bytes"] / max(stats["models_published"], 1)
    assert stats["model_subscriptions"] == HOSTS, stats
    sent = stats["model_bytes"] * stats["model_subscriptions"] + stats["snapshot_model_bytes"]
    assert sent / stats["model_versions_sent"] <= (HOSTS + 1) * model_size, stats
    assert sum(a["snapshot_models"] for a in actors) >= HOSTS * PER_HOST  # each actor's first model: its relay's


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_groups_measurement_at_its_smallest(tmp_path: Path) -> None:
    """``scale.measure`` as the group runs it (processes, the probe, ``ss``), 8 actors on one host, and its rows."""
    ctx = harness.Context(harness.Settings.preset("smoke"), tmp_path)
    r = scale.measure(ctx, scale.CARTPOLE, 8, joiners=2)
    assert (r.hosts, r.per_host) == (1, 8) and r.accepted_from == 8 and r.holding_newest == 8
    assert r.rejected == 0 and r.refused == 0 and r.versions > 0 and r.model_bytes > 0
    assert r.version_reach and r.version_missed == 0 and r.fairness is not None
    # the flood made the limiter pause; a pause's reach is measured where one lasted LONG_PAUSE_S (a short
    # flood may only flap), and every actor saw it then
    assert r.pauses_seen > 0 and r.pause_wait_s >= 0.0
    assert all(reach < 5.0 for reach in r.pause_reach), r.pause_reach
    assert len(r.joiner_waits) == 2 and r.joiner_snapshot_bytes == 0  # the relay served them, not the learner
    rows = {row.name: row for row in scale.rows_of([r], r)}
    assert rows["scale_cartpole_dqn_8_intake"].ratio == 1.0
    per_version = scale.model_bytes_per_version(r)
    assert per_version is not None and per_version <= 2 * r.model_bytes * scale.BYTES_SLACK, r
