"""Well-formed but wrong input never breaks a run; a role that does not fit says so; a run ends everywhere.

- A learner knows its batch spec before any batch: a junk first batch is rejected, real ones go in.
- A 1e100 priority is clamped and counted; sampling keeps working.
- A flood of new sender names leaves the learner's tables (and memory) bounded; real actors stay.
- An actor or evaluator whose config does not fit the learner's exits 2 within seconds, naming both
  sides and the key; the learner counts it. Another protocol version is told apart the same way.
- ``--id`` outside ``0..actor.num_actors-1`` is a config error; Ape-X ε per actor index.
- When the learner stops cleanly, the proxy, the actors and the evaluator exit 0 on their own.
"""

from __future__ import annotations

import json
import re
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from batches import batch_frames, cartpole_batch
from procs import Procs, role_env, wait_for, zmqrl_argv
from rigs import in_process_learner, ingest_until, tcp
from zmqrl.agents.base import apex_epsilon
from zmqrl.config import ConfigError
from zmqrl.roles.addresses import free_port
from zmqrl.run.acting import make_task
from zmqrl.run.rundir import read_json
from zmqrl.wire import MODEL, encode, new_incarnation, pack

pytestmark = pytest.mark.timeout(180)


# ------------------------------------------------------------------------- batches and priorities

def test_a_junk_first_batch_cannot_fix_what_replay_stores(tmp_path: Path, cartpole_cfg: Any,
                                                          zctx: zmq.Context) -> None:
    learner = in_process_learner(cartpole_cfg("run.log_level=warning"), tmp_path / "run")
    push = zctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(learner.endpoints["data"])
    try:
        push.send_multipart(batch_frames("rogue", 0, {"junk": np.zeros((1000, 1), np.float32)}))
        wide = cartpole_batch(64, 1)
        wide["obs"] = np.zeros((64, 6), np.float32)  # Acrobot-sized observations
        push.send_multipart(batch_frames("rogue", 1, wide))
        for seq in range(3):
            push.send_multipart(batch_frames("actor-0", seq, cartpole_batch(64, seq)))
        ingest_until(learner, lambda: learner.batches == 3 and sum(learner.intake.receiver.rejected.values()) == 2)
        assert learner.intake.receiver.rejected["schema"] == 2
        assert len(learner.replay) == 3 * 64
        batch = learner.replay.sample(32)  # what the update gets has every field, with this run's shapes
        assert batch["obs"].shape == (32, 4) and batch["action"].dtype == np.int64 and "junk" not in batch
        metrics, _ = learner.agent.update(batch)
        assert np.isfinite(metrics["loss"])
        summary = learner.summary_extra()
        assert summary["messages"]["rejected"]["schema"] == 2 and summary["messages"]["rejected_total"] == 2
    finally:
        push.close(linger=0)
        learner.close()


