"""The learner's publisher: a model goes out only with a new version and on the slow republish, never
for a subscriber that joins (it asks the snapshot ROUTER, and the reply goes to it alone); control
(pause, allowance and grant, quota, done) goes in messages of its own, a few hundred bytes each, and
never brings a model with it. A real XPUB, a real ROUTER, real subscribers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import zmq

from zmqrl.roles.publisher import ControlState, Publisher
from zmqrl.roles.ratelimit import Allowances
from zmqrl.roles.snapshots import SnapshotServer
from zmqrl.run.rewards import CONTROL_KEY, control_factor
from zmqrl.wire import (
    CONTROL,
    CONTROL_TOPIC,
    MODEL,
    MODEL_TOPIC,
    SNAPSHOT,
    Limits,
    Message,
    SocketOptions,
    WireError,
    decode,
    encode,
    encode_control,
    encode_model,
    encode_snapshot_request,
    make_socket,
    send_frames,
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
    """A publisher on a real XPUB and snapshot ROUTER (``republish_s`` from the test's ``republish`` mark,
    else 30 s; the snapshot bucket's burst from its ``burst`` mark, else 16); the ROUTER's address is
    ``pub.snapshot_address``."""
    mark = request.node.get_closest_marker("republish")
    burst = request.node.get_closest_marker("burst")
    republish_s = mark.args[0] if mark else 30.0
    sock = make_socket(zctx, zmq.XPUB, SocketOptions.pub(sndhwm=1000), bind="tcp://127.0.0.1:0")
    sock.setsockopt(zmq.XPUB_VERBOSE, 1)
    router = make_socket(zctx, zmq.ROUTER, SocketOptions.snapshot_server(), bind="tcp://127.0.0.1:0")
    address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    snapshots = SnapshotServer(router, "learner", republish_s, burst=burst.args[0] if burst else 16)
    pub = Publisher(sock, "inc-L", "digest-of-the-task", Allowances(16, 600.0, unstamped=0),
                    republish_s=republish_s, snapshots=snapshots)
    pub.snapshot_address = router.getsockopt_string(zmq.LAST_ENDPOINT)  # type: ignore[attr-defined]
    pub.start()
    try:
        yield pub, address
    finally:
        pub.stop()
        sock.close(linger=0)
        router.close(linger=0)


class Asker:
    """A DEALER that asks a snapshot ROUTER for the newest control and model, and keeps the replies."""

    def __init__(self, ctx: zmq.Context, address: str) -> None:
        self.sock = make_socket(ctx, zmq.DEALER, SocketOptions.snapshots(), connect=address)
        self.replies: list[list[Message]] = []

    def ask(self, have: tuple[str, int] | None = None, wait: float = 0.5) -> list[Message]:
        """One request; the reply's messages (empty when none came within ``wait``)."""
        send_frames(self.sock, encode_snapshot_request("probe", "inc-P", len(self.replies), have))
        if not self.sock.poll(int(wait * 1000), zmq.POLLIN):
            self.replies.append([])
            return []
        reply = [decode([frame]) for frame in self.sock.recv_multipart()]
        self.replies.append(reply)
        return reply

    def close(self) -> None:
        self.sock.close(linger=0)


def model(version: int) -> bytes:
    return bytes(encode_model("learner", "inc-L", version, PARAMS, meta={"opt_steps": version})[0])


@pytest.mark.republish(0.6)
def test_models_go_out_with_new_versions_and_on_the_slow_republish_never_for_a_joiner(
        publisher: tuple[Publisher, str], zctx: zmq.Context) -> None:
    pub, address = publisher
    first = Listener(zctx, address, MODEL_TOPIC)
    wait_for(lambda: pub.model_joins == 1, 5, "the first subscription")
    pub.post_model(1, model(1))
    assert [m.version for m in first.read(0.3)] == [1]  # once, at once
    for paused in (True, False, True, False, True, False):  # control changes bring no model
        pub.post_control(ControlState(paused=paused, allowance=100))
    assert len(first.read(0.2)) == 1
    late = [Listener(zctx, address, MODEL_TOPIC)]
    wait_for(lambda: pub.model_joins == 2, 5, "the second subscription")
    pub.post_model(2, model(2))
    assert [m.version for m in late[0].read(0.3)] == [2]
    count = len(late[0].messages)
    late[0].read(1.3)  # nothing new for 1.3 s: the republish every 0.6 s, and nothing else
    assert 1 <= len(late[0].messages) - count <= 3 and all(m.version == 2 for m in late[0].messages[count:])
    assert pub.versions_sent == 2 and pub.model_joins == 2


def test_a_joiner_gets_one_model_a_peer_asking_in_a_loop_no_more_than_a_subscriber(
        publisher: tuple[Publisher, str], zctx: zmq.Context) -> None:
    """Snapshots: one model per version a peer has not been sent, the same again only after
    net.republish_s; none to a peer that holds the newest; control alone while there is no model."""
    pub, address = publisher
    first = Listener(zctx, address, MODEL_TOPIC)
    asker = Asker(zctx, pub.snapshot_address)  # type: ignore[attr-defined]
    try:
        assert asker.ask(wait=0.3) == []  # nothing to send yet: no reply
        pub.post_control(ControlState(quota=64))
        wait_for(lambda: pub.controls_sent == 1, 5, "the first control")
        assert [m.kind for m in asker.ask()] == [CONTROL]  # control alone, while no model exists
        pub.post_model(3, model(3))
        wait_for(lambda: pub.versions_sent == 1, 5, "model 3")
        assert [m.kind for m in asker.ask()] == [CONTROL, MODEL]
        for _ in range(20):  # asking again and again: control, no model (it was sent this version already)
            assert [m.kind for m in asker.ask()] == [CONTROL]
        assert [m.kind for m in asker.ask(have=("inc-L", 3))] == [CONTROL]
        pub.post_model(4, model(4))
        wait_for(lambda: pub.versions_sent == 2, 5, "model 4")
        reply = asker.ask(have=("inc-L", 3))
        assert [m.kind for m in reply] == [CONTROL, MODEL] and reply[1].version == 4
        late = [Listener(zctx, address, MODEL_TOPIC) for _ in range(5)]  # joiners: nothing goes out for them
        wait_for(lambda: pub.model_joins == 6, 5, "the joiners' subscriptions")
        assert [m.version for m in first.read(0.3)] == [3, 4] and pub.models_sent == 2  # the versions, no more
        assert all(listener.read(0.0) == [] for listener in late)
        snap = pub.snapshots
        assert snap is not None and snap.models_sent == 2 and snap.models_withheld == 20
        assert snap.model_bytes == 2 * len(model(3))
    finally:
        asker.close()


@pytest.mark.burst(4)
def test_peers_that_reconnect_to_look_new_get_no_more_models_than_the_bucket_holds(
        publisher: tuple[Publisher, str], zctx: zmq.Context) -> None:
    pub, _ = publisher
    pub.post_model(1, model(1))
    wait_for(lambda: pub.versions_sent == 1, 5, "model 1")
    got = 0
    for _ in range(12):  # twelve connections, each a new peer to the ROUTER
        asker = Asker(zctx, pub.snapshot_address)  # type: ignore[attr-defined]
        try:
            got += sum(m.kind == MODEL for m in asker.ask())
        finally:
            asker.close()
    assert got == 4  # the burst; it refills at 4 per net.republish_s (30 s here)
    assert pub.snapshots is not None and pub.snapshots.models_withheld == 8


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


def test_control_names_the_learners_reward_factor_for_the_actors_priorities(
        publisher: tuple[Publisher, str], zctx: zmq.Context) -> None:
    pub, address = publisher
    control = Listener(zctx, address, CONTROL_TOPIC)
    wait_for(lambda: pub.control_joins == 1, 5, "the subscription")
    pub.post_control(ControlState(allowance=800), grant=True)
    control.read(0.3)  # (read before the next: the publisher sends only the newest state it holds)
    pub.post_control(ControlState(allowance=800, reward_scale=0.0125), grant=True)
    got = control.read(0.3)  # every message so far, in order
    assert [control_factor(m.meta) for m in got] == [1.0, 0.0125]  # a factor of 1 is not sent
    assert CONTROL_KEY not in got[0].meta and got[1].meta[CONTROL_KEY] == 0.0125
    assert pub.finish("stopped", timeout=5)
    assert control.read(0.3)[-1].meta[CONTROL_KEY] == 0.0125  # kept to the end


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
    after STALE_S the role asks the snapshot ROUTER for it, once, and takes the model of the reply."""
    from zmqrl.roles.skeleton import RoleProcess
    from zmqrl.roles.stream import STALE_S, LearnerStream

    cfg = cartpole_cfg()
    xpub = make_socket(zctx, zmq.XPUB, SocketOptions.pub(sndhwm=1000), bind="tcp://127.0.0.1:0")
    router = make_socket(zctx, zmq.ROUTER, SocketOptions.snapshot_server(), bind="tcp://127.0.0.1:0")
    role = RoleProcess(cfg, "probe")
    stream = LearnerStream(role, cfg.net, xpub.getsockopt_string(zmq.LAST_ENDPOINT),
                           snapshot=router.getsockopt_string(zmq.LAST_ENDPOINT))
    requests: list[Message] = []
    identities: list[bytes] = []

    def read_requests() -> list[Message]:
        while router.poll(0, zmq.POLLIN):
            identity, *frames = router.recv_multipart()
            identities.append(identity)
            requests.append(decode(frames))
        return requests

    try:
        wait_for(lambda: len(read_requests()) >= 1, 5, "the role's first snapshot request")
        assert requests[0].meta == {}  # it holds no model yet
        joins: list[bytes] = []

        def read_joins() -> list[bytes]:
            while xpub.poll(0, zmq.POLLIN):
                joins.append(xpub.recv())
            return joins
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
        before = len(read_requests())
        asked = stream.asked
        started = time.monotonic()
        while stream.asked == asked:  # control says 2, no model 2 comes
            assert time.monotonic() - started < STALE_S + 5, "the role never asked for the model again"
            send(1, 2, False)
            take()
            time.sleep(0.05)
        assert time.monotonic() - started >= STALE_S * 0.9
        wait_for(lambda: len(read_requests()) > before, 5, "the request at the ROUTER")
        assert requests[-1].kind == SNAPSHOT and requests[-1].meta == {"have": ["inc-L", 1]}
        # answer the newest request: control and model 2, to this role alone
        router.send_multipart([identities[-1], bytes(encode_control("learner", "inc-L", 99, 2, {"pause": False})[0]),
                               bytes(encode_model("learner", "inc-L", 2, PARAMS)[0])])
        wait_for(lambda: stream.newest_model()[0] is not None or stream.versions.version == 2, 5, "model 2")
        assert stream.snapshot_models == 1
        asked = stream.asked
        for _ in range(30):  # up to date now: nothing more asked
            send(2, 2, False)
            take()
            time.sleep(0.05)
        assert stream.asked == asked
    finally:
        role.close()
        xpub.close(linger=0)
        router.close(linger=0)
