"""Tests for zmqrl.wire: codec round trips, validation, sockets and trackers."""

from __future__ import annotations

import json
import logging
import pickle
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from batches import recv_message
from zmqrl.wire import (
    ALLOWED_DTYPES,
    BATCH,
    EVAL,
    HELLO,
    MODEL,
    MODEL_TOPIC,
    PROTOCOL_VERSION,
    STATS,
    Limits,
    Message,
    PeerTable,
    RateLimitedLog,
    SequenceTracker,
    SocketOptions,
    SocketSetupError,
    VersionTracker,
    WireError,
    bound_address,
    check_batch,
    check_batch_spec,
    decode,
    drain_latest_model,
    encode,
    encode_model,
    encode_stats,
    eval_meta,
    make_socket,
    new_incarnation,
    peek_header,
    send_frames,
)

LOCAL = "tcp://127.0.0.1:*"
TIMEOUT_MS = 5000


# --------------------------------------------------------------------------- fixtures and helpers


@pytest.fixture

def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def _pair(ctx: zmq.Context, **push_overrides: Any) -> tuple[zmq.Socket, zmq.Socket]:
    """A connected PUSH -> PULL pair on a random local port (linger 0)."""
    pull = make_socket(ctx, zmq.PULL, SocketOptions.pull(), bind=LOCAL)
    push_opts = SocketOptions.push(linger_ms=0, sndtimeo_ms=TIMEOUT_MS, **push_overrides)
    push = make_socket(ctx, zmq.PUSH, push_opts, connect=bound_address(pull))
    return push, pull


