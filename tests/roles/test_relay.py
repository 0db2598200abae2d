"""A host's relay (in its proxy) between the learner's publisher and the host's roles: each version
leaves the learner once per host, a joiner is served by its relay alone, and every guarantee of the
stream holds through it: a relay restart, a learner restart, CURVE on both legs, storms of
subscriptions and snapshot requests that make the learner send nothing beyond its versions.

Real sockets, the learner's real publisher and snapshot server, the real proxy with its relay, the
roles' real stream (:class:`~zmqrl.roles.stream.LearnerStream`), all in this process."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

import procs
from rigs import tcp
from zmqrl.config import Config
from zmqrl.roles.fit import signature_digest
from zmqrl.roles.net import options
from zmqrl.roles.proxy import Proxy
from zmqrl.roles.publisher import ControlState, Publisher
from zmqrl.roles.ratelimit import Allowances
from zmqrl.roles.skeleton import RoleProcess
from zmqrl.roles.snapshots import SnapshotServer
from zmqrl.roles.stream import SILENT_S, LearnerStream
from zmqrl.wire import SocketOptions, encode_model, encode_snapshot_request, keygen, send_frames

pytestmark = pytest.mark.timeout(90)

PARAMS = {"w": np.arange(250_000, dtype=np.float32)}  # a 1 MB model
TASK = {"algo": "dqn", "env_id": "CartPole-v1", "obs": ["Box", [4], "<f4"], "action": ["Discrete", 2]}


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    procs.wait_for(cond, timeout, what, interval=0.01)


class Learner:
    """The learner's stream as the learner makes it: its publisher thread on an XPUB and a snapshot ROUTER."""

    def __init__(self, cfg: Config, model: str, snapshot: str, task: dict[str, Any] | None = None) -> None:
        self.role = RoleProcess(cfg, "learner")
        net = cfg.net
        pub = self.role.socket(zmq.XPUB, options(net, SocketOptions.pub(), data_path=True), bind=model)
        pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        router = self.role.socket(zmq.ROUTER, options(net, SocketOptions.snapshot_server(), data_path=True),
                                  bind=snapshot)
        self.task = task or TASK
        self.publisher = Publisher(pub, self.role.incarnation, signature_digest(self.task),
                                   Allowances(16, 600.0, unstamped=0), net.republish_s,
                                   SnapshotServer(router, "learner", net.republish_s, burst=net.max_peers))
        self.publisher.start()
        self.size = len(self.frame(0))
        self.addresses = (model, snapshot)

    @property
    def incarnation(self) -> str:
        return self.role.incarnation

    def frame(self, version: int, task: dict[str, Any] | None = None) -> bytes:
        return bytes(encode_model("learner", self.incarnation, version, PARAMS,
                                  meta={"task": task or self.task})[0])

    def publish(self, version: int, *, paused: bool = False, task: dict[str, Any] | None = None) -> None:
        """A new version, and control naming it (as the learner's loop hands them over)."""
        self.publisher.post_model(version, self.frame(version, task))
        self.publisher.post_control(ControlState(paused=paused, allowance=100), grant=True)

    def stats(self) -> dict[str, Any]:
        return self.publisher.stats()

    def close(self) -> None:
        self.publisher.stop()
        self.role.close()


class Role:
    """A role's side of a stream (an actor's, without the envs): its newest model and control."""

    def __init__(self, cfg: Config, name: str, model: str, snapshot: str | None) -> None:
        self.process = RoleProcess(cfg, name)
        self.stream = LearnerStream(self.process, cfg.net, model, snapshot=snapshot, digest=signature_digest(TASK))
        self.controls: list[dict[str, Any]] = []
        self.joined = time.monotonic()

    def poll(self) -> int:
        """Take what came; the version held (-1: none)."""
        self.stream.take_control(lambda msg: self.controls.append(msg.meta))
        self.stream.newest_model()
        self.stream.take_control(lambda msg: self.controls.append(msg.meta))
        return self.stream.versions.version

    @property
    def incarnation(self) -> str | None:
        return self.stream.versions.incarnation

    def close(self) -> None:
        self.process.close()


class Host:
    """A host's proxy with its relay (running), as ``zmqrl host`` starts it."""

    def __init__(self, cfg: Config, learner: tuple[str, str], relay: tuple[str, str], name: str = "proxy-h") -> None:
        self.proxy = Proxy(cfg, tcp(), tcp(), name, model_addr=learner[0], snapshot_addr=learner[1], relay=relay)
        assert self.proxy.relay is not None
        self.relay = self.proxy.relay
        self.relay.start()

    def close(self) -> None:
        self.proxy.close()


