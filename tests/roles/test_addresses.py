"""Addresses from flags and config: checked where they are parsed, and peers that never answer are
logged within a second of the connect.

Three layers: :func:`zmqrl.roles.addresses.endpoint` on good and bad forms; ``zmqrl ROLE`` processes
given bad addresses (exit 2, one line naming the flag); and :class:`~zmqrl.wire.monitor.LinkMonitor`
on real sockets, in this process and in role processes, pointed at a host that never resolves
(the reserved ``.invalid`` TLD), a closed loopback port and a loopback port that accepts nothing.
No traffic leaves 127.0.0.1 (a ``.invalid`` name is answered by the resolver without a connection).
"""

from __future__ import annotations

import logging
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from procs import CONFIG, REPO, Proc, Procs, role_env, wait_for  # noqa: E402
from zmqrl.config import ConfigError
from zmqrl.roles import addresses as common
from zmqrl.roles.addresses import endpoint, free_port
from zmqrl.wire import SocketOptions, make_socket
from zmqrl.wire import monitor as monitor_mod
from zmqrl.wire.monitor import LinkMonitor, note_origin

NOHOST = "nohost.invalid"  # RFC 2606: never resolves
FIRST_LINE_S = 5.0  # deadline for the first waiting line (it goes out about 0.5 s after the connect)


def proxy_endpoint(addr: str | None, bind: bool = False, host: str = "127.0.0.1", port: int = 5557) -> str:
    return endpoint(addr, host, port, "--proxy", bind=bind, host_key="net.proxy_host", port_key="net.proxy_port")


# --- endpoint(): the forms it takes and the ones it refuses ------------------------------------------

@pytest.mark.parametrize("addr, bind, expected", [
    (None, False, "tcp://127.0.0.1:5557"),
    ("", False, "tcp://127.0.0.1:5557"),
    ("learner-1", False, "tcp://learner-1:5557"),
    ("learner-1:6000", False, "tcp://learner-1:6000"),
    ("tcp://learner-1:6000", False, "tcp://learner-1:6000"),
    ("TCP://Node7.Example.org:1", False, "tcp://Node7.Example.org:1"),
    ("  10.0.0.1:65535 ", False, "tcp://10.0.0.1:65535"),
    ("fqdn.example.org.:5557", False, "tcp://fqdn.example.org.:5557"),
    ("compose_service:5557", False, "tcp://compose_service:5557"),
    ("[::1]:5557", False, "tcp://[::1]:5557"),
    ("tcp://[fe80::1%eth0]:5557", False, "tcp://[fe80::1%eth0]:5557"),
    ("[2001:db8::7]", False, "tcp://[2001:db8::7]:5557"),
    ("a" * 63 + ".example", False, "tcp://" + "a" * 63 + ".example:5557"),
    ("*:0", True, "tcp://*:0"),
    ("tcp://*:*", True, "tcp://*:*"),
    ("0.0.0.0:5555", True, "tcp://0.0.0.0:5555"),
    ("[::]:0", True, "tcp://[::]:0"),
    ("127.0.0.1:0", True, "tcp://127.0.0.1:0"),
    ("localhost", True, "tcp://localhost:5557"),
])
def test_endpoint_accepts(addr: str | None, bind: bool, expected: str) -> None:
    assert proxy_endpoint(addr, bind) == expected