def _wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """Poll ``condition`` until true or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


def _bytes_frames(frames: list[Any]) -> list[bytes]:
    return [bytes(f) for f in frames]


def _valid_frames(**arrays: np.ndarray) -> list[bytes]:
    arrays = arrays or {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    return _bytes_frames(encode(BATCH, sender="actor-0", incarnation="abc", seq=3, version=7, arrays=arrays))


def _with_header(frames: list[bytes], **changes: Any) -> list[bytes]:
    """Copy of ``frames`` whose header has ``changes`` applied (a value of ... deletes the key)."""
    header = json.loads(frames[0])
    for key, value in changes.items():
        if value is ...:
            header.pop(key, None)
        else:
            header[key] = value
    return [json.dumps(header).encode(), *frames[1:]]


def _reason(frames: Any, limits: Limits = Limits()) -> str:
    with pytest.raises(WireError) as info:
        decode(frames, limits)
    return info.value.reason


def _assert_same(msg: Message, arrays: dict[str, np.ndarray]) -> None:
    assert list(msg.arrays) == list(arrays)
    for name, expected in arrays.items():
        got = msg.arrays[name]
        assert got.dtype == np.asarray(expected).dtype
        assert got.shape == np.shape(expected)
        np.testing.assert_array_equal(got, expected)
        assert not got.flags.writeable
    assert msg.nbytes == sum(np.asarray(a).nbytes for a in arrays.values())


# --------------------------------------------------------------------------- round trips

SHAPES = [(), (0,), (3,), (2, 3), (0, 5), (4, 84, 84)]


@pytest.mark.parametrize("dtype", sorted(ALLOWED_DTYPES))
def test_round_trip_every_dtype_and_shape(dtype: str) -> None:
    rng = np.random.default_rng(0)
    arrays = {f"a{i}": (rng.random(shape) * 100).astype(dtype) for i, shape in enumerate(SHAPES)}
    frames = encode(MODEL, sender="learner", incarnation="inc", seq=5, version=5, arrays=arrays)
    for as_frames in (frames, _bytes_frames(frames), [zmq.Frame(bytes(f)) for f in frames]):
        msg = decode(as_frames)
        _assert_same(msg, arrays)
        assert (msg.kind, msg.sender, msg.incarnation, msg.seq, msg.version) == (MODEL, "learner", "inc", 5, 5)


def test_round_trip_batch_with_frames_and_episodes() -> None:
    batch: dict[str, np.ndarray] = {
        "obs": np.random.default_rng(1).integers(0, 255, (5, 4, 84, 84), dtype=np.uint8),
        "action": np.arange(5, dtype=np.int64),
        "reward": np.linspace(-1, 1, 5, dtype=np.float32),
        "done": np.array([0, 0, 1, 0, 1], dtype=bool),
        "extra": np.zeros((5, 0), dtype=np.float32),
    }
    episodes = {"returns": [1.5, -2.0], "lengths": [10, 20]}
    msg = decode(_bytes_frames(encode_batch("actor-1", "i1", 9, 4, batch, episodes)))
    _assert_same(msg, batch)
    assert msg.kind == BATCH and msg.seq == 9 and msg.version == 4
    assert msg.meta == {"episodes": episodes}
    assert check_batch(msg) == 5


def test_round_trip_empty_batch() -> None:
    batch: dict[str, np.ndarray] = {"obs": np.zeros((0, 4, 84, 84), np.uint8), "reward": np.zeros(0, np.float32)}
    msg = decode(encode_batch("a", "i", 0, -1, batch, None))
    _assert_same(msg, batch)
    assert msg.meta == {} and check_batch(msg) == 0


def test_round_trip_model_stats_eval_hello() -> None:
    params: dict[str, np.ndarray] = {
        "w": np.ones((3, 2), np.float32),
        "b": np.zeros(2, np.float16),
        "step": np.array(7, np.int64),
    }
    model = decode(encode_model("learner", "L1", 12, params))
    _assert_same(model, params)
    assert (model.kind, model.version, model.seq) == (MODEL, 12, 12)

    stats = decode(encode_stats("proxy", "P", 3, {"forwarded": np.int64(10), "rate": np.float32(0.5)}))
    assert (stats.kind, stats.arrays, stats.version) == (STATS, {}, -1)
    assert stats.meta == {"forwarded": 10, "rate": 0.5}

    ev = decode(encode(EVAL, sender="evaluator", incarnation="E", seq=0, version=12,
                       meta=eval_meta(12, [1.0, 2.5], [100, 200])))
    assert ev.kind == EVAL and ev.version == 12
    assert ev.meta == {"version": 12, "returns": [1.0, 2.5], "lengths": [100, 200]}

    hello = decode(encode(HELLO, sender="actor-3", incarnation="X", seq=0, meta={"role": "actor"}))
    assert hello.kind == HELLO and hello.meta == {"role": "actor"}


def test_non_contiguous_input_is_encoded_in_logical_order() -> None:
    arr = np.arange(12, dtype=np.int32).reshape(3, 4).T
    msg = decode(encode(MODEL, sender="s", incarnation="i", seq=0, version=0, arrays={"t": arr}))
    np.testing.assert_array_equal(msg.arrays["t"], arr)


def test_zero_copy_over_push_pull(ctx: zmq.Context) -> None:
    push, pull = _pair(ctx)
    big = np.random.default_rng(2).random((512, 512), dtype=np.float64)  # 2 MiB
    small = np.arange(10, dtype=np.int16)
    frames = encode(MODEL, sender="learner", incarnation="i", seq=0, version=0, arrays={"big": big, "small": small})
    sent = send_frames(push, frames)
    assert sent == sum(memoryview(f).nbytes for f in frames)
    msg = recv_message(pull, Limits(), TIMEOUT_MS)
    assert msg is not None
    _assert_same(msg, {"big": big, "small": small})
    assert not msg.arrays["big"].flags.owndata  # a view of the received frame, not a copy


def test_send_frames_copies_only_small_frames() -> None:
    calls: list[tuple[int, int, bool]] = []

    class Recorder:
        def send(self, frame: Any, flags: int = 0, copy: bool = True) -> None:
            calls.append((memoryview(frame).nbytes, flags, copy))

    frames = [b"h" * 10, memoryview(b"x" * 65535), memoryview(b"y" * 65536), b"z" * 2_000_000]
    total = send_frames(Recorder(), frames, flags=zmq.NOBLOCK)  # type: ignore[arg-type]
    assert total == 10 + 65535 + 65536 + 2_000_000
    more = zmq.NOBLOCK | zmq.SNDMORE
    assert calls == [(10, more, True), (65535, more, True), (65536, more, False), (2_000_000, zmq.NOBLOCK, False)]
    with pytest.raises(ValueError):
        send_frames(Recorder(), [])  # type: ignore[arg-type]


def test_peek_header_lets_a_relay_forward_original_frames(ctx: zmq.Context) -> None:
    push, relay_in = _pair(ctx)
    relay_out, sink = _pair(ctx)
    batch: dict[str, np.ndarray] = {"obs": np.ones((3, 4, 84, 84), np.uint8), "reward": np.ones(3, np.float32)}
    send_frames(push, encode_batch("actor", "i", 0, 2, batch, {"returns": [3.0]}))
    assert relay_in.poll(TIMEOUT_MS)
    frames = relay_in.recv_multipart(copy=False)
    header = peek_header(frames, Limits.only({BATCH}))
    assert header["kind"] == BATCH and header["sender"] == "actor"
    send_frames(relay_out, frames)
    msg = recv_message(sink, Limits(), TIMEOUT_MS)
    assert msg is not None
    _assert_same(msg, batch)


# --------------------------------------------------------------------------- validation rules


def test_frame_count_rules() -> None:
    frames = _valid_frames()
    assert _reason([]) == "frames"
    assert _reason(frames[:1]) == "frames"  # header names one array, no buffer
    assert _reason([*frames, b""]) == "frames"  # one frame too many
    assert _reason(frames, Limits(max_frames=1)) == "frames"
    assert _reason(None) == "frames"
    assert _reason(b"not a list of frames") == "frames"
    assert _reason(iter(frames)) == "frames"
    assert _reason([frames[0], 12345]) == "frames"
    assert _reason([frames[0], "text"]) == "frames"
    many = {f"a{i}": np.zeros(0, np.uint8) for i in range(4)}
    assert _reason(_valid_frames(**many), Limits(max_frames=4)) == "frames"
    decode(_valid_frames(**many), Limits(max_frames=5))


def test_header_encoding_rules() -> None:
    frames = _valid_frames()
    assert _reason([b"\xff\xfe{}", frames[1]]) == "header"  # not UTF-8
    assert _reason([b"{not json", frames[1]]) == "header"
    assert _reason([b"[1, 2]", frames[1]]) == "header"
    assert _reason([b"[" * 50_000, frames[1]]) == "header"  # nesting bomb
    assert _reason([b'{"seq": ' + b"9" * 10_000 + b"}", frames[1]]) == "header"  # huge integer literal
    assert _reason([frames[0] + b" " * 70_000, frames[1]]) == "size"  # over max_header_bytes
    assert _reason(frames, Limits(max_header_bytes=64)) == "size"


def test_protocol_and_version_rules() -> None:
    frames = _valid_frames()
    assert _reason(_with_header(frames, p="other")) == "protocol"
    assert _reason(_with_header(frames, p=...)) == "protocol"
    assert _reason(_with_header(frames, v=PROTOCOL_VERSION + 1)) == "version"
    assert _reason(_with_header(frames, v=1)) == "version"  # the first version: models without topics
    assert _reason(_with_header(frames, v=0)) == "version"
    assert _reason(_with_header(frames, v=True)) == "version"
    assert _reason(_with_header(frames, v=str(PROTOCOL_VERSION))) == "version"
    assert _reason(_with_header(frames, v=...)) == "version"


@pytest.mark.parametrize(
    "changes",
    [
        {"seq": ...},
        {"meta": ...},
        {"extra": 1},
        {"sender": ""},
        {"sender": 5},
        {"sender": "a\nb"},
        {"sender": "x" * 257},
        {"inc": None},
        {"inc": "i" * 65},
        {"seq": -1},
        {"seq": True},
        {"seq": 1.0},
        {"seq": "1"},
        {"seq": 2**63},
        {"ver": -2},
        {"ver": False},
        {"ver": None},
        {"arrays": {"x": 1}},
        {"arrays": [["x", "<f4"]]},
        {"arrays": [[1, "<f4", [2, 3]]]},
        {"arrays": [["", "<f4", [2, 3]]]},
        {"arrays": [["x" * 129, "<f4", [2, 3]]]},
    ],
)
def test_header_field_rules(changes: dict[str, Any]) -> None:
    assert _reason(_with_header(_valid_frames(), **changes)) == "header"


def test_duplicate_array_names_rejected() -> None:
    frames = _valid_frames(a=np.zeros(2, np.uint8), b=np.zeros(2, np.uint8))
    assert _reason(_with_header(frames, arrays=[["a", "|u1", [2]], ["a", "|u1", [2]]])) == "header"


def test_kind_rules() -> None:
    frames = _valid_frames()
    assert _reason(_with_header(frames, kind="exec")) == "kind"
    assert _reason(_with_header(frames, kind=1)) == "kind"
    assert _reason(frames, Limits.only({MODEL})) == "kind"
    decode(frames, Limits.only({BATCH, MODEL}))
    with pytest.raises(ValueError):
        Limits(allowed_kinds=frozenset({"bogus"}))


@pytest.mark.parametrize(
    "dtype", ["|O", "O", "object", "<U4", "|S4", "|V8", ">f4", ">i8", "<u4", "<u8", "<c8", "float32", 4]
)
def test_dtype_rules(dtype: Any) -> None:
    frames = _valid_frames(x=np.zeros(8, np.uint8))
    assert _reason(_with_header(frames, arrays=[["x", dtype, [8]]])) == "dtype"


def test_encode_rejects_disallowed_dtypes() -> None:
    for bad in (np.array([object()]), np.array(["text"]), np.zeros(2, ">f4"), np.zeros(2, np.uint32)):
        with pytest.raises(WireError) as info:
            encode(MODEL, sender="s", incarnation="i", seq=0, arrays={"x": bad})
        assert info.value.reason == "dtype"


@pytest.mark.parametrize("shape", [[-1], [2, -4], [True], [2.0], "8", None, [1] * 33])
def test_shape_rules(shape: Any) -> None:
    frames = _valid_frames(x=np.zeros(8, np.uint8))
    assert _reason(_with_header(frames, arrays=[["x", "|u1", shape]])) == "shape"


def test_a_layout_decoded_before_is_checked_as_strictly() -> None:
    """Array layouts are remembered once valid; a header that only equals one in Python's eyes
    (``true`` or ``1.0`` for 1, an entry with more fields, a shape as a string) or a caller with
    stricter limits is checked in full and refused, as on first sight."""
    from zmqrl.wire import codec

    frames = _valid_frames(x=np.zeros((1, 2), np.uint8))
    decode(frames)
    decode(frames)
    assert (("x", "|u1", 1, 2),) in codec._SPECS_SEEN
    for bad in ([["x", "|u1", [True, 2]]], [["x", "|u1", [1.0, 2]]], [["x", "|u1", [1, 2], "more"]],
                [["x", "|u1", "\x01\x02"]], [{"x": 1, "|u1": 2, "1": 3}]):
        assert _reason(_with_header(frames, arrays=bad)) in ("shape", "header"), bad
    assert _reason(frames, Limits(max_message_bytes=1)) == "size"
    assert _reason(frames, Limits(max_frames=1)) == "frames"
    assert decode(frames, Limits(max_message_bytes=2)).arrays["x"].shape == (1, 2)


def test_size_rules() -> None:
    frames = _valid_frames(x=np.zeros(8, np.float32))
    assert _reason([frames[0], frames[1][:-1]]) == "size"
    assert _reason([frames[0], frames[1] + b"\0"]) == "size"
    assert _reason(_with_header(frames, arrays=[["x", "<f4", [2**40, 2**40]]])) == "size"
    assert _reason(frames, Limits(max_message_bytes=31)) == "size"
    decode(frames, Limits(max_message_bytes=32))


def test_meta_rules() -> None:
    frames = _valid_frames()
    assert _reason(_with_header(frames, meta=[1, 2])) == "meta"
    assert _reason(_with_header(frames, meta=None)) == "meta"
    deep: Any = 1
    for _ in range(40):
        deep = [deep]
    assert _reason(_with_header(frames, meta={"d": deep})) == "meta"
    with pytest.raises(WireError) as info:
        encode(STATS, sender="s", incarnation="i", seq=0, meta={"obj": object()})
    assert info.value.reason == "meta"


SPEC = {"obs": (np.dtype(np.float32), (4,)), "action": (np.dtype(np.int64), ())}


@pytest.mark.parametrize(("arrays", "reason"), [
    ({"obs": np.zeros((3, 4), np.float32), "action": np.zeros(3, np.int64)}, None),
    ({"obs": np.zeros((3, 4), np.float32), "action": np.zeros(3, np.int64), "priority": np.ones(3, np.float32)}, None),
    ({"obs": np.zeros((3, 4), np.float32)}, "schema"),  # a field missing
    ({"obs": np.zeros((3, 4), np.float32), "action": np.zeros(3, np.int64), "x": np.zeros(3)}, "schema"),  # extra
    ({"obs": np.zeros((3, 4), np.float64), "action": np.zeros(3, np.int64)}, "schema"),  # dtype
    ({"obs": np.zeros((3, 5), np.float32), "action": np.zeros(3, np.int64)}, "schema"),  # item shape
    ({"obs": np.zeros((3, 4), np.float32), "action": np.zeros(2, np.int64)}, "shape"),  # unequal lengths
    ({"obs": np.zeros((3, 4), np.float32), "action": np.array(1, np.int64)}, "shape"),  # no batch dimension
    ({"obs": np.zeros((3, 4), np.float32), "action": np.zeros(3, np.int64), "priority": np.ones(3)}, "schema"),
])
def test_check_batch_spec_accepts_exactly_the_runs_batches(arrays: dict[str, np.ndarray], reason: str | None) -> None:
    msg = decode([bytes(f) for f in encode(BATCH, sender="s", incarnation="i", seq=0, arrays=arrays)])
    if reason is None:
        assert check_batch_spec(msg, SPEC) == 3
        return
    with pytest.raises(WireError) as info:
        check_batch_spec(msg, SPEC)
    assert info.value.reason == reason


def test_check_batch_rules() -> None:
    unequal = decode(_valid_frames(a=np.zeros(3), b=np.zeros(4)))
    with pytest.raises(WireError) as info:
        check_batch(unequal)
    assert info.value.reason == "shape"
    scalar = decode(_valid_frames(a=np.zeros(3), b=np.array(1, np.float32)))
    with pytest.raises(WireError) as info:
        check_batch(scalar)
    assert info.value.reason == "shape"
    with pytest.raises(WireError) as info:
        check_batch(decode(encode_stats("s", "i", 0, {})))
    assert info.value.reason == "kind"
    with pytest.raises(WireError) as info:
        check_batch(decode(encode_batch("a", "i", 0, 0, {"a": np.zeros(3), "b": np.zeros(4)}, None)))
    assert info.value.reason == "shape"


def test_decoded_arrays_are_read_only() -> None:
    msg = decode(_valid_frames(x=np.zeros(4, np.float32)))
    with pytest.raises(ValueError):
        msg.arrays["x"][0] = 1.0
    writable = msg.arrays["x"].copy()
    writable[0] = 1.0


# --------------------------------------------------------------------------- no unpickling, ever

MARKER_CALLS: list[str] = []


def _marker(path: str) -> None:
    MARKER_CALLS.append(path)
    Path(path).write_text("unpickled!")


class _Exploit:
    """Unpickling this calls ``_marker``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _marker, (self.path,)