@pytest.fixture
def rig(cartpole_cfg: Callable[..., Config]) -> Iterator[Callable[..., Any]]:
    """``make(kind, ...)``: learners, hosts and roles, all closed at the end."""
    made: list[Any] = []

    def make(kind: type, *args: Any, **kwargs: Any) -> Any:
        thing = kind(*args, **kwargs)
        made.append(thing)
        return thing

    yield make
    for thing in reversed(made):
        thing.close()


def one_host(rig: Callable[..., Any], cfg: Config) -> tuple[Learner, Host, Role]:
    """A learner, one host's relay and one role behind it, the role holding version 1."""
    model, snap = tcp(), tcp()
    learner = rig(Learner, cfg, model, snap)
    host = rig(Host, cfg, (model, snap), (tcp(), tcp()))
    role = rig(Role, cfg, "actor-0", *host.proxy.relay_addrs.values())
    learner.publish(1)
    all_hold([role], 1)
    return learner, host, role


def all_hold(roles: list[Role], version: int, timeout: float = 10.0, incarnation: str | None = None) -> None:
    wait_for(lambda: all(r.poll() == version and (incarnation is None or r.incarnation == incarnation)
                         for r in roles), timeout, f"every role holding version {version}")


def test_a_version_leaves_the_learner_once_per_host_and_a_joiner_is_served_by_its_relay_alone(
        rig: Callable[..., Any], cartpole_cfg: Callable[..., Config]) -> None:
    cfg = cartpole_cfg("run.log_level=warning")
    model, snap = tcp(), tcp()
    learner = rig(Learner, cfg, model, snap)
    hosts = [rig(Host, cfg, (model, snap), (tcp(), tcp()), f"proxy-{h}") for h in range(2)]
    roles = [rig(Role, cfg, f"actor-{h}-{i}", *host.proxy.relay_addrs.values())
             for h, host in enumerate(hosts) for i in range(4)]
    learner.publish(1)
    all_hold(roles, 1)
    before = learner.stats()
    late = [rig(Role, cfg, f"late-{i}", *hosts[0].proxy.relay_addrs.values()) for i in range(6)]
    # told no snapshot address: the relay's control names its own snapshot port, not the learner's
    late.append(rig(Role, cfg, "late-told-nothing", hosts[1].proxy.relay_addrs["model"], None))
    all_hold(late, 1)  # served by the relay: the learner sends nothing for them
    after = learner.stats()
    assert after["models_published"] == before["models_published"] == 1
    assert after["snapshot_models"] == before["snapshot_models"] <= len(hosts)
    assert hosts[0].relay.snapshots.models_sent >= len(late) - 1 and hosts[1].relay.snapshots.models_sent >= 1
    assert late[-1].stream.snapshot_address == hosts[1].proxy.relay_addrs["snapshot"]
    learner.publish(2)
    all_hold(roles + late, 2)
    stats = learner.stats()
    assert stats["model_versions_sent"] == 2 and stats["models_published"] == 2
    # the learner's model bytes per version: one per host's relay, whatever the number of actors
    assert stats["model_bytes"] + stats["snapshot_model_bytes"] <= 2 * (len(hosts) + 1) * learner.size
    assert all(h.relay.models_refused == 0 and h.relay.version == 2 for h in hosts)


def test_a_model_whose_task_does_not_hash_to_its_controls_digest_is_held_back(
        rig: Callable[..., Any], cartpole_cfg: Callable[..., Config]) -> None:
    learner, host, role = one_host(rig, cartpole_cfg("run.log_level=warning"))
    learner.publish(2, task={**TASK, "env_id": "Pendulum-v1"})  # control still names the CartPole task
    wait_for(lambda: host.relay.models_refused >= 1, 10, "the relay holding the model back")
    learner.publish(3)
    all_hold([role], 3)
    assert host.relay.version == 3


