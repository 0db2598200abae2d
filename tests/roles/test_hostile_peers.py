"""One peer's message never crashes, corrupts or ends a run: meaning checked as well as form.

Every test sends the real message, with zmqrl's own encoder or its header written by hand where the
encoder would not make it, to a real learner or proxy (a process, or in this process with its real
sockets), and asserts on what the run did: alive, what it counted and refused, what reached replay
and the model, what it kept in memory.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zmq

from batches import batch_frames, cartpole_batch
from procs import Procs, wait_for
from rigs import in_process_learner, ingest_until, tcp
from zmqrl import config
from zmqrl.bench.data import acted_items
from zmqrl.config import Config
from zmqrl.replay import make_replay
from zmqrl.roles.addresses import free_port
from zmqrl.roles.admission import MAC_KEY, TOKEN_FILE, report_mac
from zmqrl.roles.inserts import FRAME_SLACK, FRAMES_PER_ITEM, ReplayWriter
from zmqrl.roles.intake import Arrived
from zmqrl.roles.net import PROXY_QUEUE
from zmqrl.run.acting import make_task
from zmqrl.run.adders import SequenceAdder
from zmqrl.run.bookkeeping import EVAL_HISTORY, Bookkeeper
from zmqrl.run.rundir import read_json
from zmqrl.run.startup import make_replay_from
from zmqrl.wire import (
    BATCH,
    EVAL,
    HELLO,
    MODEL,
    STATS,
    Message,
    SequenceTracker,
    decode,
    encode,
    eval_meta,
    keygen,
)
from zmqrl.wire.tracking import MAX_SEQ_GAP

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]


def with_header(frames: list[Any], **changes: Any) -> list[Any]:
    """``frames`` with their JSON header edited: what a peer that does not use zmqrl's encoder can send."""
    header = json.loads(bytes(frames[0]))
    for key, value in changes.items():
        if key == "meta":
            header["meta"].update(value)
        else:
            header[key] = value
    return [json.dumps(header).encode(), *frames[1:]]


def push_to(ctx: zmq.Context, address: str, hwm: int = 1000) -> zmq.Socket:
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.connect(address)
    return sock


def summary_of(run_dir: Path) -> dict[str, Any]:
    return read_json(run_dir / "summary.json") or {}


def rejected(run_dir: Path) -> dict[str, int]:
    return summary_of(run_dir).get("messages", {}).get("rejected", {})


class LearnerProcess:
    """A ``zmqrl learner`` process on CartPole with random ports; its run directory and addresses."""

    def __init__(self, procs: Procs, run_dir: Path, *sets: str) -> None:
        self.run_dir = run_dir
        self.ports = {k: free_port() for k in ("data", "model", "eval")}
        self.proc = procs.role("learner", "learner", "--run-dir", str(run_dir), "--bind-data", tcp(self.ports["data"]),
                               "--bind-model", tcp(self.ports["model"]), "--bind-eval", tcp(self.ports["eval"]),
                               overrides=["run.seed=3", "run.log_level=info", "trainer.stop_return=null",
                                          "trainer.max_opts=100000000", "net.stats_interval_s=0.5", *sets])
        self.procs = procs
        wait_for(lambda: "sockets bound" in self.proc.text() or "learner: ready" in self.proc.text(), 90,
                 "the learner to bind its sockets", procs.describe)

    def addr(self, name: str) -> str:
        return tcp(self.ports[name])

    def alive(self) -> bool:
        return self.proc.alive()

    def wait_summary(self, predicate: Any, what: str, timeout: float = 60) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            assert self.proc.alive(), f"the learner died\n{self.procs.describe()}"
            summary = summary_of(self.run_dir)
            return summary if summary and predicate(summary) else None

        return wait_for(check, timeout, what, self.procs.describe)

    def latest_model(self, ctx: zmq.Context, timeout: float = 30) -> Message:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.addr("model"))
        try:
            deadline = time.monotonic() + timeout
            while True:
                assert time.monotonic() < deadline, "no model from the learner"
                if sub.poll(200):
                    msg = decode(sub.recv_multipart())
                    if msg.kind == MODEL:
                        return msg
        finally:
            sub.close()

    def stop(self) -> int:
        self.proc.signal(signal.SIGTERM)
        rc = self.proc.wait(60)
        assert rc is not None, self.procs.describe()
        return rc


# ------------------------------------------------------------------------- numbers, shapes and values