def test_pickle_payload_control(tmp_path: Path) -> None:
    """The payload used below really does fire when unpickled (locally made bytes)."""
    marker = tmp_path / "control"
    pickle.loads(pickle.dumps(_Exploit(str(marker))))
    assert marker.exists()
    MARKER_CALLS.clear()


def test_pickle_payload_is_never_unpickled(ctx: zmq.Context, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    payload = pickle.dumps(_Exploit(str(marker)), protocol=pickle.HIGHEST_PROTOCOL)
    push, pull = _pair(ctx)
    header_obj = json.loads(_valid_frames(x=np.zeros(len(payload), np.uint8))[0])
    attacks = [
        [payload],  # a single frame
        [payload, payload],  # as the header frame
        [pickle.dumps({"p": "zmqrl", "v": 1}), b"x"],
        _with_header([json.dumps(header_obj).encode(), payload], arrays=[["x", "|O", [1]]]),
        _with_header([json.dumps(header_obj).encode(), payload], arrays=[["x", "|V8", [1]]]),
    ]
    for frames in attacks:
        send_frames(push, frames)
        with pytest.raises(WireError):
            recv_message(pull, Limits(), TIMEOUT_MS)
    # A valid header that calls the payload plain bytes just yields those bytes.
    send_frames(push, [json.dumps(header_obj).encode(), payload])
    msg = recv_message(pull, Limits(), TIMEOUT_MS)
    assert msg is not None and msg.arrays["x"].tobytes() == payload
    assert not marker.exists() and MARKER_CALLS == []


# --------------------------------------------------------------------------- trackers


def test_sequence_tracker() -> None:
    tr = SequenceTracker()
    assert tr.observe("a", "i1", 0) == (True, 0)
    assert tr.observe("a", "i1", 1) == (True, 0)
    assert tr.observe("a", "i1", 5) == (True, 3)  # 2, 3, 4 lost
    assert tr.observe("a", "i1", 5) == (False, 0)  # repeat
    assert tr.observe("a", "i1", 3) == (False, 0)  # older
    assert tr.observe("a", "i2", 0) == (True, 0)  # restarted sender
    assert tr.observe("a", "i2", 1) == (True, 0)
    assert tr.observe("b", "j", 10) == (True, 0)  # first message: no loss assumed
    state = tr.sender("a")
    assert state is not None
    assert (state.accepted, state.lost, state.dropped, state.incarnations) == (5, 3, 2, 2)
    stats = tr.stats()
    assert (stats["accepted"], stats["lost"], stats["dropped"], stats["incarnations"]) == (6, 3, 2, 3)
    json.dumps(stats)


def test_sequence_tracker_refuses_new_senders_when_full_and_keeps_known_ones() -> None:
    tr = SequenceTracker(max_senders=2)
    tr.observe("a", "i", 0)
    tr.observe("b", "i", 0)
    for k in range(100):  # a flood of new names
        assert tr.observe(f"rogue-{k}", "x", 0) == (False, 0)
    assert tr.observe("a", "i", 1) == (True, 0) and tr.observe("b", "i", 1) == (True, 0)
    assert tr.sender("a") is not None and tr.sender("rogue-0") is None
    assert tr.stats()["accepted"] == 4 and tr.refused == 100


def test_sequence_tracker_forgets_idle_senders_to_make_room() -> None:
    tr = SequenceTracker(max_senders=2, idle_s=0.0)  # every known sender counts as idle
    tr.observe("a", "i", 0)
    tr.observe("b", "i", 0)
    assert tr.observe("c", "i", 0) == (True, 0)
    assert tr.sender("a") is None and tr.sender("c") is not None


def test_peer_table_memory_is_flat_under_a_flood_of_names() -> None:
    clock = [0.0]
    table: PeerTable[dict[str, int]] = PeerTable(dict, max_peers=3, idle_s=60.0, clock=lambda: clock[0])
    assert table.admit("actor-0") is not None
    for k in range(10_000):
        table.admit(f"junk-{k}")
    assert len(table) == 3 and "actor-0" in table and table.refused == 10_000 - 2
    assert len(table.refused_names) <= 8
    clock[0] = 61.0  # every peer idle for a minute: forgotten, so the newcomer gets in
    assert table.admit("actor-1") is not None and "actor-0" not in table
    assert table.forgotten == 3 and len(table) == 1


def test_rate_limited_log_keys_are_bounded() -> None:
    rl = RateLimitedLog(logging.getLogger("test"), interval=60.0)
    for k in range(5000):
        rl.warn(f"schema-sender-{k}", "bad")
    assert len(rl._last) <= RateLimitedLog.MAX_KEYS + 1


def test_version_tracker() -> None:
    vt = VersionTracker()
    assert vt.offer("L1", 0)
    assert vt.offer("L1", 5)
    assert not vt.offer("L1", 5)
    assert not vt.offer("L1", 3)
    assert vt.would_accept("L2", 0) and vt.version == 5
    assert vt.offer("L2", 0)  # learner restarted without resume: lower version, new line
    assert (vt.incarnation, vt.version) == ("L2", 0)
    assert vt.stats() == {"incarnation": "L2", "version": 0, "accepted": 3, "rejected": 2, "incarnations": 2}


def test_rate_limited_log(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    log = RateLimitedLog(logging.getLogger("zmqrl.test"), interval=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="zmqrl.test"):
        assert log.warn("bad", "bad message")
        assert not log.warn("bad", "bad message")
        assert not log.warn("bad", "bad message")
        assert log.warn("other", "other key")
        assert log.suppressed("bad") == 2
        now[0] += 10.0
        assert log.warn("bad", "bad message again")
    assert [r.getMessage() for r in caplog.records] == [
        "bad message",
        "other key",
        "bad message again (2 similar suppressed)",
    ]


def test_new_incarnation() -> None:
    ids = {new_incarnation() for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"[0-9a-f]{16}", i) for i in ids)


# --------------------------------------------------------------------------- sockets


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:0", "tcp://127.0.0.1:*"])
def test_bind_random_port(ctx: zmq.Context, address: str) -> None:
    pull = make_socket(ctx, zmq.PULL, SocketOptions.pull(), bind=address)
    endpoint = bound_address(pull)
    match = re.fullmatch(r"tcp://127\.0\.0\.1:(\d+)", endpoint)
    assert match and int(match.group(1)) > 0
    push = make_socket(ctx, zmq.PUSH, SocketOptions.push(linger_ms=0), connect=endpoint)
    send_frames(push, encode_stats("s", "i", 0, {"n": 1}))
    msg = recv_message(pull, Limits(), TIMEOUT_MS)
    assert msg is not None and msg.meta == {"n": 1}


def test_bind_errors_name_the_address(ctx: zmq.Context) -> None:
    first = make_socket(ctx, zmq.PULL, SocketOptions(), bind=LOCAL)
    taken = bound_address(first)
    with pytest.raises(SocketSetupError, match=re.escape(taken)):
        make_socket(ctx, zmq.PULL, SocketOptions(), bind=taken)
    for bad in ("tcp://127.0.0.1:notaport", "nonsense://x"):
        with pytest.raises(SocketSetupError, match=re.escape(bad)):
            make_socket(ctx, zmq.PULL, SocketOptions(), bind=bad)
    with pytest.raises(SocketSetupError, match="connect"):
        make_socket(ctx, zmq.PUSH, SocketOptions(), connect="tcp://")
    with pytest.raises(SocketSetupError):
        bound_address(make_socket(ctx, zmq.PUSH, SocketOptions()))


def test_bound_address_maps_wildcard_to_loopback() -> None:
    class Fake:
        def getsockopt(self, option: int) -> bytes:
            assert option == zmq.LAST_ENDPOINT
            return b"tcp://0.0.0.0:5555"

    assert bound_address(Fake()) == "tcp://127.0.0.1:5555"  # type: ignore[arg-type]
    assert bound_address(Fake(), loopback_for_wildcard=False) == "tcp://0.0.0.0:5555"  # type: ignore[arg-type]


def test_make_socket_sets_every_option(ctx: zmq.Context) -> None:
    opts = SocketOptions(
        linger_ms=7,
        sndhwm=11,
        rcvhwm=13,
        heartbeat_ivl_ms=500,
        heartbeat_timeout_ms=1500,
        heartbeat_ttl_ms=2500,
        reconnect_ivl_ms=50,
        reconnect_ivl_max_ms=900,
        maxmsgsize=12345,
        rcvtimeo_ms=250,
        sndtimeo_ms=350,
        immediate=True,
    )
    sock = make_socket(ctx, zmq.PUSH, opts)
    expected = {
        zmq.LINGER: 7,
        zmq.SNDHWM: 11,
        zmq.RCVHWM: 13,
        zmq.RECONNECT_IVL: 50,
        zmq.RECONNECT_IVL_MAX: 900,
        zmq.MAXMSGSIZE: 12345,
        zmq.RCVTIMEO: 250,
        zmq.SNDTIMEO: 350,
        zmq.IMMEDIATE: 1,
    }
    assert {opt: sock.getsockopt(opt) for opt in expected} == expected
    push = SocketOptions.push()
    assert (push.linger_ms, push.immediate) == (1000, True)
    assert SocketOptions.pull(Limits(max_message_bytes=1 << 20)).maxmsgsize == 1 << 20
    assert SocketOptions.sub().linger_ms == 0


def test_maxmsgsize_drops_oversized_frames(ctx: zmq.Context) -> None:
    pull = make_socket(ctx, zmq.PULL, SocketOptions(maxmsgsize=1024), bind=LOCAL)
    push = make_socket(ctx, zmq.PUSH, SocketOptions(), connect=bound_address(pull))
    send_frames(push, encode(MODEL, sender="s", incarnation="i", seq=0, arrays={"x": np.zeros(4096, np.uint8)}))
    assert recv_message(pull, Limits(), 300) is None


def test_recv_message_times_out(ctx: zmq.Context) -> None:
    _, pull = _pair(ctx)
    start = time.monotonic()
    assert recv_message(pull, Limits(), 50) is None
    assert time.monotonic() - start < 2.0


def test_immediate_push_does_not_queue_without_peer(ctx: zmq.Context, tmp_path: Path) -> None:
    # an address nobody listens on: a path of this test's own (a closed TCP port may be taken by another
    # process's random port before the connect)
    push = make_socket(ctx, zmq.PUSH, SocketOptions.push(linger_ms=0), connect=f"ipc://{tmp_path}/nobody")
    with pytest.raises(zmq.Again):
        send_frames(push, encode_stats("s", "i", 0, {}), flags=zmq.NOBLOCK)


def _model(version: int, inc: str = "L1") -> list[bytes | memoryview]:
    return encode_model("learner", inc, version, {"w": np.full(4, version, np.float32)})


def test_drain_latest_model_over_pub_sub(ctx: zmq.Context) -> None:
    pub = make_socket(ctx, zmq.PUB, SocketOptions.pub(sndhwm=1000), bind=LOCAL)
    sub = make_socket(ctx, zmq.SUB, SocketOptions.sub(rcvhwm=1000), connect=bound_address(pub))
    # Slow joiner: publish version 0 until the subscription is live.
    deadline = time.monotonic() + 5.0
    while recv_message(sub, Limits(), 10) is None:
        assert time.monotonic() < deadline, "subscriber never joined"
        send_frames(pub, _model(0))
    tracker = VersionTracker()
    for version in range(1, 51):
        send_frames(pub, _model(version))
    latest: list[Message] = []

    def saw_50() -> bool:
        msg, bad = drain_latest_model(sub, tracker, Limits())
        assert bad == 0
        if msg is not None:
            latest.append(msg)
        return bool(latest) and latest[-1].version == 50

    assert _wait_for(saw_50)
    assert latest[-1].arrays["w"].tolist() == [50.0] * 4
    assert [m.version for m in latest] == sorted(m.version for m in latest)


def test_drain_latest_model_counts_bad_and_follows_restarts(ctx: zmq.Context) -> None:
    push, pull = _pair(ctx)
    tracker = VersionTracker()
    tracker.offer("L1", 10)
    for frames in (_model(11), [b"garbage"], _model(9), encode_stats("s", "i", 0, {}), _model(12), _model(3, "L2")):
        send_frames(push, frames)
    seen: list[Message] = []
    bad_total = [0]

    def done() -> bool:
        msg, bad = drain_latest_model(pull, tracker, Limits())
        bad_total[0] += bad
        if msg is not None:
            seen.append(msg)
        return tracker.incarnation == "L2"

    assert _wait_for(done)
    assert (seen[-1].incarnation, seen[-1].version) == ("L2", 3)
    assert bad_total[0] == 2
    assert drain_latest_model(pull, tracker, Limits()) == (None, 0)


def test_packed_model_round_trip_is_aligned_and_strict() -> None:
    params = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.arange(3, dtype=np.float64),
              "u": np.arange(5, dtype=np.uint8)}
    (frame,) = encode_model("learner", "L1", 7, params, meta={"opt_steps": 350})
    assert bytes(frame[:4]) == MODEL_TOPIC and len(frame) % 8 == 0
    msg = decode([frame])
    assert (msg.kind, msg.version, msg.meta) == ("model", 7, {"opt_steps": 350})
    for name, array in params.items():
        assert np.array_equal(msg.arrays[name], array)
        assert msg.arrays[name].ctypes.data % 8 == 0 or msg.arrays[name].nbytes == 0
    for bad, reason in ((frame[:-8], "size"), (frame + bytes(8), "size"), (frame[:10], "frames"),
                        (b"ZQP1" + (10**6).to_bytes(4, "little") + b"{}", "frames")):
        with pytest.raises(WireError) as err:
            decode([bad])
        assert err.value.reason == reason


