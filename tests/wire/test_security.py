"""CurveZMQ security: keygen, encrypted links, the client-key allow-list, misconfiguration errors.

Real sockets on 127.0.0.1 random ports, linger 0, a timeout on every receive. The last test runs
learner, proxy and two actors as processes with ``net.security=curve``.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from batches import batch_frames, cartpole_batch, recv_message
from zmqrl import config
from zmqrl.cli.app import build_parser
from zmqrl.config import ConfigError, NetConfig
from zmqrl.roles.addresses import free_port
from zmqrl.roles.net import auth_counts, new_context, options, security_from_net
from zmqrl.run.rundir import read_json
from zmqrl.wire import (
    BATCH,
    MODEL,
    SecureContext,
    Security,
    SecurityError,
    SocketOptions,
    SocketSetupError,
    bound_address,
    check_batch,
    decode,
    encode_model,
    keygen,
    make_socket,
    send_frames,
)

pytestmark = pytest.mark.skipif(not zmq.has("curve"), reason="this libzmq has no CURVE support (built without "
                                                                 "libsodium); CurveZMQ security cannot be tested")

LOCAL = "tcp://127.0.0.1:*"
REFUSE_WAIT_MS = 1500  # a refused peer's message must not arrive within this
ARRIVE_MS = 5000  # an admitted peer's message must arrive within this
REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "cartpole_dqn.yaml"


# --------------------------------------------------------------------------- fixtures and helpers


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    """A key directory: the server pair, ``listed`` (in clients/) and ``unlisted`` (not)."""
    d = tmp_path / "keys"
    keygen(d, "server")
    keygen(d, "listed", allow=True)
    keygen(d, "unlisted")
    return d


@pytest.fixture
def contexts() -> Iterator[Callable[..., zmq.Context]]:
    """``make(security=None)``: contexts that are destroyed (linger 0) after the test."""
    made: list[zmq.Context] = []

    def make(security: Security | None = None) -> zmq.Context:
        ctx: zmq.Context = SecureContext.create(security) if security is not None else zmq.Context()
        made.append(ctx)
        return ctx

    yield make
    for ctx in made:
        ctx.destroy(linger=0)


def server_pull(ctx: zmq.Context, security: Security) -> tuple[zmq.Socket, str]:
    sock = make_socket(ctx, zmq.PULL, SocketOptions.pull(security=security), bind=LOCAL)
    return sock, bound_address(sock)


def client_push(ctx: zmq.Context, security: Security | None, addr: str) -> zmq.Socket:
    return make_socket(ctx, zmq.PUSH, SocketOptions(security=security), connect=addr)


def net(keys: Path, **kw: Any) -> NetConfig:
    return NetConfig(security="curve", keys_dir=str(keys), **kw)


# --------------------------------------------------------------------------- keygen


def test_keygen_command_writes_private_pair_and_refuses_overwrite(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    parser, handlers = build_parser()

    def run(*argv: str) -> int:
        args = parser.parse_args(list(argv))
        return handlers[args.command](args)

    d = tmp_path / "keys"
    assert run("keygen", str(d), "--name", "server") == 0
    public, secret = d / "server.key", d / "server.key_secret"
    assert public.is_file() and secret.is_file()
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    pub, sec = zmq.auth.load_certificate(secret)
    assert sec is not None and zmq.curve_public(sec) == pub == zmq.auth.load_certificate(public)[0]
    assert not [p for p in d.iterdir() if p.name.startswith(".")], "temporary files left behind"

    before = secret.read_bytes()
    assert run("keygen", str(d), "--name", "server") == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert secret.read_bytes() == before, "an existing secret key was replaced without --force"

    assert run("keygen", str(d), "--name", "server", "--force") == 0
    assert secret.read_bytes() != before
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600

    assert run("keygen", str(d), "--name", "host1", "--client") == 0
    assert (d / "clients" / "host1.key").read_bytes() == (d / "host1.key").read_bytes()
    assert run("keygen", str(d), "--name", "../evil") == 2
    assert not (tmp_path / "evil.key").exists()


# --------------------------------------------------------------------------- PUSH/PULL admission


def test_listed_client_reaches_server(keys: Path, contexts: Callable[..., zmq.Context]) -> None:
    server = Security.curve(str(keys), "server")
    listed = Security.curve(str(keys), "server", "listed")
    pull, addr = server_pull(contexts(server), server)
    push = client_push(contexts(), listed, addr)
    sent = cartpole_batch(3, 0)
    send_frames(push, batch_frames("listed", 0, sent))
    msg = recv_message(pull, timeout_ms=ARRIVE_MS)
    assert msg is not None, "nothing arrived from an allow-listed CURVE client"
    assert msg.kind == BATCH and msg.sender == "listed" and check_batch(msg) == 3
    np.testing.assert_array_equal(msg.arrays["action"], sent["action"])
    assert pull.get(zmq.CURVE_SERVER) == 1 and push.get(zmq.CURVE_SERVER) == 0


@pytest.mark.parametrize("who", ["unlisted", "plaintext"])
def test_refused_client_gets_nothing_through_and_server_keeps_serving(
        who: str, keys: Path, contexts: Callable[..., zmq.Context], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="zmqrl.security")
    server = Security.curve(str(keys), "server")
    ctx = contexts(server)
    pull, addr = server_pull(ctx, server)
    bad_security = Security.curve(str(keys), "server", "unlisted") if who == "unlisted" else None
    bad = client_push(contexts(), bad_security, addr)
    send_frames(bad, batch_frames(who, 0, cartpole_batch(3, 0)))  # queued: no IMMEDIATE in SocketOptions()
    assert recv_message(pull, timeout_ms=REFUSE_WAIT_MS) is None, f"a message from the {who} client arrived"

    good = client_push(contexts(), Security.curve(str(keys), "server", "listed"), addr)
    send_frames(good, batch_frames("listed", 0, cartpole_batch(3, 0)))
    msg = recv_message(pull, timeout_ms=ARRIVE_MS)
    assert msg is not None and msg.sender == "listed", f"the server stopped serving after refusing {who}: {msg}"
    assert recv_message(pull, timeout_ms=200) is None
    counts = auth_counts(ctx)
    assert counts["curve_allowed"] >= 1
    if who == "unlisted":  # a plaintext client fails the handshake before the ZAP check
        assert counts["curve_refused"] >= 1
        assert any("refused CURVE client 127.0.0.1" in r.getMessage() for r in caplog.records), caplog.text


# --------------------------------------------------------------------------- PUB/SUB


def test_pub_sub_with_curve_admits_only_listed_subscribers(keys: Path,
                                                           contexts: Callable[..., zmq.Context]) -> None:
    server = Security.curve(str(keys), "server")
    pub = make_socket(contexts(server), zmq.XPUB, SocketOptions.pub(security=server), bind=LOCAL)
    addr = bound_address(pub)
    listed = make_socket(contexts(), zmq.SUB, SocketOptions.sub(security=Security.curve(str(keys), "server", "listed")),
                         connect=addr)
    unlisted = make_socket(contexts(), zmq.SUB,
                           SocketOptions.sub(security=Security.curve(str(keys), "server", "unlisted")), connect=addr)
    # The XPUB sees the listed subscriber's subscription, and no other.
    assert pub.poll(ARRIVE_MS), "no subscription from the allow-listed subscriber"
    assert pub.recv() == b"\x01"
    model = encode_model("learner", "inc0", 7, {"w": np.ones((4, 4), dtype=np.float32)})
    got = None
    deadline = time.monotonic() + REFUSE_WAIT_MS / 1000
    while time.monotonic() < deadline or got is None:
        send_frames(pub, model)
        if got is None and listed.poll(50):
            got = decode(listed.recv_multipart(copy=False))
        assert unlisted.poll(50) == 0, "a subscriber outside the allow-list received a model"
        assert time.monotonic() < deadline + ARRIVE_MS / 1000, "the allow-listed subscriber got no model"
    assert got.kind == MODEL and got.version == 7
    np.testing.assert_array_equal(got.arrays["w"], np.ones((4, 4), dtype=np.float32))
    assert pub.poll(0) == 0, "a second subscription reached the publisher"


# --------------------------------------------------------------------------- configuration and errors


def test_config_security_choices() -> None:
    assert config.load(None).net.security == "none"
    assert config.load(None, ["net.security=curve", "net.keys_dir=/k"]).net.security == "curve"
    with pytest.raises(ConfigError, match=r"net\.security must be one of none, curve, got 'tls'"):
        config.load(None, ["net.security=tls"])


def test_security_none_changes_nothing() -> None:
    n = NetConfig()
    assert security_from_net(n) is None and options(n, SocketOptions()).security is None
    ctx = new_context(n)
    assert not isinstance(ctx, SecureContext) and auth_counts(ctx) == {}
    ctx.term()


def test_misconfiguration_names_the_file_and_setting(tmp_path: Path, keys: Path) -> None:
    with pytest.raises(ConfigError, match=r"net\.keys_dir is empty"):
        new_context(NetConfig(security="curve"))
    with pytest.raises(ConfigError, match=r"net\.keys_dir: key directory .*nowhere.* not found"):
        new_context(net(tmp_path / "nowhere"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"server public key file '.*empty/server\.key' not found.*net\.server_key"):
        new_context(net(empty))
    with pytest.raises(ConfigError, match=r"client secret key file '.*/ghost\.key_secret' not found.*net\.client_key"):
        new_context(net(keys, client_key="ghost"))
    with pytest.raises(ConfigError, match=r"net\.allowed_clients_dir: directory '.*/missing' not found"):
        new_context(net(keys, allowed_clients_dir=str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match=r"net\.server_key: '\.\./x' is not a key name"):
        new_context(net(keys, server_key="../x"))
    (keys / "bad.key_secret").write_text("curve\n    public-key = \"short\"\n")
    with pytest.raises(ConfigError, match=r"'.*bad\.key_secret' holds a malformed key"):
        new_context(net(keys, client_key="bad"))

    # A client-only host (own client pair, no server secret) connects fine but cannot bind.
    client_only = tmp_path / "client_only"
    client_only.mkdir()
    for name in ("server.key", "listed.key", "listed.key_secret"):
        (client_only / name).write_bytes((keys / name).read_bytes())
    n = net(client_only, client_key="listed")
    ctx = new_context(n)
    try:
        assert isinstance(ctx, SecureContext)
        make_socket(ctx, zmq.PUSH, options(n, SocketOptions.push()), connect="tcp://127.0.0.1:1").close(linger=0)
        with pytest.raises(SocketSetupError, match=r"server secret key file '.*client_only/server\.key_secret' is "
                                                   r"missing.*net\.keys_dir, net\.server_key"):
            make_socket(ctx, zmq.PULL, options(n, SocketOptions.pull()), bind=LOCAL)
    finally:
        ctx.destroy(linger=0)
    # Without a client pair of its own, a host needs the server secret.
    (client_only / "listed.key_secret").unlink()
    with pytest.raises(ConfigError, match=r"server secret key file '.*server\.key_secret' not found.*net\.client_key"):
        new_context(net(client_only))


def test_server_socket_needs_an_authenticating_context(keys: Path) -> None:
    security = Security.curve(str(keys), "server")
    ctx = zmq.Context()
    try:
        with pytest.raises(SocketSetupError, match="no ZAP authenticator"):
            make_socket(ctx, zmq.PULL, SocketOptions.pull(security=security), bind=LOCAL)
        with pytest.raises(SocketSetupError, match="exactly one"):
            make_socket(ctx, zmq.PUSH, SocketOptions(security=security))
    finally:
        ctx.destroy(linger=0)
    with pytest.raises(SecurityError, match="not found"):
        Security.curve(str(keys), "server", "nobody")
    assert security.server_secret is not None
    assert security.secret.decode() not in repr(security) and security.server_secret.decode() not in repr(security)


def test_secure_context_closes_quickly(keys: Path) -> None:
    n = net(keys)
    ctx = new_context(n)
    assert isinstance(ctx, SecureContext)
    sock = make_socket(ctx, zmq.PULL, options(n, SocketOptions.pull()), bind=LOCAL)
    assert security_from_net(n) is security_from_net(n), "keys must be loaded once per process"
    sock.close(linger=0)
    t0 = time.monotonic()
    ctx.term()
    assert time.monotonic() - t0 < 1.0 and ctx.closed


# --------------------------------------------------------------------------- real role processes


def _start(argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as f:
        return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> tuple[int, float]:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL; ``(returncode, seconds to exit)``."""
    t0 = time.monotonic()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    return proc.returncode, time.monotonic() - t0


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_roles_with_curve_admit_only_listed_actor(tmp_path: Path, keys: Path) -> None:
    ports = {k: free_port() for k in ("data", "model", "eval", "proxy")}
    tcp = {k: f"tcp://127.0.0.1:{p}" for k, p in ports.items()}
    run_dir = tmp_path / "run"
    sets = ["run.seed=1", "net.security=curve", f"net.keys_dir={keys}", "trainer.stop_return=null",
            "trainer.eval_interval=1000000"]

    def argv(role: str, *args: str, extra: tuple[str, ...] = ()) -> list[str]:
        return [sys.executable, "-m", "zmqrl.cli", role, str(CONFIG), *args,
                *[a for s in (*sets, *extra) for a in ("--set", s)]]

    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = {name: tmp_path / f"{name}.log" for name in ("learner", "proxy", "actor-0", "actor-1")}

    def diag() -> str:
        return "\n".join(f"--- {n} (rc {p.poll()})\n" + "\n".join(logs[n].read_text(errors="replace")
                                                                   .splitlines()[-15:]) for n, p in procs.items())

    try:
        procs["learner"] = _start(argv("learner", "--run-dir", str(run_dir), "--bind-data", tcp["data"],
                                       "--bind-model", tcp["model"], "--bind-eval", tcp["eval"]), logs["learner"])
        procs["proxy"] = _start(argv("proxy", "--bind", tcp["proxy"], "--learner", tcp["data"]), logs["proxy"])
        for i, key in ((0, "listed"), (1, "unlisted")):
            procs[f"actor-{i}"] = _start(argv("actor", "--id", str(i), "--proxy", tcp["proxy"], "--learner",
                                              tcp["model"], extra=(f"net.client_key={key}",)), logs[f"actor-{i}"])

        def listed_batches() -> int:
            summary = read_json(run_dir / "summary.json") or {}
            return int(summary.get("actors", {}).get("actor-0", {}).get("batches", 0))

        deadline = time.monotonic() + 60
        while listed_batches() == 0:
            assert all(p.poll() is None for p in procs.values()), f"a role exited early\n{diag()}"
            assert time.monotonic() < deadline, f"no batches from the listed actor at the learner\n{diag()}"
            time.sleep(0.25)
        rc, took = _stop(procs["learner"])
        assert rc == 0 and took < 8.0, f"learner exit rc {rc} after {took:.1f}s\n{diag()}"
        summary = read_json(run_dir / "summary.json")
        assert summary is not None
        assert summary["actors"]["actor-0"]["batches"] > 0
        assert "actor-1" not in summary["actors"], f"the unlisted actor's batches arrived: {summary['actors']}"
        for name in ("proxy", "actor-0", "actor-1"):
            rc, took = _stop(procs[name])
            assert rc == 0 and took < 8.0, f"{name} exit rc {rc} after {took:.1f}s\n{diag()}"
        assert "got model version" not in logs["actor-1"].read_text(), "the unlisted actor received a model"
        assert "refused CURVE client" in logs["learner"].read_text() + logs["proxy"].read_text(), diag()
    finally:
        for proc in procs.values():
            _stop(proc, grace_s=5.0)