def test_an_absurd_priority_is_clamped_and_counted_and_sampling_stays_proportional(
        tmp_path: Path, cartpole_cfg: Any, zctx: zmq.Context) -> None:
    learner = in_process_learner(cartpole_cfg("run.log_level=warning", "replay.alpha=1.0"), tmp_path / "run")
    push = zctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(learner.endpoints["data"])
    try:
        # float32 on the wire: 1e30 is finite and absurd (an inf one is refused with its batch)
        push.send_multipart(batch_frames("actor-0", 0, cartpole_batch(64, 0, priority=1e30)))
        push.send_multipart(batch_frames("actor-0", 1, cartpole_batch(64, 1, priority=1.0)))
        push.send_multipart(batch_frames("actor-0", 2, cartpole_batch(64, 2, priority=float("inf"))))
        ingest_until(learner, lambda: learner.batches == 2 and learner.intake.receiver.rejected["values"] == 1)
        replay = learner.replay
        assert replay.priorities_clamped == 64 and len(replay) == 128
        counts = np.bincount(replay.sample(4096)["indices"] // 64, minlength=2)
        # the clamped batch has priority cap (1e6) vs 1.0: nearly every draw is from it, and the tree
        # total is finite, so draws spread over its 64 items instead of sticking to index 0
        assert counts[0] > 4000
        first = replay.sample(4096)["indices"]
        assert len(np.unique(first[first < 64])) > 50
        assert learner.summary_extra()["priorities"]["clamped"] == 64
    finally:
        push.close(linger=0)
        learner.close()


@pytest.mark.slow
def test_a_flood_of_new_sender_names_is_refused_and_memory_stays_flat(tmp_path: Path, cartpole_cfg: Any,
                                                                       zctx: zmq.Context) -> None:
    learner = in_process_learner(cartpole_cfg("run.log_level=warning", "net.max_peers=16"), tmp_path / "run")
    push = zctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.setsockopt(zmq.SNDHWM, 100_000)
    push.connect(learner.endpoints["data"])
    tiny = cartpole_batch(1, 0)
    try:
        push.send_multipart(batch_frames("actor-0", 0, cartpole_batch(64, 0)))
        ingest_until(learner, lambda: learner.batches == 1)

        def flood(start: int, count: int) -> None:
            for k in range(start, start + count):
                push.send_multipart(batch_frames(f"rogue-{k}", 0, tiny, inc=f"x{k}"))
            ingest_until(learner, lambda: learner.intake.sequences.refused + 15 >= start + count, timeout=60)

        flood(0, 2000)
        rss_after_first = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        flood(2000, 20_000)
        rss_after_second = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        push.send_multipart(batch_frames("actor-0", 1, cartpole_batch(64, 1)))
        ingest_until(learner, lambda: (learner.peers.actors.get("actor-0") or object()).__dict__.get("batches") == 2)
        assert len(learner.peers.actors) <= 16 and len(learner.intake.sequences._senders) <= 16
        summary = learner.summary_extra()
        assert summary["messages"]["peers_refused"] >= 22_000 - 15
        assert len(summary["messages"]["refused_names"]) <= 8 and len(summary["actors"]) <= 16
        assert len(learner.ratelog._last) <= learner.ratelog.MAX_KEYS + 1
        # 10x the names did not take 10x the memory (max RSS in KiB; allow 20 MiB of noise)
        assert rss_after_second - rss_after_first < 20 * 1024, (rss_after_first, rss_after_second)
    finally:
        push.close(linger=0)
        learner.close()


# ------------------------------------------------------------------------- roles that do not fit

def learner_cmd(run_dir: Path, ports: dict[str, int], *sets: str) -> list[str]:
    return zmqrl_argv("learner", "--run-dir", str(run_dir), "--bind-data", tcp(ports["data"]),
                      "--bind-model", tcp(ports["model"]), "--bind-eval", tcp(ports["eval"]),
                      overrides=["run.seed=3", *sets])


def ports4() -> dict[str, int]:
    return {k: free_port() for k in ("data", "model", "eval", "proxy")}


@pytest.mark.slow
@pytest.mark.parametrize("sets, named", [
    (("env.id=Acrobot-v1",), r"env.id: 'Acrobot-v1' here, 'CartPole-v1' at the learner"),
    (("agent.hidden=[32, 32]",), r"agent.hidden: \[32, 32\] here, \[256, 256\] at the learner"),
])
def test_an_actor_whose_config_does_not_fit_exits_2_naming_both_sides(
        tmp_path: Path, procs: Procs, sets: tuple[str, ...], named: str) -> None:
    ports = ports4()
    run_dir = tmp_path / "run"
    procs.start("learner", learner_cmd(run_dir, ports, "trainer.max_opts=100000"))
    procs.role("proxy", "proxy", "--bind", tcp(ports["proxy"]), "--learner", tcp(ports["data"]),
               overrides=["run.seed=3"])
    started = time.monotonic()
    actor = procs.role("actor", "actor", "--id", "0", "--proxy", tcp(ports["proxy"]), "--learner",
                       tcp(ports["model"]), overrides=["run.seed=3", *sets])
    rc = actor.wait(60)
    assert rc == 2, f"the mismatched actor should exit 2, got {rc}\n{procs.describe()}"
    assert time.monotonic() - started < 60
    assert re.search(named, actor.text()), actor.tail()
    assert "does not fit this config" in actor.text()

    def learner_counted() -> bool:
        summary = read_json(run_dir / "summary.json") or {}
        return bool(summary.get("messages", {}).get("config_mismatches"))

    wait_for(learner_counted, 30, "the learner to count the mismatch", procs.describe)
    assert re.search(r"actor-0 refused this learner's model", procs["learner"].text())


@pytest.mark.slow
def test_an_evaluator_whose_config_does_not_fit_exits_2(tmp_path: Path, procs: Procs) -> None:
    ports = ports4()
    procs.start("learner", learner_cmd(tmp_path / "run", ports, "trainer.max_opts=100000"))
    ev = procs.role("evaluator", "evaluator", "--learner", tcp(ports["model"]), "--report", tcp(ports["eval"]),
                    overrides=["env.id=Acrobot-v1"])
    assert ev.wait(60) == 2, procs.describe()
    assert "env.id: 'Acrobot-v1' here, 'CartPole-v1' at the learner" in ev.text()


@pytest.mark.slow
def test_an_actor_told_another_protocol_version_exits_2(tmp_path: Path, procs: Procs, cartpole_cfg: Any,
                                                        zctx: zmq.Context) -> None:
    """A learner from a zmqrl with another wire protocol: the actor says so instead of waiting forever."""
    model_port = free_port()
    pub = zctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(tcp(model_port))
    params = make_task(cartpole_cfg()).initial_params()
    assert params is not None
    parts = encode(MODEL, sender="learner", incarnation=new_incarnation(), seq=0, version=0, arrays=params)
    header = json.loads(bytes(parts[0]))
    header["v"] = 99  # a protocol version this zmqrl does not speak
    future = pack([json.dumps(header).encode(), *parts[1:]])
    actor = procs.role("actor", "actor", "--id", "0", "--proxy", tcp(free_port()), "--learner", tcp(model_port))
    deadline = time.monotonic() + 60
    while actor.alive() and time.monotonic() < deadline:
        pub.send(future)
        time.sleep(0.1)  # a publisher's cadence, not a synchronisation: the actor may join at any time
    assert actor.wait(10) == 2, actor.tail()
    assert "speaks another protocol version" in actor.text()


# ------------------------------------------------------------------------- ids and exploration

@pytest.mark.slow
def test_actor_id_outside_the_range_is_a_config_error() -> None:
    out = subprocess.run(zmqrl_argv("actor", "--id", "2", overrides=["actor.num_actors=2"]),
                         capture_output=True, text=True, timeout=60, env=role_env())
    assert out.returncode == 2
    assert "--id 2 is outside 0..1" in out.stderr and "actor.num_actors=2" in out.stderr


def test_apex_epsilon_per_actor_index(cartpole_cfg: Any) -> None:
    assert apex_epsilon(0.4, 7.0, 0, 1) == 0.4
    values = [apex_epsilon(0.4, 7.0, i, 8) for i in range(8)]
    assert values[0] == pytest.approx(0.4) and values[-1] == pytest.approx(0.4 ** 8)
    assert all(a > b for a, b in zip(values, values[1:], strict=False))  # strictly less exploration per index
    assert values[3] == pytest.approx(0.4 ** (1 + 7 * 3 / 7))
    task = make_task(cartpole_cfg("actor.num_actors=8"))
    assert [task.exploration(i)(12345) for i in range(8)] == pytest.approx(values)
    assert task.exploration(None)(0) == 1.0  # zmqrl train: the linear schedule, not Ape-X


def test_actor_epsilon_decays_from_eps_start_to_its_apex_value(cartpole_cfg: Any) -> None:
    task = make_task(cartpole_cfg("actor.num_actors=2", "actor.eps_decay_steps=1000", "agent.eps_start=1.0"))
    greedy_end = 0.4 ** 8  # actor 1 of 2 with eps 0.4, alpha 7
    for index, end in ((0, 0.4), (1, greedy_end)):
        schedule = task.exploration(index)
        assert schedule(0) == pytest.approx(1.0)
        assert schedule(500) == pytest.approx(end + (1.0 - end) / 2)
        assert schedule(1000) == pytest.approx(end) and schedule(10**6) == pytest.approx(end)
    still = make_task(cartpole_cfg("actor.num_actors=2", "actor.eps_decay_steps=0")).exploration(1)  # Ape-X throughout
    assert still(0) == pytest.approx(greedy_end)
    with pytest.raises(ConfigError, match="actor.eps_decay_steps"):
        cartpole_cfg("actor.eps_decay_steps=-1")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this host has a CUDA device")
@pytest.mark.slow
def test_an_actor_on_cuda_without_a_gpu_is_a_config_error_naming_the_key() -> None:
    out = subprocess.run(zmqrl_argv("actor", "--id", "0", overrides=["actor.device=cuda"]),
                         capture_output=True, text=True, timeout=120, env=role_env())
    assert out.returncode == 2, out.stderr[-2000:]
    assert "actor.device: 'cuda' requested but no CUDA device is available" in out.stderr


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_an_actor_policy_on_cuda_acts_as_on_the_cpu(cartpole_cfg: Any) -> None:
    from zmqrl.roles.actor import policy_device

    task = make_task(cartpole_cfg())
    cpu, cuda = task.policy(0, backend="torch"), task.policy(0, backend="torch", device=policy_device("cuda"))
    cuda.load_params(cpu.params())
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    assert np.array_equal(cpu.act(obs, 0.0), cuda.act(obs, 0.0))


def test_epsilon_per_env_slot_spans_every_actors_envs(cartpole_cfg: Any) -> None:
    """actor.eps_per_env: the ladder runs over the N * num_envs env slots, each env its own ε, and
    the policy uses each row's."""
    cfg = cartpole_cfg("actor.num_actors=2", "env.num_envs=4", "actor.eps_per_env=true", "actor.eps_decay_steps=0")
    task = make_task(cfg)
    ladder = [apex_epsilon(0.4, 7.0, i, 8) for i in range(8)]
    assert task.exploration(0)(100) == pytest.approx(ladder[:4])
    assert task.exploration(1)(100) == pytest.approx(ladder[4:])
    assert task.exploration(1).mean(100) == pytest.approx(np.mean(ladder[4:]))
    assert "over 4 envs" in task.exploration(0).describe()
    decaying = make_task(cartpole_cfg("actor.num_actors=2", "env.num_envs=4", "actor.eps_per_env=true",
                                      "actor.eps_decay_steps=1000", "agent.eps_start=1.0")).exploration(1)
    assert decaying(0) == pytest.approx([1.0] * 4) and decaying(1000) == pytest.approx(ladder[4:])
    policy = task.policy(0, backend="numpy")  # row 0 always explores, row 1 never: the draws say so
    obs = np.zeros((2000, 4), dtype=np.float32)
    greedy = policy.act(obs, np.zeros(2000))
    acted = policy.act(obs, np.tile([1.0, 0.0], 1000))
    assert np.all(acted[1::2] == greedy[1::2]) and 400 < np.sum(acted[0::2] != greedy[0::2]) < 600


# ------------------------------------------------------------------------- a run ends everywhere

@pytest.mark.slow
def test_every_role_exits_0_when_the_learner_finishes(tmp_path: Path, procs: Procs) -> None:
    ports = ports4()
    run_dir = tmp_path / "run"
    sets = ["trainer.max_opts=300", "trainer.warmup=256", "trainer.stop_return=null", "trainer.eval_interval=100",
            "trainer.eval_episodes=2", "env.max_episode_steps=100", "actor.num_actors=2"]
    learner = procs.start("learner", learner_cmd(run_dir, ports, *sets))
    procs.role("proxy", "proxy", "--bind", tcp(ports["proxy"]), "--learner", tcp(ports["data"]),
               "--models", tcp(ports["model"]), overrides=sets)
    for i in range(2):
        procs.role(f"actor-{i}", "actor", "--id", str(i), "--proxy", tcp(ports["proxy"]), "--learner",
                   tcp(ports["model"]), overrides=sets)
    procs.role("evaluator", "evaluator", "--learner", tcp(ports["model"]), "--report", tcp(ports["eval"]),
               overrides=sets)
    assert learner.wait(150) == 0, procs.describe()
    finished = time.monotonic()
    for name in ("proxy", "actor-0", "actor-1", "evaluator"):
        rc = procs[name].wait(max(0.1, 20 - (time.monotonic() - finished)))
        assert rc == 0, f"{name} did not finish on its own after the learner (rc {rc})\n{procs.describe()}"
        assert "the learner finished (reached max_opts=300)" in procs[name].text(), procs[name].tail()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["opt_steps"] == 300 and summary["stop_reason"] == "reached max_opts=300"