@pytest.mark.parametrize("addr, bind, problem", [
    ("tcp://nohost:99999", False, "port 99999 is out of range; ports are 1..65535"),
    ("127.0.0.1:70000", True, "port 70000 is out of range; ports are 1..65535 (0 or * picks a free one)"),
    ("tcp://127.0.0.1:0", False, "port 0 only means 'pick a free port' where a role binds"),
    ("tcp://127.0.0.1:*", False, "port '*' is not a port number"),
    ("ipc:///tmp/zmqrl.sock", False, "unsupported scheme 'ipc'; zmqrl speaks tcp only"),
    ("udp://h:5557", False, "unsupported scheme 'udp'"),
    ("tcp://*:5557", False, "'*' means every interface and only works for a bind"),
    ("0.0.0.0:5557", False, "'0.0.0.0' means every interface"),
    ("[::]:5557", False, "'[::]' means every interface"),
    ("h:", False, "no port after ':'"),
    ("h:abc", False, "port 'abc' is not a port number"),
    ("h:-1", False, "port '-1' is not a port number"),
    ("tcp://h:5557/path", False, "port '5557/path' is not a port number"),
    ("h/x", False, "expected tcp://HOST:PORT, HOST:PORT or HOST"),
    (":5557", False, "no host"),
    ("tcp://:5557", False, "no host"),
    ("::1:5557", False, "an IPv6 address goes in brackets"),
    ("[::1:5557", False, "needs its closing ']'"),
    ("[::1]x", False, "unexpected 'x' after the IPv6 address"),
    ("[zz::1]:5557", False, "[zz::1] is not an IPv6 address"),
    ("300.1.1.1:5557", False, "'300.1.1.1' is not an IPv4 address"),
    ("1.2.3:5557", False, "'1.2.3' is not an IPv4 address"),
    ("5557", False, "'5557' is not a host (a port alone?)"),
    ("bad host:5557", False, "'bad host' is not a valid host name"),
    ("-lead:5557", False, "'-lead' is not a valid host name"),
    ("trail-.example:5557", False, "is not a valid host name"),
    ("a..b:5557", False, "'a..b' is not a valid host name"),
    ("a" * 64 + ":5557", False, "is not a valid host name"),
    ("bad!host", True, "'bad!host' is not a valid host name"),
])
def test_endpoint_refuses_naming_the_flag_and_value(addr: str, bind: bool, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        proxy_endpoint(addr, bind)
    message = str(err.value)
    assert message.startswith(f"--proxy {addr.strip()!r}: "), message
    assert problem in message, message
    assert "\n" not in message


@pytest.mark.skipif(common.ephemeral_ports() is None, reason="the kernel does not say its ephemeral ports")
def test_free_ports_lie_below_the_ephemeral_range(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A port handed to a role cannot be taken by an outgoing connection (nor by a connection to it
    that meets itself) before the role binds: it is outside the range connections take ports from."""
    ephemeral = common.ephemeral_ports()
    assert ephemeral is not None
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == 200 and all(10_000 <= p < ephemeral.start for p in ports)
    with socket.socket() as s:  # and it binds
        s.bind(("127.0.0.1", ports[-1]))
    # the control: where the kernel does not say, ports come from port 0, which is in that range here
    monkeypatch.setattr(common, "_EPHEMERAL_RANGE_FILE", tmp_path / "absent")
    common.ephemeral_ports.cache_clear()
    try:
        assert common.ephemeral_ports() is None
        assert all(free_port() in ephemeral for _ in range(20))
    finally:
        common.ephemeral_ports.cache_clear()


def test_endpoint_names_the_config_key_a_bad_default_came_from() -> None:
    with pytest.raises(ConfigError, match=r"^net\.proxy_host='\*': '\*' means every interface"):
        proxy_endpoint(None, host="*")
    with pytest.raises(ConfigError, match=r"^net\.proxy_host='no host!': "):
        proxy_endpoint(None, host="no host!")
    with pytest.raises(ConfigError, match=r"^net\.proxy_port=0: port 0 only means"):
        proxy_endpoint(None, port=0)
    # A flag with a host only takes the config's port: the error names both.
    with pytest.raises(ConfigError) as err:
        proxy_endpoint("learner-1", port=0)
    assert str(err.value).startswith("net.proxy_port=0: ") and "--proxy 'learner-1' names no port" in str(err.value)
    assert proxy_endpoint(None, bind=True, host="0.0.0.0", port=0) == "tcp://0.0.0.0:0"


# --- the CLI: a bad address is exit 2 and one line, at once --------------------------------------------

def run_cli(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "zmqrl.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=role_env())
    return proc, time.monotonic() - started


@pytest.mark.parametrize("argv, named", [
    (["actor", str(CONFIG), "--id", "0", "--proxy", "tcp://nohost:99999"], "--proxy 'tcp://nohost:99999'"),
    (["actor", str(CONFIG), "--id", "0", "--learner", "tcp://127.0.0.1:0"], "--learner 'tcp://127.0.0.1:0'"),
    (["actor", str(CONFIG), "--id", "0", "--set", "net.proxy_host=no_such host"], "net.proxy_host='no_such host'"),
    (["proxy", str(CONFIG), "--bind", "tcp://127.0.0.1:99999"], "--bind 'tcp://127.0.0.1:99999'"),
    (["proxy", str(CONFIG), "--bind", "tcp://127.0.0.1:0", "--learner", "tcp://*:5555"], "--learner 'tcp://*:5555'"),
    (["learner", str(CONFIG), "--set", "net.bind_host=300.0.0.1"], "net.bind_host='300.0.0.1'"),
    (["learner", str(CONFIG), "--bind-model", "ipc:///tmp/m"], "--bind-model 'ipc:///tmp/m'"),
    (["evaluator", str(CONFIG), "--learner", "127.0.0.1:5556", "--report", "127.0.0.1:"], "--report '127.0.0.1:'"),
])
@pytest.mark.slow
def test_cli_bad_address_exits_2_at_once_naming_it(argv: list[str], named: str) -> None:
    proc, took = run_cli(*argv)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"zmqrl {argv[0]}: config error: {named}: "), lines[0]
    assert took < 30.0, f"{took:.1f}s to refuse a bad address"


# --- LinkMonitor on real sockets in this process ---------------------------------------------------------

@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    try:
        yield context
    finally:
        context.destroy(linger=0)


class Watched:
    """A PUSH socket connecting to ``address`` (as a role makes it) and its LinkMonitor, polled as a role does."""

    def __init__(self, ctx: zmq.Context, address: str, origin: str = "--proxy") -> None:
        note_origin(address, origin)
        self.sock = make_socket(ctx, zmq.PUSH, SocketOptions.push(), connect=address, watch=True)
        self.link = LinkMonitor(self.sock, "actor-0", f"to proxy {address}")
        self.started = time.monotonic()

    def wait_for_line(self, caplog: pytest.LogCaptureFixture, text: str, timeout: float = FIRST_LINE_S) -> float:
        """Seconds from the connect until a warning holding ``text`` is logged (polling every 0.1 s)."""
        def seen() -> bool:
            return any(text in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
        wait_for(seen, timeout, f"a warning with {text!r}", diag=lambda: caplog.text)
        return time.monotonic() - self.started

    def close(self) -> None:
        self.link.close()
        self.sock.close(linger=0)


def warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and text in r.getMessage()]


def test_monitor_reports_a_closed_port_within_a_second(ctx: zmq.Context, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="zmqrl")
    address = f"tcp://127.0.0.1:{free_port()}"
    watched = Watched(ctx, address)
    try:
        took = watched.wait_for_line(caplog, "nothing answers")
        (line,) = warnings(caplog, "nothing answers")
        assert line == (f"actor-0: nothing answers at {address} (connection refused or unreachable) for the link "
                        f"to proxy (--proxy); still trying every 0.5s")
        assert took < FIRST_LINE_S
        # Rate-limited: the attempts go on (every 0.1-0.5 s), the line does not repeat within REPEAT_S.
        wait_for(lambda: watched.link.connect_failures >= 4, 10.0, "four failed attempts")
        assert len(warnings(caplog, "nothing answers")) == 1
        assert watched.link.stats()["connect_failures"] >= 4
    finally:
        watched.close()


def test_monitor_reports_a_closed_port_of_a_named_host(ctx: zmq.Context, caplog: pytest.LogCaptureFixture) -> None:
    """A name that resolves (localhost) with nothing listening: refused, not "cannot resolve"."""
    caplog.set_level(logging.INFO, logger="zmqrl")
    address = f"tcp://localhost:{free_port()}"
    watched = Watched(ctx, address)
    try:
        watched.wait_for_line(caplog, "nothing answers")
        assert warnings(caplog, "nothing answers")[0].startswith(f"actor-0: nothing answers at {address} (connection "
                                                                 "refused or unreachable)")
        assert not warnings(caplog, "cannot resolve")
    finally:
        watched.close()


def test_monitor_reports_an_unresolvable_host(ctx: zmq.Context, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="zmqrl")
    address = f"tcp://{NOHOST}:{free_port()}"
    watched = Watched(ctx, address, origin="--proxy, port from net.proxy_port")
    try:
        took = watched.wait_for_line(caplog, "cannot resolve host")
        (line,) = warnings(caplog, "cannot resolve host")
        assert line.startswith(f"actor-0: cannot resolve host '{NOHOST}'"), line
        assert line.endswith(f"for the link to proxy {address} (--proxy, port from net.proxy_port); "
                             "still trying every 0.5s"), line
        assert took < FIRST_LINE_S
    finally:
        watched.close()


def fill_accept_queue(port: int) -> list[socket.socket]:
    """Connections to a ``listen(0)`` socket on ``port`` until its accept queue is full (it then drops SYNs)."""
    fillers = [socket.socket() for _ in range(2)]
    for filler in fillers:
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
    wait_for(lambda: select.select([], fillers, [], 0.1)[1], 10.0, "a connection in the accept queue")
    return fillers


def test_monitor_reports_a_port_that_accepts_nothing(ctx: zmq.Context, caplog: pytest.LogCaptureFixture) -> None:
    """A listener whose accept queue is full drops new SYNs: the connect gets no reply at all."""
    caplog.set_level(logging.INFO, logger="zmqrl")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = fill_accept_queue(port)
        try:
            watched = Watched(ctx, f"tcp://127.0.0.1:{port}")
            try:
                took = watched.wait_for_line(caplog, "no reply to the TCP connect")
                (line,) = warnings(caplog, "nothing answers")
                assert line.startswith(f"actor-0: nothing answers at tcp://127.0.0.1:{port} (no reply to the TCP "
                                       "connect for "), line
                assert line.endswith("s) for the link to proxy (--proxy); still waiting"), line
                assert took < FIRST_LINE_S
            finally:
                watched.close()
        finally:
            for filler in fillers:
                filler.close()


def test_monitor_reports_a_port_that_speaks_no_zeromq(ctx: zmq.Context, caplog: pytest.LogCaptureFixture) -> None:
    """A listener that never accepts: the kernel completes the TCP connect, and then nothing is said."""
    caplog.set_level(logging.INFO, logger="zmqrl")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        watched = Watched(ctx, f"tcp://127.0.0.1:{port}")
        try:
            took = watched.wait_for_line(caplog, "no ZeroMQ handshake")
            (line,) = warnings(caplog, "no ZeroMQ handshake")
            assert line.startswith(f"actor-0: tcp://127.0.0.1:{port} accepts the TCP connection but no ZeroMQ "
                                   "handshake follows ("), line
            assert line.endswith("s; is a zmqrl role listening there?) for the link to proxy (--proxy); still waiting")
            assert took < FIRST_LINE_S
            assert not watched.link.down and watched.link.peers == 0
        finally:
            watched.close()


def test_monitor_repeats_with_how_long(ctx: zmq.Context, caplog: pytest.LogCaptureFixture,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.INFO, logger="zmqrl")
    monkeypatch.setattr(monitor_mod, "REPEAT_S", 0.5)
    watched = Watched(ctx, f"tcp://127.0.0.1:{free_port()}")
    try:
        wait_for(lambda: len(warnings(caplog, "nothing answers")) >= 2, 10.0, "a second line",
                 diag=lambda: caplog.text)
        first, second = warnings(caplog, "nothing answers")[:2]
        assert "not up for" not in first
        assert "; still trying every 0.5s (not up for " in second and " failed attempts)" in second, second
    finally:
        watched.close()


def test_monitor_says_when_a_late_peer_comes_up(ctx: zmq.Context, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="zmqrl")
    address = f"tcp://127.0.0.1:{free_port()}"
    watched = Watched(ctx, address)
    pull = None
    try:
        watched.wait_for_line(caplog, "nothing answers")
        pull = make_socket(ctx, zmq.PULL, SocketOptions.pull(), bind=address)
        watched.wait_for_line(caplog, f"link to proxy {address} up after")
        assert watched.link.peers == 1 and not watched.link.down
    finally:
        watched.close()
        if pull is not None:
            pull.close(linger=0)


def test_monitor_is_quiet_about_a_peer_that_answers(ctx: zmq.Context, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="zmqrl")
    pull = make_socket(ctx, zmq.PULL, SocketOptions.pull(), bind="tcp://127.0.0.1:*")
    address = pull.getsockopt(zmq.LAST_ENDPOINT).decode()
    watched = Watched(ctx, address)
    try:
        wait_for(lambda: watched.link.peers == 1, 10.0, "the link up")
        quiet_until = watched.started + 3 * monitor_mod.GRACE_S  # past the first report's time
        wait_for(lambda: time.monotonic() >= quiet_until, 10.0, "the grace period to pass")
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
        assert f"actor-0: link to proxy {address} up" in caplog.text
        assert watched.link.connect_failures == 0
        watched.sock.send(b"through")
        assert pull.poll(5000) and pull.recv(zmq.NOBLOCK) == b"through"
    finally:
        watched.close()
        pull.close(linger=0)


def test_a_link_is_one_connection_and_its_loss_is_reported(ctx: zmq.Context,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """The link is made up before its LinkMonitor exists (a role's startup can take that long), then its
    peer goes: one connection was made, and its loss is logged. Connecting again once a monitor listens
    (as LinkMonitor once did) left libzmq's first connection up beside the new one, the loss of one of
    them unlogged and every message of a PUB sent twice."""
    caplog.set_level(logging.INFO, logger="zmqrl")
    pull = make_socket(ctx, zmq.PULL, SocketOptions.pull(), bind="tcp://127.0.0.1:*")
    address = pull.getsockopt(zmq.LAST_ENDPOINT).decode()
    peer = pull.get_monitor_socket(zmq.EVENT_ACCEPTED)  # the connections made to it
    note_origin(address, "--proxy")
    push = make_socket(ctx, zmq.PUSH, SocketOptions.push(), connect=address, watch=True)
    accepted = 0

    def peer_events() -> None:
        nonlocal accepted
        while peer.poll(0):
            accepted += recv_monitor_message(peer)["event"] == zmq.EVENT_ACCEPTED

    wait_for(lambda: _sent(push, b"first"), 10.0, "the connection up (a send goes through)")
    link = LinkMonitor(push, "actor-0", f"to proxy {address}")
    try:
        assert pull.poll(5000) and pull.recv(zmq.NOBLOCK) == b"first"
        wait_for(lambda: link.up == 1 and "actor-0: link to proxy" in caplog.text, 10.0, "the handshake seen "
                 "and logged (the link thread counts it, then logs it)")
        assert link.peers == 1 and not link.down
        wait_for(lambda: peer_events() or accepted, 10.0, "the connection accepted")
        pull.close(linger=0)
        wait_for(lambda: link.down and warnings(caplog, f"actor-0: link to proxy {address} lost"), 10.0,
                 "the loss seen and logged", diag=lambda: caplog.text)
        peer_events()
        assert (accepted, link.up, link.drops, link.peers) == (1, 1, 1, 0)
        assert len(warnings(caplog, f"actor-0: link to proxy {address} lost")) == 1
    finally:
        link.close()
        peer.close(linger=0)
        push.close(linger=0)


def test_a_link_needs_a_socket_watched_from_its_start(ctx: zmq.Context) -> None:
    """Events before a monitor starts are lost for good, so LinkMonitor refuses a socket that connected
    without one (a control: the same socket made with watch=True is accepted)."""
    address = f"tcp://127.0.0.1:{free_port()}"
    late = make_socket(ctx, zmq.PUSH, SocketOptions.push(), connect=address)
    with pytest.raises(ValueError, match=r"actor-0: the socket for the link to proxy .* watch=True"):
        LinkMonitor(late, "actor-0", f"to proxy {address}")
    late.close(linger=0)
    watched = make_socket(ctx, zmq.PUSH, SocketOptions.push(), connect=address, watch=True)
    LinkMonitor(watched, "actor-0", f"to proxy {address}").close()
    watched.close(linger=0)


def _sent(sock: zmq.Socket, data: bytes) -> bool:
    try:
        sock.send(data, zmq.NOBLOCK)
        return True
    except zmq.Again:
        return False


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_bracketed_ipv6_address_carries_messages(ctx: zmq.Context) -> None:
    pull = make_socket(ctx, zmq.PULL, SocketOptions.pull(), bind=endpoint("[::1]:0", "", 0, "--bind", bind=True))
    port = int(pull.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1])
    push = make_socket(ctx, zmq.PUSH, SocketOptions.push(sndtimeo_ms=5000),
                       connect=endpoint(f"[::1]:{port}", "", 0, "--proxy"))
    try:
        push.send_multipart([b"over", b"ipv6"])
        assert pull.poll(5000), "nothing arrived over [::1]"
        assert pull.recv_multipart(zmq.NOBLOCK) == [b"over", b"ipv6"]
    finally:
        push.close(linger=0)
        pull.close(linger=0)


# --- roles as processes: the line within a second of the connect, then SIGTERM exits 0 -----------------

def _log_after(proc: Proc, marker: str, text: str, timeout: float) -> float:
    """Seconds from ``marker`` first appearing in the log (the role is up, connecting) to ``text`` appearing."""
    wait_for(lambda: marker in proc.text(), 120.0, f"{proc.name} to start ({marker!r})", diag=proc.tail)
    marked = time.monotonic()
    wait_for(lambda: text in proc.text(), timeout, f"{proc.name} to log {text!r}", diag=proc.tail, interval=0.05)
    return time.monotonic() - marked


ROLE_START = {"actor": "waiting for the first model", "proxy": "actors connect to",
              "evaluator": "waiting for models from"}


def _start_role(procs: Procs, role: str, peer: str) -> tuple[Proc, str]:
    """``role`` pointed at ``peer``: an actor for its proxy (and the learner on another port of the same host),
    the others for the learner; returns the process and the flag that names ``peer``."""
    if role == "actor":
        learner = f"{peer.rpartition(':')[0]}:{free_port()}"
        return procs.role(role, role, "--id", "0", "--proxy", peer, "--learner", learner), "--proxy"
    if role == "proxy":
        return procs.role(role, role, "--bind", "tcp://127.0.0.1:0", "--learner", peer), "--learner"
    return procs.role(role, role, "--learner", peer), "--learner"


@pytest.mark.slow
@pytest.mark.parametrize("role", ["actor", "proxy", "evaluator"])
def test_role_logs_an_unresolvable_host_at_once(procs: Procs, role: str) -> None:
    peer = f"tcp://{NOHOST}:{free_port()}"
    proc, flag = _start_role(procs, role, peer)
    took = _log_after(proc, ROLE_START[role], f"{peer} ({flag}); still trying every 0.5s", FIRST_LINE_S)
    line = next(ln for ln in proc.text().splitlines() if f"{peer} ({flag})" in ln)
    assert f" WARNING {proc.name}-0: " in line or f" WARNING {proc.name}: " in line, line
    assert f"cannot resolve host '{NOHOST}'" in line, line
    assert took < FIRST_LINE_S
    assert proc.stop(timeout=15.0) == 0, proc.tail()


@pytest.mark.slow
@pytest.mark.parametrize("role", ["actor", "proxy", "evaluator"])
def test_role_logs_a_closed_port_at_once(procs: Procs, role: str) -> None:
    peer = f"tcp://127.0.0.1:{free_port()}"
    proc, flag = _start_role(procs, role, peer)
    took = _log_after(proc, ROLE_START[role], f"nothing answers at {peer} (connection refused", FIRST_LINE_S)
    line = next(ln for ln in proc.text().splitlines() if f"nothing answers at {peer}" in ln)
    assert line.endswith(f"({flag}); still trying every 0.5s"), line
    assert took < FIRST_LINE_S
    assert proc.stop(timeout=15.0) == 0, proc.tail()


@pytest.mark.slow
def test_actor_logs_a_port_that_accepts_nothing(procs: Procs) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = fill_accept_queue(port)
        try:
            proc = procs.role("actor", "actor", "--id", "0", "--proxy", f"127.0.0.1:{port}",
                              "--learner", f"tcp://127.0.0.1:{free_port()}")
            took = _log_after(proc, ROLE_START["actor"], f"nothing answers at tcp://127.0.0.1:{port} (no reply",
                              FIRST_LINE_S)
            assert took < FIRST_LINE_S
            assert proc.stop(timeout=15.0) == 0, proc.tail()
        finally:
            for filler in fillers:
                filler.close()
