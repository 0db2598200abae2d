"""Floods of connections that never become ZeroMQ peers: they must neither wedge a role nor flood its log.

libzmq reports every connection on a watched socket to its monitor, a queue of about 2,000 events
that its one I/O thread waits on when full, and with it every link of the process. A real
``zmqrl proxy`` is blocked on a learner that is away (nothing of its own reads the monitors then)
while thousands of plain TCP connections come and go on its actors' port: when the learner comes,
it must still get the batches. And thousands of connections that fail the ZeroMQ handshake leave a
few log lines, not one each, while every one is still counted; so do CURVE clients refused with a
new key each time.

Plain ``socket`` clients on 127.0.0.1, the proxy as its own process; every wait has a deadline.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from procs import Procs, wait_for  # noqa: E402
from zmqrl.roles.addresses import free_port
from zmqrl.run.rundir import read_json
from zmqrl.wire import (
    BATCH,
    BUNDLE,
    Limits,
    SocketOptions,
    bound_address,
    decode,
    encode,
    make_socket,
    new_incarnation,
    unbundle,
)
from zmqrl.wire.monitor import LinkMonitor
from zmqrl.wire.security import AllowList, Security

pytestmark = pytest.mark.timeout(180)

BATCHES = 100  # more than the proxy's queue to the learner (64) holds: it blocks on the next
FLOOD = 3000  # connections: the events of any ~2,000 fill a monitor's queue
DELIVER_S = 30.0  # after the flood, every batch must reach the learner within this
# A ZMTP 3 greeting naming a mechanism that does not exist: libzmq fails the handshake (protocol).
BAD_GREETING = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"JUNK".ljust(20, b"\x00") + b"\x00" * 32


def connect_and_close(port: int, count: int, payload: bytes = b"", timeout: float = 10.0) -> int:
    """Open ``count`` TCP connections to ``port`` one after another, send ``payload`` on each and close
    it; with a payload, wait for the peer to close first (it has then seen the handshake fail).
    Returns how many connected; stops at the first that does not (a wedged listener stops accepting)."""
    made = 0
    for _ in range(count):
        with socket.socket() as conn:
            conn.settimeout(timeout)
            try:
                conn.connect(("127.0.0.1", port))
                if payload:
                    conn.sendall(payload)
                    while conn.recv(4096):  # until libzmq drops it
                        pass
            except OSError:
                return made
            made += 1
    return made


def _proxy(procs: Procs, tmp_path: Path, learner_port: int, name: str = "proxy") -> tuple[int, Path]:
    """A proxy process with actors' port ``bind`` and the learner at ``learner_port``; its port and run dir."""
    port, run_dir = free_port(), tmp_path / name
    proc = procs.role(name, "proxy", "--bind", f"tcp://127.0.0.1:{port}", "--learner",
                      f"tcp://127.0.0.1:{learner_port}", "--run-dir", str(run_dir), "--name", name,
                      overrides=["net.proxy_merge=1", "net.stats_interval_s=600"])
    wait_for(lambda: "actors connect to" in proc.text(), 60, f"{name} to bind", procs.describe)
    return port, run_dir


@pytest.mark.slow
def test_a_proxy_blocked_on_its_learner_is_not_wedged_by_a_flood_of_connections(tmp_path: Path,
                                                                                   procs: Procs) -> None:
    learner_port = free_port()
    port, _ = _proxy(procs, tmp_path, learner_port)
    proxy = procs["proxy"]
    ctx = zmq.Context()
    actor = ctx.socket(zmq.PUSH)
    learner = ctx.socket(zmq.PULL)
    for sock in (actor, learner):
        sock.setsockopt(zmq.LINGER, 0)
    try:
        actor.connect(f"tcp://127.0.0.1:{port}")
        inc, arrays = new_incarnation(), {"reward": np.zeros(64, np.float32)}
        for seq in range(BATCHES):
            actor.send_multipart(encode(BATCH, sender="actor-0", incarnation=inc, seq=seq, version=0, arrays=arrays))
        wait_for(lambda: "is not taking batches" in proxy.text(), 30, "the proxy to block on the learner",
                 procs.describe)

        made = connect_and_close(port, FLOOD)
        assert proxy.alive(), procs.describe()

        learner.bind(f"tcp://127.0.0.1:{learner_port}")
        seqs: list[int] = []

        def received() -> bool:
            while learner.poll(0):
                msg = decode(learner.recv_multipart(), Limits.only({BATCH, BUNDLE}))
                seqs.extend(m.seq for m in (unbundle(msg) if msg.kind == BUNDLE else [msg]))
            return len(seqs) >= BATCHES

        wait_for(received, DELIVER_S, f"the {BATCHES} batches at the learner after {made} connections came and "
                                      f"went (got {len(seqs)})", procs.describe, interval=0.05)
        assert sorted(seqs) == list(range(BATCHES))
        assert made == FLOOD, f"only {made} of {FLOOD} connections were accepted"
    finally:
        actor.close()
        learner.close()
        ctx.term()
    assert procs["proxy"].stop() == 0, procs.describe()