@pytest.mark.slow
def test_bad_numbers_shapes_and_values_are_refused_and_the_learner_trains_on_what_is_left(
        tmp_path: Path, procs: Procs, zctx: zmq.Context) -> None:
    """Each of these ended the learner or poisoned its model: NaN / 10**400 in a batch's meta, a
    proxy's report of 10**400, an array of shape [0, 2**62], an action outside the action space,
    NaN rewards and observations. All are refused by reason; honest batches train a finite model."""
    learner = LearnerProcess(procs, tmp_path / "run", "trainer.warmup=256", "trainer.min_samples_per_insert=0")
    push = push_to(zctx, learner.addr("data"))
    good = cartpole_batch(64, 0)
    hostile: list[tuple[str, list[Any]]] = [
        ("meta", with_header(batch_frames("rogue-a", 0, good), meta={"stats": {"env_steps": float("nan")}})),
        ("meta", with_header(batch_frames("rogue-b", 0, good), meta={"explore": 10**400})),
        ("meta", with_header(batch_frames("rogue-c", 0, good),
                             meta={"episodes": {"returns": [1.0], "lengths": [float("nan")]}})),
        ("meta", with_header(batch_frames("rogue-d", 0, good),
                             meta={"episodes": {"returns": [10**400], "lengths": [3]}})),
        ("values", batch_frames("rogue-e", 0, {**good, "action": np.full(64, 7)})),
        ("values", batch_frames("rogue-f", 0, {**good, "reward": np.full(64, np.nan, np.float32)})),
        ("values", batch_frames("rogue-g", 0, {**good, "obs": np.full((64, 4), np.inf, np.float32)})),
        ("values", batch_frames("rogue-h", 0, {**good, "discount": np.full(64, 5.0, np.float32)})),
    ]
    zero = batch_frames("rogue-z", 0, good)
    header = json.loads(bytes(zero[0]))
    header["arrays"].append(["junk", "<f4", [0, 2**62]])
    hostile.append(("shape", [json.dumps(header).encode(), *zero[1:], b""]))
    stats = encode(STATS, sender="proxy-x", incarnation="p", seq=0, meta={"forwarded": 10**400, "bytes_per_s": 1e400})
    for _, frames in hostile:
        push.send_multipart(frames)
    push.send_multipart(stats)
    for seq in range(8):
        push.send_multipart(batch_frames("actor-0", seq, cartpole_batch(64, seq + 1)))
    summary = learner.wait_summary(lambda s: s["messages"]["batches_received"] >= 8 and s["opt_steps"] > 50,
                                   "the honest batches in replay and training")
    counts = summary["messages"]["rejected"]
    expected = {"meta": 4, "values": 4, "shape": 1}
    assert {k: counts.get(k, 0) for k in expected} == expected, counts
    assert summary["messages"]["batches_received"] == 8 and summary["replay_size"] == 8 * 64
    assert set(summary["actors"]) == {"actor-0"}, summary["actors"]
    proxy = summary["proxies"]["proxy-x"]
    assert proxy["forwarded"] is None and proxy["bytes_per_s"] is None  # kept as "not a number", not 10**400
    model = learner.latest_model(zctx)
    assert model.version > 0 and all(np.isfinite(a).all() for a in model.arrays.values())
    status = subprocess.run([sys.executable, "-m", "zmqrl.cli", "status", str(learner.run_dir)], capture_output=True,
                            text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert learner.stop() == 0
    push.close()


# ------------------------------------------------------------------------- evaluation reports


def signed_report(token: bytes, seq: int, version: int, learner_inc: str, returns: list[float],
                  lengths: list[int], inc: str = "ev-1") -> list[Any]:
    made_at = {"opt_steps": 0, "env_steps": 0, "wall_s": 0.0}  # the model of version 0, at the start
    meta = eval_meta(version, returns, lengths, {"model_inc": learner_inc, **made_at})
    meta[MAC_KEY] = report_mac(token, "evaluator", inc, seq, meta)
    return encode(EVAL, sender="evaluator", incarnation=inc, seq=seq, version=version, meta=meta)


@pytest.mark.slow
def test_a_forged_evaluation_cannot_end_the_run_and_the_admitted_evaluators_counts_once(
        tmp_path: Path, procs: Procs, zctx: zmq.Context) -> None:
    """Returns of 500 sent to the evaluation port ended a run at 0 optimisation steps. Only a report
    signed with the run's token, for a version this learner published, with plausible episodes, counts."""
    learner = LearnerProcess(procs, tmp_path / "run", "trainer.stop_return=475", "trainer.eval_episodes=2",
                             "trainer.warmup=100000")
    push = push_to(zctx, learner.addr("eval"))
    model = learner.latest_model(zctx)
    forged = encode(EVAL, sender="evaluator", incarnation="x", seq=0, version=model.version,
                    meta=eval_meta(model.version, [500.0, 500.0], [500, 500], {"model_inc": model.incarnation}))
    push.send_multipart(forged)
    token = (learner.run_dir / TOKEN_FILE).read_bytes().strip()
    wrong_token = signed_report(b"not the token", 0, model.version, model.incarnation, [500.0] * 2, [500] * 2)
    unpublished = signed_report(token, 1, model.version + 5, model.incarnation, [500.0] * 2, [500] * 2)
    other_learner = signed_report(token, 2, model.version, "another-learner", [500.0] * 2, [500] * 2)
    too_long = signed_report(token, 3, model.version, model.incarnation, [501.0] * 2, [501] * 2)
    altered = with_header(signed_report(token, 4, model.version, model.incarnation, [1.0] * 2, [9] * 2),
                          meta={"returns": [500.0, 500.0]})
    for frames in (wrong_token, unpublished, other_learner, too_long, altered):
        push.send_multipart(frames)
    summary = learner.wait_summary(lambda s: sum(s["messages"]["rejected"].values()) >= 6,
                                   "the learner to refuse six reports")
    assert summary["stop_reason"] == "" and summary["evals_total"] == 0, summary
    counts = summary["messages"]["rejected"]
    assert (counts.get("eval_token"), counts.get("eval_version"), counts.get("eval_episodes")) == (3, 2, 1), counts
    # the positive control: the evaluator's own report counts once, and ends the run as it should
    honest = signed_report(token, 5, model.version, model.incarnation, [480.0, 490.0], [480, 490])
    push.send_multipart(honest)
    push.send_multipart(honest)  # the same report again: refused (that version was evaluated)
    wait_for(lambda: not learner.alive(), 60, "the learner to stop at stop_return", procs.describe)
    assert learner.proc.returncode == 0
    summary = summary_of(learner.run_dir)
    assert summary["evals_total"] == 1 and summary["stop_reason"] == "evaluation reached stop_return=475.0"
    push.close()


def test_evaluations_kept_are_bounded_and_counted(tmp_path: Path, cartpole_cfg: Any) -> None:
    book = Bookkeeper(cartpole_cfg("run.log_level=warning"), tmp_path, None)
    for i in range(EVAL_HISTORY + 500):
        book.evaluation([float(i)], [10], version=i, save_best=False)
    summary = book.summary()
    assert len(summary["evals"]) == EVAL_HISTORY and summary["evals_total"] == EVAL_HISTORY + 500
    assert summary["evals"][-1]["return_mean"] == EVAL_HISTORY + 499 and len(book.state()["evals"]) == EVAL_HISTORY
    book.recorder.close()


# ------------------------------------------------------------------------- the proxy's own report


@pytest.mark.slow
def test_the_proxy_reports_a_thousand_actors_without_outgrowing_a_header(tmp_path: Path, procs: Procs,
                                                                           zctx: zmq.Context) -> None:
    """300 HELLOs with distinct 250-character names made the proxy's report exceed the 64 KiB header
    limit, and the proxy exited 1."""
    learner = zctx.socket(zmq.PULL)
    learner.setsockopt(zmq.LINGER, 0)
    learner_port = learner.bind_to_random_port("tcp://127.0.0.1")
    proxy_port = free_port()
    proxy = procs.role("proxy", "proxy", "--bind", tcp(proxy_port), "--learner", tcp(learner_port),
                       overrides=["net.stats_interval_s=0.3"])
    push = push_to(zctx, tcp(proxy_port))
    for k in range(300):
        push.send_multipart(encode(HELLO, sender=f"{k:03d}" + "x" * 247, incarnation="i", seq=0, meta={}))
    received: list[Message] = []

    def report_after_hellos() -> Message | None:
        assert proxy.alive(), procs.describe()
        while learner.poll(100):
            msg = decode(learner.recv_multipart())
            received.append(msg)
            if msg.kind == STATS and msg.meta.get("actors_total", 0) >= 300:
                return msg
        return None

    report = wait_for(report_after_hellos, 60, "a proxy report counting 300 actors", procs.describe)
    assert len(report.meta["actors"]) <= 64 and sum(m.kind == HELLO for m in received) == 300
    assert proxy.alive()
    proxy.signal(signal.SIGTERM)
    assert proxy.wait(30) == 0, procs.describe()
    stats = read_json(tmp_path / "roles" / "proxy.json") if (tmp_path / "roles").exists() else None
    assert stats is None or stats["actors_total"] == 300
    push.close()


# ------------------------------------------------------------------------- memory


@pytest.mark.slow
def test_a_message_of_a_million_frames_costs_the_learner_no_memory_of_its_own(
        tmp_path: Path, cartpole_cfg: Any, zctx: zmq.Context) -> None:
    """recv_multipart built one object per frame before any check (4M frames: +460 MB)."""
    learner = in_process_learner(cartpole_cfg("run.log_level=warning"), tmp_path / "run")
    push = push_to(zctx, learner.endpoints["data"])
    try:
        push.send_multipart([b"ab"] * 1_000_000)
        push.send_multipart(batch_frames("actor-0", 0, cartpole_batch(64, 0)))
        while not learner.data.poll(100):
            pass
        tracemalloc.start()
        try:
            ingest_until(learner, lambda: learner.batches == 1)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert learner.intake.receiver.rejected["frames"] == 1 and len(learner.replay) == 64
        assert peak < 5 * 2**20, f"{peak / 2**20:.1f} MB of Python objects while reading it"
    finally:
        push.close(linger=0)
        learner.close()


def stacked(frames: np.ndarray, t: np.ndarray, stack: int) -> np.ndarray:
    """Stacks of ``stack`` consecutive frames ending at each index of ``t``."""
    return np.stack([frames[t - stack + 1 + k] for k in range(stack)], axis=1)


def test_frames_that_share_nothing_are_refused_beyond_their_senders_budget() -> None:
    """Random image frames took 8.3 frames per item in the frame pool instead of 1.1."""
    stack, n = 4, 32
    spec = {"obs": (np.dtype(np.uint8), (stack, 12, 12)), "action": (np.dtype(np.int64), ()),
            "reward": (np.dtype(np.float32), ()), "next_obs": (np.dtype(np.uint8), (stack, 12, 12)),
            "discount": (np.dtype(np.float32), ())}
    replay = make_replay(5000, True, seed=0, frame_stack=stack, schema=spec, beta_steps=1000)
    writer = ReplayWriter(replay)
    rng = np.random.default_rng(0)
    video = rng.integers(0, 255, (3000, 12, 12), dtype=np.uint8)  # one honest actor's frames, in order
    common = {"action": np.zeros(n, np.int64), "reward": np.zeros(n, np.float32),
              "discount": np.full(n, 0.99, np.float32)}
    honest_in = rogue_in = rogue_refused = 0
    for b in range(60):
        t = np.arange(stack + b * n, stack + (b + 1) * n)
        honest = Message(BATCH, "actor-0", "i", b, 0, {"obs": stacked(video, t - 1, stack),
                                                       "next_obs": stacked(video, t, stack), **common})
        noise = rng.integers(0, 255, (2, n, stack, 12, 12), dtype=np.uint8)
        rogue = Message(BATCH, "rogue", "r", b, 0, {"obs": noise[0], "next_obs": noise[1], **common})
        for msg in (honest, rogue):
            went = writer.insert([Arrived(msg, n)])
            if msg is honest:
                honest_in += len(went)
            else:
                rogue_in += len(went)
                rogue_refused += not went
    assert honest_in == 60 and rogue_refused > 40 and writer.rejected_frames == rogue_refused
    # each rogue batch of 32 brings 256 new frames: only its budget's worth went in
    assert rogue_in * 2 * stack * n <= FRAMES_PER_ITEM * rogue_in * n + FRAME_SLACK + 2 * stack * n
    frames_per_item = len(replay._pool) / len(replay)
    assert frames_per_item < 2.0, frames_per_item


# ------------------------------------------------------------------------- who speaks for whom


def test_a_sequence_jump_is_refused_and_two_incarnations_keep_their_own_sequences() -> None:
    tr = SequenceTracker()
    assert tr.observe("a", "i1", 0) == (True, 0)
    assert tr.observe("a", "i1", 2**63 - 1) == (False, 0) and tr.last_refusal == "jump"
    assert tr.observe("a", "i1", 1) == (True, 0)  # the real sender goes on
    assert tr.observe("a", "i1", 1 + MAX_SEQ_GAP) == (True, MAX_SEQ_GAP - 1)  # a large real loss still counts
    assert tr.observe("a", "i2", 0) == (True, 0)
    assert tr.observe("a", "i1", 2 + MAX_SEQ_GAP) == (True, 0)  # i2 did not reset i1's sequence
    assert tr.observe("a", "i2", 0) == (False, 0) and tr.last_refusal == "old"


def test_interleaved_incarnations_of_one_name_count_no_more_env_steps_than_were_sent(
        tmp_path: Path, cartpole_cfg: Any, zctx: zmq.Context) -> None:
    """Two interleaved incarnations of one name counted env steps 5.5 times over."""
    learner = in_process_learner(cartpole_cfg("run.log_level=warning", "trainer.warmup=100000"), tmp_path / "run")
    push = push_to(zctx, learner.endpoints["data"])
    try:
        for seq in range(40):
            for inc, claimed in (("real", 64 * (seq + 1)), ("ghost", 10**9)):
                push.send_multipart(batch_frames("actor-0", seq, cartpole_batch(64, seq),
                                                 {"stats": {"env_steps": claimed}}, inc=inc))
        ingest_until(learner, lambda: learner.batches == 80)
        assert learner.book.env_steps <= 80 * 64 + learner.peers.step_slack
        assert learner.book.env_steps >= 40 * 64  # the real incarnation's steps all count
    finally:
        push.close(linger=0)
        learner.close()


@pytest.mark.skipif(not zmq.has("curve"), reason="this libzmq has no CURVE support")
def test_under_curve_one_admitted_key_cannot_speak_for_another_keys_actor(tmp_path: Path, cartpole_cfg: Any) -> None:
    keys = tmp_path / "keys"
    keygen(keys, "server")
    keygen(keys, "host-a", allow=True)
    keygen(keys, "host-b", allow=True)
    sets = ("run.log_level=warning", "trainer.warmup=100000", "net.security=curve", f"net.keys_dir={keys}")
    learner = in_process_learner(cartpole_cfg(*sets), tmp_path / "run")
    contexts = []
    try:
        from zmqrl.roles.net import new_context, options
        from zmqrl.wire import SocketOptions, make_socket

        def sender(key: str) -> zmq.Socket:
            net = cartpole_cfg(*sets, f"net.client_key={key}").net
            ctx = new_context(net)
            contexts.append(ctx)
            return make_socket(ctx, zmq.PUSH, options(net, SocketOptions.push()), connect=learner.endpoints["data"])

        a, b = sender("host-a"), sender("host-b")
        a.send_multipart(batch_frames("actor-0", 0, cartpole_batch(64, 0)))
        ingest_until(learner, lambda: learner.batches == 1)
        b.send_multipart(batch_frames("actor-0", 2**62, cartpole_batch(64, 1), inc="inc-1"))  # to silence it
        b.send_multipart(batch_frames("actor-0", 0, cartpole_batch(64, 2), inc="inc-2"))
        b.send_multipart(batch_frames("actor-9", 0, cartpole_batch(64, 3)))  # its own name: fine
        ingest_until(learner, lambda: learner.batches == 2 and learner.intake.receiver.rejected["key"] == 2)
        a.send_multipart(batch_frames("actor-0", 1, cartpole_batch(64, 4)))
        ingest_until(learner, lambda: learner.batches == 3)
        assert learner.peers.actors.get("actor-0").batches == 2  # type: ignore[union-attr]
        for sock in (a, b):
            sock.close(linger=0)
    finally:
        learner.close()
        for ctx in contexts:
            ctx.term()


# ------------------------------------------------------------------------- the rate limit


@pytest.mark.slow
def test_an_actor_that_ignores_pauses_gets_no_more_than_its_allowance(tmp_path: Path, procs: Procs,
                                                                       zctx: zmq.Context) -> None:
    """A rogue that ignored the rate limiter's pause inserted 7.2M transitions in 30 s while the honest
    actor, paused, made 1,024. Beyond its allowance the rogue's batches are refused (each refusal counted),
    whatever the learner's speed, and the honest actor goes on."""
    sets = ["trainer.warmup=500", "trainer.min_samples_per_insert=8", "actor.num_actors=1", "run.seed=3"]
    learner = LearnerProcess(procs, tmp_path / "run", *sets)
    procs.role("actor-0", "actor", "--id", "0", "--proxy", learner.addr("data"), "--learner", learner.addr("model"),
               overrides=sets)
    learner.wait_summary(lambda s: s["opt_steps"] > 200, "the learner to train on the honest actor", 90)
    push = push_to(zctx, learner.addr("data"), hwm=64)
    before = summary_of(learner.run_dir)["actors"]["actor-0"]["transitions"]
    deadline, seq = time.monotonic() + 20, 0
    while time.monotonic() < deadline:
        try:
            push.send_multipart(batch_frames("rogue", seq, cartpole_batch(64, seq)), zmq.NOBLOCK)
            seq += 1
        except zmq.Again:
            push.poll(10, zmq.POLLOUT)
    summary = learner.wait_summary(lambda s: s["messages"]["over_allowance_transitions"] > 0,
                                   "the learner to refuse the rogue's batches")
    rogue = summary["actors"]["rogue"]["transitions"]
    honest = summary["actors"]["actor-0"]["transitions"] - before
    assert seq * 64 > 20 * rogue, (seq, rogue)  # sent far more than it got in
    # it stamps no grant: it gets what may still have been on its way when the allowance came into force
    # (an actor's send queue and a proxy's two queues of batches), nothing beyond, however long it floods
    in_flight = (16 + 2 * PROXY_QUEUE) * 64  # (actor.send_hwm + 2 proxy queues) batches of actor.n_buffer
    assert 0 < rogue <= in_flight and honest > 0, (rogue, honest)
    refused = summary["messages"]["over_allowance_transitions"]  # (the last on their way still queued)
    assert refused >= 0.9 * (seq * 64 - rogue), (refused, seq * 64 - rogue)
    # the rate limiter holds: what got in is trained on at its ratio again within seconds (the in-flight
    # batches need ~130 updates; the flood above, let in, would need hundreds of thousands). Read at the
    # refusal itself, the ratio may still lag on two loaded cores (3.7 once).
    learner.wait_summary(lambda s: s["samples_per_insert"] >= 4.0, "samples per insert back at 4+", 30)
    assert learner.stop() == 0
    push.close()


# ------------------------------------------------------------------------- updates that would poison the model


def finite_params(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


@pytest.mark.parametrize("config, sets", [
    ("cartpole_dqn.yaml", ()),
    ("cartpole_dqn.yaml", ("agent.dueling=false",)),
    ("cartpole_iqn.yaml", ()),
    ("pendulum_sac.yaml", ()),
])
def test_an_update_with_a_non_finite_loss_is_not_applied(config: str, sets: tuple[str, ...]) -> None:
    """One NaN reward made model version 1 all-NaN, and the learner published NaN models for thousands
    of versions. The update reports itself skipped and leaves parameters and optimiser state as they were."""
    from zmqrl import config as config_mod

    cfg = config_mod.load(REPO / "configs" / config, list(sets))
    task = make_task(cfg)
    agent = task.agent(seed=0)
    replay = make_replay_from(cfg, task.batch_spec())
    rng = np.random.default_rng(0)
    spec = task.batch_spec()
    n = cfg.agent.batch_size
    batch = {k: rng.standard_normal((n, *shape)).astype(dtype) if dtype.kind == "f" else
             rng.integers(0, 2, (n, *shape)).astype(dtype) for k, (dtype, shape) in spec.items()}
    batch["discount"] = np.full(n, 0.99, np.float32)
    replay.add(batch)
    sample = replay.sample(n)
    metrics, _ = agent.update(sample)
    assert metrics["skipped"] == 0
    modules = [m for m in (getattr(agent, "q", None), getattr(agent, "critics", None), getattr(agent, "actor", None))
               if m is not None]
    before = [finite_params(m) for m in modules]
    poisoned = dict(sample)
    poisoned["reward"] = sample["reward"].copy()
    poisoned["reward"][3] = np.nan
    metrics, _ = agent.update(poisoned)
    assert metrics["skipped"] == 1
    for module, params in zip(modules, before, strict=True):
        for p, q in zip(module.parameters(), params, strict=True):
            assert torch.equal(p.detach(), q)
    metrics, _ = agent.update(sample)  # and training goes on
    assert metrics["skipped"] == 0 and all(torch.isfinite(p).all() for m in modules for p in m.parameters())


# ------------------------------------------------------------------------- shutdown after a flood


@pytest.mark.slow
@pytest.mark.parametrize("port", ["eval", "model"])
def test_a_learner_flooded_then_dropped_stops_cleanly(tmp_path: Path, procs: Procs, port: str) -> None:
    """Flood the evaluation port (or the model port with subscriptions), drop the connection, SIGTERM:
    libzmq aborted with ``!_io_error`` (exit -6, no stop reason, no ``done`` to the other roles) when the
    socket had heartbeats on. Short heartbeats here make the abort come at once where it would."""
    from zmtp import Client, message

    learner = LearnerProcess(procs, tmp_path / "run", "net.heartbeat_ms=100", "net.heartbeat_timeout_ms=400",
                             "trainer.warmup=100000")
    wait_for(lambda: "learner: ready" in learner.proc.text(), 90, "the learner ready", procs.describe)
    if port == "eval":
        payload = b"".join(message(encode(EVAL, sender="evaluator", incarnation="x", seq=seq, version=0,
                                          meta=eval_meta(0, [10.0] * 10, [10] * 10)))
                           for seq in range(256))
        client = Client(learner.ports["eval"], b"PUSH")
    else:
        payload = b"".join(message([b"\x01topic-%d" % i]) for i in range(256))
        client = Client(learner.ports["model"], b"SUB")
    client.flood(payload, seconds=2.0, stall_s=2.0)
    client.reset()  # the peer vanishes (RST) while the socket's queue is full
    time.sleep(0.5)  # part of the scenario, not a wait: the socket's heartbeat timer fires meanwhile
    learner.proc.signal(signal.SIGTERM)
    rc = learner.proc.wait(60)
    assert rc == 0, procs.describe()
    assert summary_of(learner.run_dir)["stop_reason"] == "stopped by SIGTERM"


# ------------------------------------------------------------------------- image frames sent once


def catch_batch(n: int, seed: int) -> dict[str, np.ndarray]:
    """``n`` consecutive Catch-shaped transitions of one env: each next_obs is the next obs."""
    rng = np.random.default_rng(seed)
    video = rng.integers(0, 2, (n + 1, 1, 84, 84), dtype=np.uint8) * 255
    return {"obs": video[:-1], "action": rng.integers(0, 3, n), "reward": np.zeros(n, np.float32),
            "next_obs": video[1:], "discount": np.full(n, 0.99, np.float32)}


def test_hostile_compact_batches_are_refused_by_reason_and_honest_ones_after_them_go_in(
        tmp_path: Path, zctx: zmq.Context) -> None:
    """Frames sent once per batch: indices past the frames or negative, int64 or misshapen indices, more
    frames than stacks, frames of another shape, lz4 that does not decompress, a zstd frame claiming
    200 MB, and a million rows of indices into one frame (226 GB of stacks). Each is refused by reason
    and counted in the summary; the honest compact batch after each goes into replay."""
    pytest.importorskip("lz4.block")
    zstandard = pytest.importorskip("zstandard")
    from zmqrl.wire.compact import FrameCompactor

    cfg = config.load(REPO / "configs" / "catch_dqn.yaml", ["run.log_level=warning", "trainer.warmup=100000"])
    learner = in_process_learner(cfg, tmp_path / "run")
    push = push_to(zctx, learner.endpoints["data"])
    n = 16
    plain_c, lz4_c, zstd_c = (FrameCompactor(("obs", "next_obs"), codec) for codec in ("none", "lz4", "zstd"))
    arrays, _ = plain_c.compact(catch_batch(n, 0))
    k = len(arrays["frames"])
    lz4_arrays, lz4_meta = lz4_c.compact(catch_batch(n, 1))
    zstd_arrays, zstd_meta = zstd_c.compact(catch_batch(n, 2))
    bomb = np.frombuffer(zstandard.ZstdCompressor(level=1).compress(bytes(200 * 2**20)), np.uint8)
    rows = 1_000_000
    many = {"frames": arrays["frames"][:1], "obs_frames": np.zeros((rows, 1), np.int32),
            "next_obs_frames": np.zeros((rows, 1), np.int32), "action": np.zeros(rows, np.int64),
            "reward": np.zeros(rows, np.float32), "discount": np.zeros(rows, np.float32)}
    hostile: list[tuple[str, dict[str, np.ndarray], dict[str, Any]]] = [
        ("compact", {**arrays, "obs_frames": np.full((n, 1), k, np.int32)}, {}),
        ("compact", {**arrays, "next_obs_frames": np.full((n, 1), -1, np.int32)}, {}),
        ("compact", {**arrays, "obs_frames": arrays["obs_frames"].astype(np.int64)}, {}),
        ("compact", {**arrays, "obs_frames": arrays["obs_frames"].reshape(n)}, {}),
        ("compact", {**arrays, "frames": np.zeros((2 * n + 1, 84, 84), np.uint8)}, {}),
        ("compact", {**arrays, "frames": np.zeros((k, 84, 83), np.uint8)}, {}),
        ("compress", {**lz4_arrays, "frames_lz4": np.full(99, 3, np.uint8)}, lz4_meta),
        ("compress", {**zstd_arrays, "frames_zstd": bomb}, zstd_meta),
        ("size", many, {}),
    ]
    honest_batches = [catch_batch(n, 10 + i) for i in range(len(hostile))]
    try:
        for i, (_, bad, meta) in enumerate(hostile):
            push.send_multipart(batch_frames(f"rogue-{i}", 0, bad, {"stats": {"env_steps": n}, **meta}))
            good, good_meta = (plain_c, lz4_c, zstd_c)[i % 3].compact(honest_batches[i])
            push.send_multipart(batch_frames("actor-0", i, good, {"stats": {"env_steps": n * (i + 1)}, **good_meta}))
        ingest_until(learner, lambda: learner.batches == len(hostile))
        counts = learner.intake.receiver.rejected
        assert dict(counts) == {"compact": 6, "compress": 2, "size": 1}, counts
        assert len(learner.replay) == n * len(hostile) and learner.intake.receiver.compact_batches == len(hostile)
        summary = learner.summary_extra()
        assert summary["messages"]["rejected"]["compress"] == 2 and summary["wire"]["compact_batches"] == len(hostile)
    finally:
        push.close(linger=0)
        learner.close()


# ------------------------------------------------------------------------- sequence items (recurrent agents)

POMDP_R2D2 = REPO / "configs" / "cartpole_pomdp_r2d2.yaml"


def honest_sequences(cfg: Config, batches: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Batches of ``actor.n_buffer`` sequence items as an actor makes them (the acting loop, the numpy
    policy's states, its initial priorities)."""
    n = cfg.actor.n_buffer
    items = acted_items(cfg, batches * n, seed)
    policy = make_task(cfg).policy(seed, backend="numpy")  # (the policy that acted: its parameters of the seed)
    out = [{k: v[i * n:(i + 1) * n] for k, v in items.items()} for i in range(batches)]
    for batch in out:
        batch["priority"] = policy.priorities(batch)
    return out


def spoiled(batch: dict[str, np.ndarray], key: str, change: Any) -> dict[str, np.ndarray]:
    """``batch`` with a copy of ``key`` changed by ``change(array)`` (in place on the copy), or replaced by it."""
    out = {k: v.copy() for k, v in batch.items()}
    if callable(change):
        change(out[key])
    else:
        out[key] = change
    return out


def test_hostile_sequence_batches_are_refused_by_reason_and_store_nothing(
        tmp_path: Path, zctx: zmq.Context) -> None:
    """Sequence items whose masks, states, terminations or lengths a peer made up: each refused by reason
    (the value limits, R2D2's meaning check, the run's batch spec), nothing of it in replay; the honest
    batch after each goes in, and the env steps counted are the honest actor's (up to the period per item)."""
    cfg = config.load(POMDP_R2D2, ["run.log_level=warning", "trainer.warmup=100000", "actor.n_buffer=16"])
    burn, steps, size = cfg.replay.burn_in, cfg.replay.burn_in + cfg.replay.sequence_length + 1, cfg.agent.lstm_size
    honest = honest_sequences(cfg, 13, seed=5)
    base = honest[0]
    zero_start = int(np.flatnonzero(base["mask"][:, 0] == 0)[0])  # an item that starts before its episode
    going = int(np.flatnonzero(base["mask"][:, -1] == 1)[0])  # an item whose every step is real

    def half_mask(m: np.ndarray) -> None:
        m[going, -3] = 0.5

    def holed_mask(m: np.ndarray) -> None:
        m[going, burn + 3] = 0.0

    def padded_first_trained(m: np.ndarray) -> None:
        m[going, : burn + 1] = 0.0

    def early_end(d: np.ndarray) -> None:
        d[going, burn + 2] = 0.0

    def state_not_zero(h: np.ndarray) -> None:
        h[zero_start] = 0.25

    def nan_state(h: np.ndarray) -> None:
        h[going, 0] = np.nan

    def big_h(h: np.ndarray) -> None:
        h[going, 1] = 1.5

    def huge_c(c: np.ndarray) -> None:
        c[going, 2] = 1e9

    def far_action(a: np.ndarray) -> None:
        a[going, 4] = 2

    n = len(base["mask"])
    hostile: list[tuple[str, dict[str, np.ndarray]]] = [
        ("values", spoiled(base, "mask", half_mask)),
        ("values", spoiled(base, "mask", holed_mask)),
        ("values", spoiled(base, "mask", padded_first_trained)),
        ("values", spoiled(base, "discount", early_end)),
        ("values", spoiled(base, "state_h", state_not_zero)),
        ("values", spoiled(base, "state_h", nan_state)),
        ("values", spoiled(base, "state_h", big_h)),
        ("values", spoiled(base, "state_c", huge_c)),
        ("values", spoiled(base, "action", far_action)),
        ("schema", spoiled(base, "obs", base["obs"][:, 1:])),  # a step short
        ("schema", spoiled(base, "mask", np.ones((n, steps + 1), np.float32))),
        ("schema", spoiled(base, "state_c", np.zeros((n, size + 1), np.float32))),
    ]
    learner = in_process_learner(cfg, tmp_path / "run")
    push = push_to(zctx, learner.endpoints["data"])
    period = cfg.replay.sequence_length - cfg.replay.overlap
    try:
        for i, (_, bad) in enumerate(hostile):
            push.send_multipart(batch_frames(f"rogue-{i}", 0, bad, {"stats": {"env_steps": 10**9}}))
            claimed = {"stats": {"env_steps": n * period * (i + 1)}}
            push.send_multipart(batch_frames("actor-0", i, honest[i + 1], claimed))
        ingest_until(learner, lambda: learner.batches == len(hostile))
        counts = learner.intake.receiver.rejected
        assert dict(counts) == {"values": 9, "schema": 3}, counts
        assert len(learner.replay) == n * len(hostile) and learner.writer.rejected == 0
        stored = learner.replay.get(np.arange(len(learner.replay)))
        sent = {k: np.concatenate([b[k] for b in honest[1:len(hostile) + 1]]) for k in stored}
        for key in stored:
            np.testing.assert_array_equal(stored[key], sent[key], err_msg=key)
        assert learner.book.env_steps == n * period * len(hostile)  # the honest claims, all within the cap
        summary = learner.summary_extra()
        assert summary["replay_item"] == "sequence item" and summary["messages"]["rejected"]["values"] == 9
    finally:
        push.close(linger=0)
        learner.close()


def stacked_sequences(video: np.ndarray, length: int, burn_in: int, seq: int, overlap: int, stack: int,
                      ) -> dict[str, np.ndarray]:
    """The sequence items of one episode of ``length`` steps whose step ``t`` observes the stack of ``video``
    frames ``t .. t + stack - 1`` (so it ends terminated), from the zero state."""
    adder = SequenceAdder(1, burn_in, seq, overlap, 0.99)
    parts = []
    for t in range(length):
        obs = video[t:t + stack][None]
        out = adder.push(obs, np.zeros(1, np.int64), np.zeros(1, np.float32), np.array([t == length - 1]),
                         np.zeros(1, bool), np.zeros((1, 2, 32), np.float32))
        if out is not None:
            parts.append(out)
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def test_image_sequences_keep_each_frame_once_and_frames_that_share_nothing_are_refused(
        tmp_path: Path, zctx: zmq.Context) -> None:
    """Pong-shaped sequence items (T steps of 4-frame stacks) sent with their frames once: replay holds about
    the new frames per item (the period), not T x 4; the stored items are the ones sent; a peer whose items'
    frames share nothing, and one whose indices point outside its frames, are refused."""
    from zmqrl.wire.compact import FrameCompactor

    burn, seq, overlap, stack = 4, 8, 4, 4
    period, steps = seq - overlap, burn + seq + 1
    cfg = config.load(REPO / "configs" / "pong_r2d2.yaml", [
        "run.log_level=warning", "run.device=cpu", "trainer.warmup=100000", f"replay.burn_in={burn}",
        f"replay.sequence_length={seq}", f"replay.overlap={overlap}", "replay.capacity=3000", "agent.lstm_size=32",
        "agent.hidden=[32]", "agent.head_hidden=0", "agent.batch_size=8", "actor.n_buffer=8"])
    learner = in_process_learner(cfg, tmp_path / "run")
    push = push_to(zctx, learner.endpoints["data"])
    rng = np.random.default_rng(0)
    compactor = FrameCompactor(("obs",))
    episodes, length = 6, 60
    sent: list[dict[str, np.ndarray]] = []
    try:
        for e in range(episodes):
            video = rng.integers(0, 2, (length + stack, 84, 84), dtype=np.uint8) * 255
            items = stacked_sequences(video, length, burn, seq, overlap, stack)
            arrays, _ = compactor.compact(items)
            assert "frames" in arrays and arrays["obs_frames"].shape == (len(items["mask"]), steps, stack)
            push.send_multipart(batch_frames("actor-0", e, arrays, {"stats": {"env_steps": length * (e + 1)}}))
            sent.append(items)
        noise = {**sent[0], "obs": rng.integers(0, 255, sent[0]["obs"].shape, dtype=np.uint8)}
        noisy, _ = FrameCompactor(("obs",)).compact(noise)  # (frames that share nothing go as stacks)
        far = {**arrays, "obs_frames": np.full_like(arrays["obs_frames"], len(arrays["frames"]))}
        push.send_multipart(batch_frames("rogue-a", 0, noisy, {"stats": {"env_steps": 1}}))
        push.send_multipart(batch_frames("rogue-b", 0, far, {"stats": {"env_steps": 1}}))
        ingest_until(learner, lambda: learner.batches + learner.writer.rejected_frames
                     + learner.intake.receiver.rejected.get("compact", 0) == episodes + 2)
        items = sum(len(s["mask"]) for s in sent)
        assert len(learner.replay) == items and learner.intake.receiver.compact_batches == episodes
        assert learner.writer.rejected_frames == 1 and dict(learner.intake.receiver.rejected) == {"compact": 1}
        stored = learner.replay.get(np.arange(items))
        np.testing.assert_array_equal(stored["obs"], np.concatenate([s["obs"] for s in sent]))
        # each episode: its length + stack - 1 frames, plus one zero frame of padding for all
        assert learner.replay.frames_held == episodes * (length + stack - 1) + 1
        per_item = learner.replay.frames_held / len(learner.replay)
        assert period <= per_item < 1.1 * period, per_item  # stacks as given: steps * stack = 52 frames an item
        assert learner.summary_extra()["replay_frames_per_item"] == pytest.approx(per_item, abs=1e-3)
    finally:
        push.close(linger=0)
        learner.close()


# ------------------------------------------------------------------------- segments (on-policy agents)

CARTPOLE_APPO = REPO / "configs" / "cartpole_appo.yaml"


def test_hostile_segments_are_refused_by_reason_and_store_nothing(tmp_path: Path, zctx: zmq.Context) -> None:
    """Segments whose behaviour log-probabilities, masks, terminations or lengths a peer made up: each refused
    by reason (the value limits: log-probabilities finite and <= 0 for a categorical policy; APPO's meaning
    check; the batch spec), nothing of it in the store; the honest batch after each goes in whole."""
    cfg = config.load(CARTPOLE_APPO, ["run.log_level=warning", "trainer.warmup=8", "replay.capacity=10000"])
    n = cfg.actor.n_buffer
    items = acted_items(cfg, 14 * n, seed=5)
    honest = [{k: v[i * n:(i + 1) * n] for k, v in items.items()} for i in range(14)]
    base = honest[0]
    going = int(np.flatnonzero(base["mask"][:, -1] == 1)[0])  # a segment whose every step is real

    def at(value: float, key: str = "logp", step: int = 3) -> Any:
        return lambda a: a.__setitem__((going, step), value)

    hostile: list[tuple[str, dict[str, np.ndarray]]] = [
        ("values", spoiled(base, "logp", at(np.nan))),
        ("values", spoiled(base, "logp", at(np.inf))),
        ("values", spoiled(base, "logp", at(-np.inf))),
        ("values", spoiled(base, "logp", at(0.5))),  # a probability above 1
        ("values", spoiled(base, "logp", at(-1e30))),  # below any policy's: an importance weight of e^1e30
        ("values", spoiled(base, "mask", at(0.5))),
        ("values", spoiled(base, "mask", at(0.0, step=4))),  # a hole in the run of real steps
        ("values", spoiled(base, "discount", at(0.0, step=2))),  # a termination before the end
        ("values", spoiled(base, "reward", at(np.nan))),
        ("values", spoiled(base, "action", at(2))),
        ("schema", spoiled(base, "logp", base["logp"][:, 1:])),  # a step short
        ("schema", {k: v for k, v in base.items() if k != "logp"}),  # no behaviour log-probabilities
    ]
    learner = in_process_learner(cfg, tmp_path / "run")
    push = push_to(zctx, learner.endpoints["data"])
    try:
        for i, (_, bad) in enumerate(hostile):
            line = {"model_inc": learner.incarnation}  # acted by this learner's version 0
            push.send_multipart(batch_frames(f"rogue-{i}", 0, bad, line))
            push.send_multipart(batch_frames("actor-0", i, honest[i + 1], line))
        ingest_until(learner, lambda: learner.batches == len(hostile))
        counts = learner.intake.receiver.rejected
        assert dict(counts) == {"values": 10, "schema": 2}, counts
        assert len(learner.replay) == n * len(hostile) and learner.writer.rejected == 0
        stored = learner.replay.sample(len(learner.replay))
        for key in base:
            sent = np.concatenate([b[key] for b in honest[1:len(hostile) + 1]])
            np.testing.assert_array_equal(stored[key], sent, err_msg=key)
        summary = learner.summary_extra()
        assert summary["replay_item"] == "segment" and summary["store"]["dropped_other_line"] == 0
    finally:
        push.close(linger=0)
        learner.close()


def test_segments_too_old_for_the_learner_are_dropped_and_counted_and_a_full_store_pauses(
        tmp_path: Path, zctx: zmq.Context) -> None:
    """A segment acted more than ``trainer.max_policy_lag`` versions ago, by another learner's line or by a version
    this learner never published, is not trained on but counted in the summary; one inside the lag is taken;
    past ``replay.capacity`` the store asks the learner to pause its actors (honest data already sent still
    goes in)."""
    cfg = config.load(CARTPOLE_APPO, ["run.log_level=warning", "trainer.warmup=8", "replay.capacity=24",
                                      "trainer.max_policy_lag=5"])
    n = cfg.actor.n_buffer
    items = acted_items(cfg, 4 * n, seed=6)
    batches = [{k: v[i * n:(i + 1) * n] for k, v in items.items()} for i in range(4)]
    learner = in_process_learner(cfg, tmp_path / "run")
    learner.book.version = 30  # as if it had published 30 versions
    push = push_to(zctx, learner.endpoints["data"])
    try:
        for seq, (version, line) in enumerate(((24, learner.incarnation), (25, learner.incarnation),
                                               (30, "another-learner"), (29, learner.incarnation))):
            frames = encode(BATCH, sender="actor-0", incarnation="inc-1", seq=seq, version=version,
                            arrays=batches[seq], meta={"model_inc": line, "stats": {"env_steps": 100 * (seq + 1)}})
            push.send_multipart(frames)
        ingest_until(learner, lambda: learner.batches == 4)
        store = learner.summary_extra()["store"]
        assert (store["dropped_lag"], store["dropped_other_line"], store["queued"]) == (n, n, 2 * n)
        future = encode(BATCH, sender="actor-0", incarnation="inc-1", seq=4, version=31, arrays=batches[0],
                        meta={"model_inc": learner.incarnation})  # a version not published yet: claimed fresh
        push.send_multipart(future)
        ingest_until(learner, lambda: learner.batches == 5)
        assert learner.summary_extra()["store"]["dropped_other_line"] == 2 * n
        assert not learner.on_policy.full  # 16 of 24
        push.send_multipart(encode(BATCH, sender="actor-0", incarnation="inc-1", seq=5, version=30,
                                   arrays=batches[0], meta={"model_inc": learner.incarnation}))
        ingest_until(learner, lambda: learner.batches == 6)
        assert learner.on_policy.full and len(learner.replay) == 3 * n  # nothing refused
        assert learner.limiter.update_pause(learner.book.opt_steps, True, full=learner.on_policy.full)
        assert learner.limiter.paused
    finally:
        push.close(linger=0)
        learner.close()


def test_image_segments_travel_with_each_frame_once_and_reach_the_store_whole(
        tmp_path: Path, zctx: zmq.Context) -> None:
    """Pong-shaped segments (T steps of 4-frame stacks) go on the wire as their distinct frames and indices
    (about one new frame per step, not T x 4), the intake opens them and the store holds the segments sent."""
    from zmqrl.wire.compact import FrameCompactor

    length, stack = 8, 4
    cfg = config.load(CARTPOLE_APPO, [
        "run.log_level=warning", "env.id=ALE/Pong-v5", "env.wrappers=[atari]", "env.kwargs={frameskip: 1}",
        "env.frame_stack=4", "agent.network=nature_cnn", "agent.hidden=[32]", f"agent.unroll_length={length}",
        "agent.batch_size=4", "trainer.warmup=4", "replay.capacity=1000"])
    learner = in_process_learner(cfg, tmp_path / "run")
    push = push_to(zctx, learner.endpoints["data"])
    rng = np.random.default_rng(0)
    compactor = FrameCompactor(("obs",))
    sent: list[dict[str, np.ndarray]] = []
    try:
        for e in range(3):  # an episode of 4 segments each, its frames a fresh random video
            video = rng.integers(0, 2, (4 * length + stack + 1, 84, 84), dtype=np.uint8) * 255
            t = np.arange(4)[:, None] * length + np.arange(length + 1)[None, :]  # (segments, T): episode steps
            obs = np.stack([video[t + k] for k in range(stack)], axis=2)  # (segments, T, stack, 84, 84)
            items = {"obs": obs, "action": np.zeros((4, length + 1), np.int64),
                     "reward": np.zeros((4, length + 1), np.float32),
                     "discount": np.full((4, length + 1), 0.99, np.float32),
                     "mask": np.ones((4, length + 1), np.float32),
                     "logp": np.full((4, length + 1), -1.79, np.float32)}
            arrays, _ = compactor.compact(items)
            assert len(arrays["frames"]) <= 4 * length + stack + 1  # each distinct frame once
            meta = {"model_inc": learner.incarnation, "stats": {"env_steps": 4 * length * (e + 1)}}
            push.send_multipart(batch_frames("actor-0", e, arrays, meta))
            sent.append(items)
        ingest_until(learner, lambda: learner.batches == 3)
        assert learner.intake.receiver.compact_batches == 3 and len(learner.replay) == 12
        assert learner.intake.receiver.frames <= 3 * (4 * length + stack + 1)
        stored = learner.replay.sample(12)
        np.testing.assert_array_equal(stored["obs"], np.concatenate([s["obs"] for s in sent]))
        metrics, _ = learner.agent.update({k: v[:4] for k, v in stored.items()})
        assert metrics["skipped"] == 0.0 and np.isfinite(metrics["loss"])
    finally:
        push.close(linger=0)
        learner.close()