def test_model_subscriber_conflates_to_newest(ctx: zmq.Context) -> None:
    pub = make_socket(ctx, zmq.PUB, SocketOptions.pub(sndhwm=1000), bind=LOCAL)
    sub = make_socket(ctx, zmq.SUB, SocketOptions.sub(), connect=bound_address(pub))
    deadline = time.monotonic() + 5.0
    while recv_message(sub, Limits(), 10) is None:
        assert time.monotonic() < deadline, "subscriber never joined"
        send_frames(pub, _model(0))
    for version in range(1, 201):
        send_frames(pub, _model(version))
    tracker = VersionTracker()
    seen: list[int] = []

    def newest() -> bool:
        msg, _ = drain_latest_model(sub, tracker, Limits())
        if msg is not None:
            seen.append(msg.version)
        return bool(seen) and seen[-1] == 200

    assert _wait_for(newest)
    assert len(seen) <= 3  # only the newest is kept, not a backlog of 200

def encode_batch(sender: str, inc: str, seq: int, version: int, batch: dict[str, np.ndarray],
                 episodes: dict[str, Any] | None) -> list[bytes | memoryview]:
    """A BATCH as an actor's stats-free message: ``meta = {"episodes": episodes}`` if given."""
    meta = {"episodes": dict(episodes)} if episodes is not None else {}
    return encode(BATCH, sender=sender, incarnation=inc, seq=seq, version=version, arrays=batch, meta=meta)