def test_a_relay_restart_its_roles_keep_their_model_and_catch_up(
        rig: Callable[..., Any], cartpole_cfg: Callable[..., Config]) -> None:
    cfg = cartpole_cfg("run.log_level=warning")
    model, snap, relay = tcp(), tcp(), (tcp(), tcp())
    learner = rig(Learner, cfg, model, snap)
    host = Host(cfg, (model, snap), relay)
    roles = [rig(Role, cfg, f"actor-{i}", *relay) for i in range(3)]
    try:
        learner.publish(1)
        all_hold(roles, 1)
    finally:
        host.close()  # the relay is gone ...
    learner.publish(2)
    for _ in range(20):  # ... its roles hold the model they have
        assert all(r.poll() == 1 for r in roles)
        time.sleep(0.01)
    asked = learner.stats()["snapshot_models"]
    again = rig(Host, cfg, (model, snap), relay)  # the same addresses, a new process
    all_hold(roles, 2)  # the new relay asked the learner for the newest model, once; its roles caught up
    assert learner.stats()["snapshot_models"] == asked + 1
    learner.publish(3)
    all_hold(roles, 3)
    assert again.relay.models >= 2 and learner.stats()["models_published"] == 3


def roles_behind_a_relay(rig: Callable[..., Any], cfg: Config, model: str, snap: str,
                         count: int) -> tuple[Learner, list[Role]]:
    """A learner the test closes itself (not rigged) and ``count`` roles behind one host's relay."""
    first = Learner(cfg, model, snap)
    host = rig(Host, cfg, (model, snap), (tcp(), tcp()))
    return first, [rig(Role, cfg, f"actor-{i}", *host.proxy.relay_addrs.values()) for i in range(count)]


def wait_all_down(roles: list[Role]) -> None:
    """Until every role sees the learner out of reach: the link to its relay stays up, the silence tells."""
    wait_for(lambda: all(r.poll() >= 0 and r.stream.down for r in roles), SILENT_S + 30, "the roles to see it gone")


def test_a_learner_restart_is_seen_through_a_relay(
        rig: Callable[..., Any], cartpole_cfg: Callable[..., Config]) -> None:
    cfg = cartpole_cfg("run.log_level=warning")
    model, snap = tcp(), tcp()
    first, roles = roles_behind_a_relay(rig, cfg, model, snap, 3)
    try:
        first.publish(5)
        all_hold(roles, 5, incarnation=first.incarnation)
        assert not any(r.stream.down for r in roles)
    finally:
        first.close()
    wait_all_down(roles)
    second = rig(Learner, cfg, model, snap)  # restarted without --resume: a new version line
    second.publish(0)
    all_hold(roles, 0, incarnation=second.incarnation)
    assert not any(r.stream.down for r in roles)
    wait_for(lambda: all(r.poll() == 0 and r.stream._applied[0] == second.incarnation for r in roles), 10,
             "control of the new line")


def test_a_learner_gone_before_its_first_control_is_seen_gone_through_a_relay(
        rig: Callable[..., Any], cartpole_cfg: Callable[..., Config]) -> None:
    """A learner that sent a model and stopped before its control went out: the roles hold the model and
    heard no control at all, and its silence still tells them it is out of reach (the clock starts at
    the model)."""
    cfg = cartpole_cfg("run.log_level=warning")
    model, snap = tcp(), tcp()
    first, roles = roles_behind_a_relay(rig, cfg, model, snap, 2)
    try:
        first.publisher.post_model(4, first.frame(4))  # (no control posted: none goes out)
        all_hold(roles, 4, incarnation=first.incarnation)
        assert not any(r.controls for r in roles)
    finally:
        first.close()
    wait_all_down(roles)


def test_a_restarted_learner_stopped_before_its_first_model_still_ends_the_run_through_a_relay(
        rig: Callable[..., Any], cartpole_cfg: Callable[..., Config]) -> None:
    """Control of a new learner line waits for that line's model, except ``done``: a learner resumed and
    stopped at once (SIGTERM within a second) may never send a model, and its roles must still finish."""
    cfg = cartpole_cfg("run.log_level=warning")
    model, snap = tcp(), tcp()
    first = Learner(cfg, model, snap)
    host = rig(Host, cfg, (model, snap), (tcp(), tcp()))
    roles = [rig(Role, cfg, f"actor-{i}", *host.proxy.relay_addrs.values()) for i in range(2)]
    try:
        first.publish(5)
        all_hold(roles, 5, incarnation=first.incarnation)
    finally:
        first.close()
    second = rig(Learner, cfg, model, snap)  # no model from this line, ever: only control, then done
    second.publisher.post_control(ControlState(paused=False, allowance=100), grant=True)
    for _ in range(20):  # control of the new line alone waits: the roles keep the first line's control
        assert all(r.poll() == 5 for r in roles)
        time.sleep(0.01)
    assert all(r.stream._applied[0] == first.incarnation for r in roles)
    second.publisher.post_control(ControlState(done="stopped by SIGTERM"))
    wait_for(lambda: all(r.poll() == 5 and any(c.get("done") == "stopped by SIGTERM" for c in r.controls)
                         for r in roles), 10, "the new line's done at every role behind the relay")
    assert host.relay.finished == "stopped by SIGTERM"


