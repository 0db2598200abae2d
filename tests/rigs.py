"""Rigs the tests in several folders share: an actor against a real sink and model publisher, a learner
in this process to feed CartPole batches (:mod:`batches`), and a target network made to differ from its online one."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zmq

from zmqrl.agents.dqn.numpy_policy import mlp_param_shapes
from zmqrl.config import Config
from zmqrl.roles.actor import Actor
from zmqrl.roles.addresses import free_port
from zmqrl.roles.learner import Learner
from zmqrl.run.lifecycle import StopFlag
from zmqrl.wire import BATCH, Message, SocketOptions, decode, encode_control, encode_model, make_socket


def tcp(port: int | None = None) -> str:
    return f"tcp://127.0.0.1:{port or free_port()}"


def ingest_until(learner: Learner, cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting for the learner to take the messages in"
        learner.ingest(timeout=0.05)


def in_process_learner(cfg: Config, run_dir: Path) -> Learner:
    learner = Learner(cfg, run_dir, tcp(), tcp(), tcp())
    learner.agent_ready(block=True)
    return learner


LEARNER_INC = "learner-test-inc"
CONTROL_KEYS = ("pause", "allow", "grant", "quota", "done")


def params(cfg: Config, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = mlp_param_shapes(cfg.agent, 4, 2)  # CartPole: 4 observations, 2 actions
    return {k: (rng.standard_normal(s) * 0.1).astype(np.float32) for k, s in shapes.items()}


class Rig:
    """An actor plus the sink (PULL) and the learner's stream (a PUB: models and control) it talks to."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.ctx = zmq.Context(io_threads=1)
        sink_addr, model_addr = tcp(), tcp()
        self.pull = make_socket(self.ctx, zmq.PULL, SocketOptions.pull(rcvhwm=10_000), bind=sink_addr)
        self.pub = make_socket(self.ctx, zmq.PUB, SocketOptions.pub(), bind=model_addr)
        self.actor = Actor(cfg, 0, sink_addr, model_addr)
        self.stop = StopFlag()
        self.control_seq = 0

    def publish(self, version: int, meta: dict[str, Any] | None = None) -> None:
        """A model of ``version``; the control keys of ``meta`` (pause, allow, grant, quota, done) go
        out as a control message after it, as the learner's publisher sends them."""
        meta = dict(meta or {})
        control = {k: meta.pop(k) for k in CONTROL_KEYS if k in meta}
        self.pub.send(encode_model("learner", LEARNER_INC, version, params(self.cfg, version), meta=meta)[0])
        if control:
            self.control(version, control)

    def control(self, version: int, meta: dict[str, Any]) -> None:
        self.control_seq += 1
        self.pub.send(encode_control("learner", LEARNER_INC, self.control_seq, version, meta)[0])

    def start(self) -> None:
        """Publish version 0 until the actor's subscription is up."""
        deadline = time.monotonic() + 20
        while not self.actor.stream.wait(20):
            assert time.monotonic() < deadline, "the actor never received a model"
            self.publish(0)

    def received(self, timeout_s: float = 5.0) -> list[Message]:
        """Every batch that reached the sink, once ``actor.stats.batches`` of them have."""
        msgs: list[Message] = []
        deadline = time.monotonic() + timeout_s
        while len(msgs) < self.actor.stats.batches and time.monotonic() < deadline:
            if self.pull.poll(50, zmq.POLLIN):
                msgs.append(decode(self.pull.recv_multipart()))
        return msgs

    def close(self) -> None:
        self.actor.close()
        self.pull.close(linger=0)
        self.pub.close(linger=0)
        self.ctx.term()


def check_stream(msgs: list[Message], rig: Rig) -> None:
    actor = rig.actor
    assert [m.seq for m in msgs] == list(range(actor.seq)) and actor.seq == actor.stats.batches
    assert sum(len(m.arrays["reward"]) for m in msgs) == actor.stats.transitions
    for m in msgs:
        assert m.kind == BATCH and m.incarnation == actor.incarnation
        assert len(m.arrays["reward"]) >= rig.cfg.actor.n_buffer
        assert set(m.arrays) == {"obs", "action", "reward", "next_obs", "discount", "priority"}
        assert m.meta["model_inc"] == LEARNER_INC and m.version <= m.meta["max_version"]


def perturb_target(agent: Any, seed: int = 123) -> None:
    """Make an agent's target network differ from the online one, so double and plain targets differ."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in agent.target.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=gen))
