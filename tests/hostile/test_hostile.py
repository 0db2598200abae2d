"""The hostile soak (test equipment, :mod:`hostile`): the hostile client's messages are what they claim, it
reaches every target, and a real job under attack keeps every role alive and its honest actors' data flowing.

- The message builders: the zero-shape array really declares [0, 2**62]; NaN, 1e400 and 10**400
  really are in the header bytes; bad values fit the batch spec; the forged report claims 500.
- The client, against bare PULL sockets: every kind sends, each to its targets (the real actor's
  name and incarnation with seq 2**63-1, a 250-character HELLO to the proxy, one many-frame message).
- The soak's arithmetic: throughput per phase on the learner's clock, what was kept, which attack
  was under way when a role exited, the exception a log names.
- (slow) A one-minute hostile soak of CartPole with one actor exits 0 with every role alive, every
  kind sent and the honest actors' intake measured in both phases.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from batches import CARTPOLE_N
from hostile import client, soak
from hostile import messages as msgs
from zmqrl.run.rundir import read_json
from zmqrl.wire import BATCH, EVAL, HELLO, PACK_MAGIC, STATS, decode

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "cartpole_dqn.yaml"
CARTPOLE_SPEC = {"obs": ("<f4", [4]), "action": ("<i8", []), "reward": ("<f4", []), "next_obs": ("<f4", [4]),
                 "discount": ("<f4", []), "priority": ("<f4", [])}

pytestmark = pytest.mark.timeout(120)


def header_of(frames: list[bytes]) -> dict[str, Any]:
    """The parsed JSON header of a message, packed into one frame or not (nothing else checked); empty
    for what is not one (libzmq takes a junk TCP peer for a ZMTP 1.0 one and may deliver its bytes)."""
    first = bytes(frames[0])
    if first.startswith(PACK_MAGIC):
        n = int.from_bytes(first[4:8], "little")
        first = first[8:8 + n]
    try:
        header = json.loads(first)
    except ValueError:
        return {}
    return header if isinstance(header, dict) else {}


# --- the message builders ---------------------------------------------------------------------------

def test_dumps_writes_literals_as_given_and_python_numbers_as_json_does() -> None:
    text = msgs.dumps({"a": msgs.Literal("1e400"), "b": [msgs.Literal("-1e400"), float("nan")],
                          "c": 10**30, "d": "x"})
    assert text == '{"a":1e400,"b":[-1e400,NaN],"c":1000000000000000000000000000000,"d":"x"}'


def test_the_zero_shape_array_declares_0_by_2_to_the_62_in_zero_bytes() -> None:
    frames = msgs.message(BATCH, "s", "i", 0, 0, msgs.zero_shape_arrays(np.random.default_rng(0)),
                             msgs.batch_meta(0))
    header = header_of(frames)
    assert header["arrays"][-1] == ["pad", "<f4", [0, 2**62]]
    assert frames[-1] == b""
    assert b"[0,4611686018427387904]" in frames[0]
    names = [a[0] for a in header["arrays"]]
    assert names[:-1] == list(CARTPOLE_SPEC) and len(frames) == 1 + len(names)  # the rest is a real batch


def test_meta_numbers_put_nan_infinity_and_huge_ints_into_the_header_bytes() -> None:
    variants = msgs.number_metas()
    kinds = {kind for kind, _ in variants}
    assert kinds == {BATCH, STATS, EVAL}
    found = set()
    for kind, meta in variants:
        raw = msgs.message(kind, "s", "i", 0, 0, [], meta)[0]
        bad = [token for token in (b"NaN", b"1e400", b"1" + b"0" * 400) if token in raw]
        assert bad, (kind, raw[:200])  # each message carries at least one number no role should take
        found.update(bad)
        assert json.loads(raw)["meta"] == json.loads(msgs.dumps(meta))  # what the receiver parses
    assert found == {b"NaN", b"1e400", b"1" + b"0" * 400}
    first = json.loads(msgs.message(BATCH, "s", "i", 0, 0, [], variants[0][1])[0])
    assert math.isnan(first["meta"]["stats"]["env_steps"])
    second = json.loads(msgs.message(BATCH, "s", "i", 0, 0, [], variants[1][1])[0])
    assert second["meta"]["stats"]["env_steps"] == float("inf")  # 1e400 parses as infinity
    stats = json.loads(msgs.message(STATS, "s", "i", 0, 0, [], next(m for k, m in variants if k == STATS))[0])
    assert stats["meta"]["forwarded"] == 10**400


def test_bad_values_fit_the_batch_spec_and_carry_exactly_their_fault() -> None:
    batches = dict(msgs.bad_value_batches(np.random.default_rng(0)))
    assert set(batches) == {"action 7", "NaN reward", "NaN obs", "NaN priority", "inf priority"}
    for what, batch in batches.items():
        assert {k: (a.dtype.str, list(a.shape[1:])) for k, a in batch.items()} == CARTPOLE_SPEC, what
        assert all(len(a) == CARTPOLE_N for a in batch.values())
    assert batches["action 7"]["action"].max() == 7 and set(np.unique(batches["NaN reward"]["action"])) <= {0, 1}
    assert np.isnan(batches["NaN reward"]["reward"]).sum() == 1
    assert np.isnan(batches["NaN obs"]["obs"]).any() and np.isfinite(batches["NaN obs"]["next_obs"]).all()
    assert np.isnan(batches["NaN priority"]["priority"]).sum() == 1
    assert np.isinf(batches["inf priority"]["priority"]).sum() == 1
    for what in ("NaN obs", "NaN priority"):
        assert np.isfinite(batches[what]["reward"]).all()


def test_a_forged_evaluation_is_well_formed_and_claims_cartpoles_best_return() -> None:
    msg = decode(msgs.forged_eval_frames("inc", 7, 42))
    assert (msg.kind, msg.sender, msg.version, msg.seq) == (EVAL, "evaluator", 42, 7)
    assert msg.meta["returns"] == [500.0] * 10 and msg.meta["version"] == 42


def test_long_names_are_distinct_printable_and_250_characters() -> None:
    names = [msgs.long_name(i) for i in (0, 1, 10**9)]
    assert len(set(names)) == 3 and all(len(n) == 250 and n.isprintable() for n in names)
    msg = decode(client.encode_hello(names[0], "inc", 0, {"role": "actor"}))
    assert (msg.kind, msg.sender) == (HELLO, names[0])


def test_the_many_frames_message_has_that_many_two_byte_frames() -> None:
    frames = msgs.many_frames_message(5000, "inc", 3)
    assert len(frames) == 5000 and set(frames[1:]) == {b"ab"}
    assert header_of(frames)["seq"] == 3


def test_kinds_are_parsed_by_name() -> None:
    assert client.parse_kinds("all") == list(client.KINDS) and len(client.KINDS) == 11
    assert client.parse_kinds(" flood, zero_shape ") == ["flood", "zero_shape"]
    with pytest.raises(ValueError, match="nope"):
        client.parse_kinds("flood,nope")


# --- the client against bare sockets ------------------------------------------------------------------

@pytest.mark.slow
def test_the_client_sends_every_kind_to_its_targets(tmp_path: Path) -> None:
    ctx = zmq.Context()
    pulls: dict[str, zmq.Socket] = {}
    addresses: dict[str, str] = {}
    try:
        for name in ("data", "eval", "proxy"):
            sock = ctx.socket(zmq.PULL)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, 100_000)
            addresses[name] = f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"
            pulls[name] = sock
        run = tmp_path / "run"
        run.mkdir()
        (run / "endpoints.json").write_text(json.dumps({
            "learner": {"data": addresses["data"], "eval": addresses["eval"], "model": "tcp://127.0.0.1:9"},
            "proxy": {"bind": addresses["proxy"]}}))
        (run / "summary.json").write_text(json.dumps({"actors": {"actor-0": {"incarnation": "0123abcd"}},
                                                      "model_version": 5}))
        proc = subprocess.Popen([sys.executable, str(soak.PACKAGE), "client", str(CONFIG), "--run-dir", str(run),
                                 "--seconds", "4", "--slot-s", "0.3", "--many-frames", "1000"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        got: dict[str, list[list[bytes]]] = {name: [] for name in pulls}
        poller = zmq.Poller()
        for sock in pulls.values():
            poller.register(sock, zmq.POLLIN)
        deadline = time.monotonic() + 60
        quiet_since = None
        while time.monotonic() < deadline:  # read until the client has exited and nothing more comes
            ready = dict(poller.poll(100))
            for name, sock in pulls.items():
                while sock in ready and sock.poll(0):
                    got[name].append(sock.recv_multipart())
            if proc.poll() is None or ready:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > 0.5:
                break
        out = proc.communicate(timeout=30)[0]
        assert proc.returncode == 0, out
    finally:
        ctx.destroy(linger=0)
    report = read_json(run / "hostile.json")
    assert report is not None and report["finished"], out
    assert report["order"] == list(client.KINDS)
    for kind in client.KINDS:
        assert report["kinds"][kind]["sent"] > 0, (kind, report["kinds"][kind], out)
        assert report["kinds"][kind]["errors"] == 0, (kind, report["kinds"][kind])
    data = [h for h in map(header_of, got["data"]) if h]
    assert any(h["sender"] == "actor-0" and h["inc"] == "0123abcd" and h["seq"] == 2**63 - 1 for h in data)
    assert any(h["sender"].startswith("hostile-twin") for h in data)
    assert any(len(m) == 1000 for m in got["data"])  # many_frames
    evals = [h for h in map(header_of, got["eval"]) if h]
    assert any(h["sender"] == "evaluator" and h["meta"].get("returns") == [500.0] * 10 for h in evals)
    assert any(h["sender"] == "hostile-eval_flood" for h in evals)
    proxied = [h for h in map(header_of, got["proxy"]) if h]
    assert any(h["kind"] == HELLO and len(h["sender"]) == 250 for h in proxied)
    assert any(h["sender"] == "hostile-flood" for h in proxied)
    assert all(len(m) == 1 and m[0].startswith(PACK_MAGIC) for m in got["proxy"]
               if header_of(m).get("kind") == BATCH)  # batches reach the proxy packed, as actors send them


# --- the soak's arithmetic -------------------------------------------------------------------------------

def sample(t: float, wall: float, transitions: int, opt_steps: int) -> dict[str, Any]:
    s = soak.learner_sample(t, {"wall_s": wall, "opt_steps": opt_steps, "actors": {
        "actor-0": {"transitions": transitions}, "hostile-flood": {"transitions": 10**6}}})
    assert s is not None
    return s


def test_rates_are_timed_by_the_learner_and_count_only_honest_actors() -> None:
    samples = [sample(10, 5.0, 0, 0), sample(12, 7.0, 1000, 200), sample(20, 15.0, 5000, 1000),
               sample(30, 25.0, 6000, 1500)]
    quiet = soak.rates(samples, 11, 20)
    assert quiet is not None and quiet["actors"] == {"actor-0": 500.0} and quiet["all"] == 500.0
    assert quiet["opt_steps_per_s"] == 100.0 and quiet["seconds"] == 8.0
    attacked = soak.rates(samples, 20, 40)
    assert attacked is not None and attacked["all"] == 100.0
    assert soak.kept(quiet["all"], attacked["all"]) == 0.2
    assert soak.kept(0.0, 5.0) is None and soak.kept(None, 1.0) is None
    assert soak.rates(samples, 25, 40) is None  # one sample is no rate


def test_an_exit_is_laid_to_the_attack_then_under_way_and_its_exception_found(tmp_path: Path) -> None:
    timeline = [[100.0, "meta_numbers"], [102.0, "zero_shape"], [104.0, "bad_values"]]
    assert soak.kind_at(timeline, 99.0) is None
    assert soak.kind_at(timeline, 103.5) == "zero_shape"
    assert soak.kind_at(timeline, 200.0) == "bad_values"
    log = tmp_path / "learner.log"
    log.write_text("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                   "ValueError: array is too big\nlocal: learner exited\n")
    assert soak.error_line(log) == "ValueError: array is too big"
    assert soak.error_line(tmp_path / "missing.log") is None


@pytest.mark.parametrize("args, named", [
    (["--minutes", "0.5"], "leaves 0s of attacks after a 30s quiet phase"),
    (["--minutes", "1", "--kinds", "flood,nope"], "unknown attack kind"),
    (["--minutes", "1", "--set", "env.id=Acrobot-v1"], "CartPole-v1"),
])
def test_the_hostile_flags_are_checked_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              args: list[str], named: str) -> None:
    assert soak.main([str(CONFIG), "--run-dir", str(tmp_path / "run"), *args]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


# --- a real job under attack -----------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(480)
def test_a_job_under_attack_keeps_every_role_and_its_honest_intake(tmp_path: Path) -> None:
    run_dir = tmp_path / "soak"
    # 12 s of quiet phase (six learner samples), then 24 s of attacks: 1 s slots, so every one of the 11 kinds
    # has its turn about twice (2 s slots left the last kind without one on a loaded machine)
    argv = [sys.executable, str(soak.PACKAGE), "soak", str(CONFIG), "--minutes", "0.6", "--actors", "1",
            "--interval-s", "2", "--quiet-s", "12", "--slot-s", "1", "--run-dir", str(run_dir), "--set", "run.seed=3"]
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=420)
    tail = proc.stdout[-6000:]
    report = read_json(run_dir / "soak.json")
    assert report is not None, f"no soak.json (exit code {proc.returncode})\n{tail}"
    h = report["hostile"]
    for kind in client.KINDS:
        assert (h["kinds"].get(kind) or {}).get("sent", 0) > 0, (kind, tail)
    quiet, attacked = h["throughput"]["quiet"], h["throughput"]["hostile"]
    assert quiet is not None and quiet["all"] > 0, tail
    assert attacked is not None and attacked["all"] > 0, tail
    roles = ["learner", "proxy", "actor-0", "evaluator"]
    assert all(h["roles"][name]["alive_at_end"] for name in roles), (h["roles"], tail)
    assert not h["stop_reason_before_stop"], tail
    assert proc.returncode == 0, tail
    assert report["ok"] and report["stop_exit_code"] == 0, report["events"]
