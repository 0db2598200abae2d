"""The learner's publisher: a model goes out only with a new version, to new subscribers and on the
slow republish; control (pause, allowance and grant, quota, done) goes in messages of its own, a
few hundred bytes each, and never brings a model with it. A real XPUB, real subscribers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import zmq

from zmqrl.roles.publisher import ControlState, Publisher
from zmqrl.roles.ratelimit import Allowances
from zmqrl.wire import (
    CONTROL,
    CONTROL_TOPIC,
    MODEL,
    MODEL_SUBSCRIPTION,
    MODEL_TOPIC,
    Limits,
    Message,
    SocketOptions,
    WireError,
    decode,
    encode,
    encode_control,
    encode_model,
    make_socket,
)
from zmqrl.wire.codec import pack

pytestmark = pytest.mark.timeout(60)

PARAMS = {"w": np.arange(250_000, dtype=np.float32)}  # a 1 MB model


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


class Listener:
    """A subscriber to one topic that keeps every message (no conflation), in order."""

    def __init__(self, ctx: zmq.Context, address: str, topic: bytes) -> None:
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 10_000)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.sock.connect(address)
        self.messages: list[Message] = []
        self.nbytes: list[int] = []

    def read(self, seconds: float = 0.0) -> list[Message]:
        end = time.monotonic() + seconds
        while True:
            if self.sock.poll(max(0, int((end - time.monotonic()) * 1000)), zmq.POLLIN):
                frames = self.sock.recv_multipart()
                self.nbytes.append(sum(len(f) for f in frames))
                self.messages.append(decode(frames))
            elif time.monotonic() >= end:
                return self.messages


@pytest.fixture
def publisher(zctx: zmq.Context, request: pytest.FixtureRequest) -> Iterator[tuple[Publisher, str]]:
    """A publisher on a real XPUB (``republish_s`` from the test's ``republish`` mark, else 30 s)."""
    mark = request.node.get_closest_marker("republish")
    sock = make_socket(zctx, zmq.XPUB, SocketOptions.pub(sndhwm=1000), bind="tcp://127.0.0.1:0")
    sock.setsockopt(zmq.XPUB_VERBOSE, 1)
    address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    pub = Publisher(sock, "inc-L", "digest-of-the-task", Allowances(16, 600.0, unstamped=0),
                    republish_s=mark.args[0] if mark else 30.0)
    pub.start()
    try:
        yield pub, address
    finally:
        pub.stop()
        sock.close(linger=0)


def model(version: int) -> bytes:
    return bytes(encode_model("learner", "inc-L", version, PARAMS, meta={"opt_steps": version})[0])


@pytest.mark.republish(0.6)
def test_models_go_out_with_new_versions_to_joiners_and_on_the_slow_republish(
        publisher: tuple[Publisher, str], zctx: zmq.Context) -> None:
    pub, address = publisher
    first = Listener(zctx, address, MODEL_TOPIC)
    wait_for(lambda: pub.model_joins == 1, 5, "the first subscription")
    pub.post_model(1, model(1))
    assert [m.version for m in first.read(0.3)] == [1]  # once, at once
    for paused in (True, False, True, False, True, False):  # control changes bring no model
        pub.post_control(ControlState(paused=paused, allowance=100))
    assert len(first.read(0.2)) == 1
    late = Listener(zctx, address, MODEL_TOPIC)  # a late joiner gets the current model at once
    assert [m.version for m in late.read(0.3)] == [1]
    assert len(first.read(0.1)) == 2  # (a PUB sends to every subscriber: the first one saw it again)
    pub.post_model(2, model(2))
    assert [m.version for m in late.read(0.3)] == [1, 2]
    count = len(late.messages)
    late.read(1.3)  # nothing new for 1.3 s: the republish every 0.6 s, and nothing else
    assert 1 <= len(late.messages) - count <= 3 and all(m.version == 2 for m in late.messages[count:])
    assert pub.versions_sent == 2 and pub.model_joins == 2


def test_control_is_small_and_apart_from_models_and_each_message_made_is_one_grant(
        publisher: tuple[Publisher, str], zctx: zmq.Context) -> None:
    pub, address = publisher
    control = Listener(zctx, address, CONTROL_TOPIC)
    models = Listener(zctx, address, MODEL_TOPIC)
    wait_for(lambda: pub.model_joins == 1 and pub.control_joins == 1, 5, "the subscriptions")
    pub.post_model(0, model(0))
    pub.post_control(ControlState(quota=64))  # the agent still loading: a quota, no grant
    got = control.read(0.3)
    assert [m.meta.get("quota") for m in got] == [64] and "grant" not in got[0].meta
    assert got[0].meta["task"] == "digest-of-the-task" and got[0].kind == CONTROL
    for k in range(5):  # training: each control made is a grant of the allowance
        pub.post_control(ControlState(paused=k % 2 == 1, allowance=800), grant=True)
        control.read(0.05)
    pub.post_control(ControlState(paused=False, allowance=800))  # the same state again: nothing goes out
    grants = [m.meta["grant"] for m in control.read(0.3)[1:]]
    assert grants == [1, 2, 3, 4, 5], grants
    assert pub.allowances.grants == 5 and pub.allowances._paused_set == {2, 4}  # made while paused
    assert max(control.nbytes) <= 1024, control.nbytes
    assert [m.version for m in models.read(0.0)] == [0]  # control brought no model
    assert pub.finish("reached max_opts=10", timeout=5)
    assert control.read(0.3)[-1].meta["done"] == "reached max_opts=10"
    assert len(models.read(0.0)) == 1


def test_a_topic_carries_only_its_own_kind() -> None:
    control = encode_control("learner", "inc", 1, 0, {"pause": True})[0]
    model_frame = encode_model("learner", "inc", 3, PARAMS)[0]
    assert bytes(control[:4]) == CONTROL_TOPIC and bytes(model_frame[:4]) == MODEL_TOPIC
    assert decode([control], Limits.only([CONTROL])).meta == {"pause": True}
    # a control message dressed as a model (and the reverse) is refused by kind
    for topic, kind in ((MODEL_TOPIC, CONTROL), (CONTROL_TOPIC, MODEL)):
        frames = encode(kind, sender="learner", incarnation="inc", seq=1, version=0, meta={})
        with pytest.raises(WireError) as err:
            decode([pack(frames, topic)])
        assert err.value.reason == "kind"


def test_a_role_whose_model_was_dropped_asks_for_it_again(zctx: zmq.Context, cartpole_cfg: Any) -> None:
    """Control names version 2 while the role still holds version 1 (the model was dropped on the way):
    after STALE_S the role subscribes to models again, which the publisher takes as a joiner."""
    from zmqrl.roles.skeleton import RoleProcess
    from zmqrl.roles.stream import STALE_S, LearnerStream

    cfg = cartpole_cfg()
    xpub = make_socket(zctx, zmq.XPUB, SocketOptions.pub(sndhwm=1000), bind="tcp://127.0.0.1:0")
    xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
    role = RoleProcess(cfg, "probe")
    stream = LearnerStream(role, cfg.net, xpub.getsockopt_string(zmq.LAST_ENDPOINT))
    joins: list[bytes] = []

    def read_joins() -> list[bytes]:
        while xpub.poll(0, zmq.POLLIN):
            joins.append(xpub.recv()[1:])
        return joins

    try:
        wait_for(lambda: len(read_joins()) >= 2, 5, "the role's two subscriptions")
        seen: list[int] = []

        def send(version: int, announce: int, with_model: bool) -> None:
            if with_model:
                xpub.send(bytes(encode_model("learner", "inc-L", version, PARAMS)[0]))
            xpub.send(bytes(encode_control("learner", "inc-L", len(seen) + 1, announce, {"pause": False})[0]))

        def take() -> bool:
            stream.take_control(lambda msg: seen.append(msg.version))
            msg, _ = stream.newest_model()
            return msg is not None and msg.version == 1
        send(1, 1, True)
        wait_for(take, 5, "model version 1")
        before = len(read_joins())
        started = time.monotonic()
        while stream.asked == 0:  # control says 2, no model 2 comes
            assert time.monotonic() - started < STALE_S + 5, "the role never asked for the model again"
            send(1, 2, False)
            take()
            time.sleep(0.05)
        assert time.monotonic() - started >= STALE_S * 0.9
        wait_for(lambda: len(read_joins()) > before, 5, "the new subscription at the publisher")
        assert all(topic == MODEL_SUBSCRIPTION for topic in joins[before:]), joins
        send(2, 2, True)
        wait_for(lambda: stream.newest_model()[0] is not None or stream.versions.version == 2, 5, "model 2")
        asked = stream.asked
        for _ in range(30):  # up to date now: nothing more asked
            send(2, 2, False)
            take()
            time.sleep(0.05)
        assert stream.asked == asked
    finally:
        role.close()
        xpub.close(linger=0)