@pytest.mark.slow
def test_junk_connections_leave_a_few_log_lines_and_are_all_counted(tmp_path: Path, procs: Procs) -> None:
    port, run_dir = _proxy(procs, tmp_path, free_port())
    proxy = procs["proxy"]
    made = connect_and_close(port, FLOOD, BAD_GREETING)
    assert made == FLOOD, procs.describe()
    assert proxy.stop() == 0, procs.describe()
    lines = [line for line in proxy.text().splitlines() if "handshake" in line]
    assert 1 <= len(lines) <= 5, "\n".join(lines[:10])
    stats = read_json(run_dir / "roles" / "proxy.json")
    assert stats is not None, procs.describe()
    (actors_link,) = [link for link in stats["links"] if link["protocol_failures"]]
    assert actors_link["protocol_failures"] == FLOOD, stats["links"]
    assert actors_link["drops"] == 0, stats["links"]  # a failed handshake is no lost link


def test_a_monitor_counts_every_failed_handshake_and_logs_a_few(caplog: pytest.LogCaptureFixture) -> None:
    """In-process: the LinkMonitor of a bound socket that nobody polls (its thread reads the events)."""
    caplog.set_level(logging.INFO, logger="zmqrl")
    ctx = zmq.Context()
    pull = make_socket(ctx, zmq.PULL, SocketOptions.pull(), bind="tcp://127.0.0.1:*", watch=True)
    link = LinkMonitor(pull, "proxy", "from actors")
    try:
        port = int(bound_address(pull).rsplit(":", 1)[1])
        made = connect_and_close(port, 500, BAD_GREETING)
        plain = connect_and_close(port, 500)
        assert (made, plain) == (500, 500)
        wait_for(lambda: link.stats()["protocol_failures"] == 500 and link.stats()["aborted_handshakes"] >= 500,
                 10.0, "every failed handshake counted", lambda: str(link.stats()))
        stats = link.stats()
        assert (stats["drops"], stats["connects"], stats["down"]) == (0, 0, False), stats
        lines = [r.getMessage() for r in caplog.records if "handshake" in r.getMessage()]
        assert 1 <= len(lines) <= 2, lines
    finally:
        link.close()
        pull.close(linger=0)
        ctx.term()
    summary = [r.getMessage() for r in caplog.records if "handshake" in r.getMessage()][-1]
    assert "suppressed" in summary or "499" in summary, summary


def terminated(ctx: zmq.Context, timeout: float = 10.0) -> bool:
    """Terminate ``ctx`` in a thread; whether it finished within ``timeout`` (a socket left open holds it)."""
    term = threading.Thread(target=ctx.term, daemon=True)
    term.start()
    term.join(timeout)
    return not term.is_alive()


@pytest.mark.timeout(60)
def test_closing_a_link_monitor_lets_its_context_terminate() -> None:
    """The monitor socket belongs to the link thread: closing the link closes it there, at once."""
    ctx = zmq.Context()
    pull = make_socket(ctx, zmq.PULL, SocketOptions.pull(), bind="tcp://127.0.0.1:*", watch=True)
    push = make_socket(ctx, zmq.PUSH, SocketOptions.push(), connect=bound_address(pull), watch=True)
    links = [LinkMonitor(pull, "learner", "data peers"), LinkMonitor(push, "actor-0", "to learner")]
    try:
        wait_for(lambda: [link.stats()["connects"] for link in links] == [1, 1], 10.0, "both links up, unpolled")
    finally:
        started = time.monotonic()
        for link in links:
            link.close()
            link.close()  # twice is harmless
        push.close(linger=0)
        pull.close(linger=0)
        assert terminated(ctx)
    assert time.monotonic() - started < 4.0  # (a close waits on the link thread, not on a timeout)


@pytest.mark.timeout(60)
def test_a_link_monitor_left_open_does_not_hold_its_context() -> None:
    """Its socket closed (MONITOR_STOPPED) or its context terminating (ETERM): the link thread lets go."""
    ctx = zmq.Context()
    closed_first = make_socket(ctx, zmq.PULL, SocketOptions.pull(), bind="tcp://127.0.0.1:*", watch=True)
    left_open = make_socket(ctx, zmq.PULL, SocketOptions.pull(), bind="tcp://127.0.0.1:*", watch=True)
    first = LinkMonitor(closed_first, "learner", "data peers")
    second = LinkMonitor(left_open, "learner", "eval peers")
    closed_first.close(linger=0)
    try:
        wait_for(lambda: first.stats() and first._closed.is_set(), 10.0, "the monitor of a closed socket released")
    finally:
        left_open.close(linger=0)
        done = terminated(ctx)
        first.close()
        second.close()
    assert done, "the context is held by a monitor socket nobody closed"
    assert second._closed.is_set()


def test_refused_curve_keys_leave_one_line_however_many_keys(caplog: pytest.LogCaptureFixture) -> None:
    """A client making up a new key for each connection is refused each time, counted each time, and
    logged once per interval, not once per key."""
    caplog.set_level(logging.INFO, logger="zmqrl")
    server = zmq.curve_keypair()[0]
    allow = AllowList(Security(server_public=server, server_secret=None, public=server, secret=b"",
                               allowed=frozenset({server}), allowed_dir="keys/clients"))
    allow.address = "10.0.0.9"
    keys = [zmq.curve_keypair()[0] for _ in range(1000)]
    assert not any(allow.callback("zmqrl", key) for key in keys)
    assert allow.callback("zmqrl", server)  # (the server key is admitted as ever)
    assert allow.counts() == {"curve_allowed": 1, "curve_refused": 1000}
    lines = [r.getMessage() for r in caplog.records if "refused CURVE client" in r.getMessage()]
    assert len(lines) == 1, lines[:5]
    assert lines[0].startswith(f"refused CURVE client 10.0.0.9 with key {keys[0].decode()}: not in the allow-list "
                               "keys/clients (1 refused so far)"), lines[0]