def test_curve_on_both_legs_of_a_relay(rig: Callable[..., Any], cartpole_cfg: Callable[..., Config],
                                       tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keygen(keys, "server")
    keygen(keys, "host", allow=True)
    keygen(keys, "stranger")
    curve = ["run.log_level=warning", "net.security=curve", f"net.keys_dir={keys}"]
    cfg = cartpole_cfg(*curve, "net.client_key=host")
    model, snap = tcp(), tcp()
    learner = rig(Learner, cfg, model, snap)
    host = rig(Host, cfg, (model, snap), (tcp(), tcp()))
    role = rig(Role, cfg, "actor-0", *host.proxy.relay_addrs.values())
    stranger = rig(Role, cartpole_cfg(*curve, "net.client_key=stranger"), "stranger",
                   *host.proxy.relay_addrs.values())
    learner.publish(1)
    all_hold([role], 1)
    learner.publish(2)
    all_hold([role], 2)
    assert stranger.poll() == -1 and stranger.controls == []  # refused by the relay's allow-list
    assert host.proxy.stats()["auth"].get("curve_refused", 0) >= 1


def test_storms_of_subscriptions_and_snapshot_requests_make_the_learner_send_no_more_models(
        rig: Callable[..., Any], cartpole_cfg: Callable[..., Config], zctx: zmq.Context) -> None:
    """Subscribing and unsubscribing in a loop, on the learner's XPUB and on a relay's, and asking for
    snapshots in a loop: the learner sends its versions (and a snapshot per relay and per new peer, at
    most the bucket's burst), nothing for the rest. Counts, not timings."""
    burst = 8
    learner, host, role = one_host(rig, cartpole_cfg("run.log_level=warning", f"net.max_peers={burst}"))
    model, snap = learner.addresses
    relay_model = host.proxy.relay_addrs["model"]
    before = learner.stats()
    subs = []
    for address in (model, relay_model):
        for _ in range(10):
            sub = zctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.connect(address)
            subs.append(sub)
    askers = [zctx.socket(zmq.DEALER) for _ in range(2)]
    for asker, address in zip(askers, (snap, host.proxy.relay_addrs["snapshot"]), strict=True):
        asker.setsockopt(zmq.LINGER, 0)
        asker.connect(address)
    for k in range(300):
        for sub in subs:
            sub.setsockopt(zmq.SUBSCRIBE if k % 2 == 0 else zmq.UNSUBSCRIBE, b"ZQ")
        for asker in askers:
            send_frames(asker, encode_snapshot_request("storm", "inc-S", k, None))
    wait_for(lambda: learner.publisher.model_joins - before["model_subscriptions"] >= 1000, 20,
             "the storm's subscriptions at the learner")
    wait_for(lambda: learner.publisher.snapshots is not None  # noqa: SIM300
             and learner.publisher.snapshots.requests - before["snapshot_requests"] >= 300, 20,
             "the storm's snapshot requests at the learner")
    wait_for(lambda: host.relay.snapshots.requests >= 300, 20, "the storm's snapshot requests at the relay")
    for _ in range(30):  # new connections, each a new peer to the learner's ROUTER
        peer = zctx.socket(zmq.DEALER)
        peer.setsockopt(zmq.LINGER, 0)
        peer.connect(snap)
        send_frames(peer, encode_snapshot_request("storm", "inc-S", 0, None))
        peer.poll(200, zmq.POLLIN)
        peer.close()
    learner.publish(2)
    all_hold([role], 2)
    after = learner.stats()
    assert after["models_published"] == 2  # its two versions, nothing for a join (no republish in 30 s)
    assert after["model_subscriptions"] - before["model_subscriptions"] >= 1000
    new_snapshots = after["snapshot_models"] - before["snapshot_models"]
    assert 1 <= new_snapshots <= burst  # the looping asker's one, the new peers' up to the burst
    assert after["snapshot_withheld"] - before["snapshot_withheld"] >= 299
    for sock in subs + askers:
        sock.close(linger=0)
