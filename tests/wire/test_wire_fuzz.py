"""Property tests: ``decode`` returns a faithful Message or raises WireError -- nothing else."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from zmqrl.wire import ALLOWED_DTYPES, KINDS, REASONS, Limits, Message, WireError, decode, encode, peek_header

SETTINGS = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CASES: Counter[str] = Counter()
HEADER_KEYS = ["p", "v", "kind", "sender", "inc", "seq", "ver", "arrays", "meta"]
DTYPE_STRINGS = sorted(ALLOWED_DTYPES) + ["|O", "O", "<U4", "|S2", "|V4", ">f4", ">i2", "<u4", "<c16", "f4", "", "int"]


@pytest.fixture(scope="module", autouse=True)
def report_case_counts(request: pytest.FixtureRequest) -> Iterator[None]:
    """Print how many inputs each property test tried."""
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None or not CASES:
        return
    summary = ", ".join(f"{name}={count}" for name, count in sorted(CASES.items()))
    with capture.global_and_fixture_disabled():  # show the line even when output is captured
        reporter.write_line(f"\nwire fuzz cases tried: {sum(CASES.values())} ({summary})")


# --------------------------------------------------------------------------- strategies

printable = st.text(
    st.characters(min_codepoint=32, max_codepoint=0x24F, exclude_categories=("Cc", "Cs", "Co", "Cn")),
    min_size=1,
    max_size=16,
).filter(str.isprintable)

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
# Junk that mutated header fields are replaced with: every JSON type, extreme ints, near-miss values.
junk = (
    json_values
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([-1, 0, 1, 2, 2**63, True, False, "", "zmqrl", "batch", "1", [], {}, [[]], [["x", "|u1", [1]]]])
)
shape_junk = (
    st.lists(st.integers(min_value=-5, max_value=2**64) | st.sampled_from([True, 1.5, "3", None]), max_size=40) | junk
)

arrays_strategy = st.dictionaries(
    printable,
    hnp.arrays(
        dtype=st.sampled_from(sorted(ALLOWED_DTYPES)).map(np.dtype),
        shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
    ),
    max_size=5,
)


@st.composite
def valid_messages(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Keyword arguments for ``encode`` and the arrays they carry."""
    arrays = draw(arrays_strategy)
    kwargs = {
        "kind": draw(st.sampled_from(sorted(KINDS))),
        "sender": draw(printable),
        "incarnation": draw(printable),
        "seq": draw(st.integers(min_value=0, max_value=2**63 - 1)),
        "version": draw(st.integers(min_value=-1, max_value=2**63 - 1)),
        "arrays": arrays,
        "meta": draw(st.dictionaries(st.text(max_size=6), json_values, max_size=4)),
    }
    return kwargs, arrays


def _frames(kwargs: dict[str, Any]) -> list[bytes]:
    return [bytes(f) for f in encode(**kwargs)]


def _wrap(frames: list[bytes], how: str) -> list[Any]:
    if how == "memoryview":
        return [memoryview(f) for f in frames]
    if how == "zmq.Frame":
        return [zmq.Frame(f) for f in frames]
    return frames


def check_decode(name: str, frames: Any, limits: Limits = Limits()) -> Message | None:
    """Decode ``frames``: either a Message that matches them, or WireError (None)."""
    CASES[name] += 1
    try:
        msg = decode(frames, limits)
    except WireError as exc:
        assert exc.reason in REASONS and str(exc)
        with pytest.raises(WireError):
            peek_header(frames, limits)
        return None
    raw = [bytes(memoryview(f)) for f in frames]
    header = json.loads(raw[0].decode("utf-8"))
    assert peek_header(frames, limits) == header
    assert (msg.kind, msg.sender, msg.incarnation, msg.seq, msg.version, msg.meta) == (
        header["kind"],
        header["sender"],
        header["inc"],
        header["seq"],
        header["ver"],
        header["meta"],
    )
    assert len(msg.arrays) == len(raw) - 1 == len(header["arrays"])
    for (arr_name, array), data, (name_, dtype, shape) in zip(
        msg.arrays.items(), raw[1:], header["arrays"], strict=True
    ):
        assert arr_name == name_ and array.dtype.str == dtype and list(array.shape) == shape
        assert array.tobytes() == data and not array.flags.writeable
    assert msg.nbytes == sum(len(d) for d in raw[1:])
    return msg


# --------------------------------------------------------------------------- properties


@SETTINGS
@given(frames=st.lists(st.binary(max_size=300), max_size=8), how=st.sampled_from(["bytes", "memoryview", "zmq.Frame"]))
def test_random_byte_frames(frames: list[bytes], how: str) -> None:
    check_decode("random_bytes", _wrap(frames, how))


@SETTINGS
@given(header=json_values, buffers=st.lists(st.binary(max_size=64), max_size=4))
def test_random_json_headers(header: Any, buffers: list[bytes]) -> None:
    check_decode("random_json", [json.dumps(header).encode(), *buffers])


@SETTINGS
@given(message=valid_messages(), how=st.sampled_from(["bytes", "memoryview", "zmq.Frame"]))
def test_valid_messages_round_trip(message: tuple[dict[str, Any], dict[str, np.ndarray]], how: str) -> None:
    kwargs, arrays = message
    msg = check_decode("round_trip", _wrap(_frames(kwargs), how))
    assert msg is not None
    for name, array in arrays.items():
        assert msg.arrays[name].tobytes() == np.ascontiguousarray(array).tobytes()
        assert msg.arrays[name].shape == array.shape


@SETTINGS
@given(message=valid_messages(), data=st.data())
def test_truncated_and_extra_frames(message: tuple[dict[str, Any], dict[str, np.ndarray]], data: st.DataObject) -> None:
    kwargs = dict(message[0])
    pad = np.arange(data.draw(st.integers(1, 16)), dtype=np.uint8)
    kwargs["arrays"] = {**kwargs["arrays"], "~pad": pad}  # at least one non-empty payload frame
    frames = _frames(kwargs)
    action = data.draw(st.sampled_from(["truncate", "extend", "drop", "append"]))
    if action == "drop":
        keep = data.draw(st.integers(min_value=0, max_value=len(frames) - 1))
        mutated = frames[:keep]
    elif action == "append":
        mutated = frames + data.draw(st.lists(st.binary(max_size=16), min_size=1, max_size=70))
    else:
        payload = [i for i, f in enumerate(frames) if i > 0 and (f or action == "extend")]
        index = data.draw(st.sampled_from(payload))
        mutated = list(frames)
        if action == "truncate":
            mutated[index] = frames[index][: data.draw(st.integers(0, len(frames[index]) - 1))]
        else:
            mutated[index] = frames[index] + data.draw(st.binary(min_size=1, max_size=8))
    assert check_decode(f"frames_{action}", mutated) is None


@SETTINGS
@given(message=valid_messages(), key=st.sampled_from([*HEADER_KEYS, "extra"]), value=junk, delete=st.booleans())
def test_mutated_header_fields(
    message: tuple[dict[str, Any], dict[str, np.ndarray]], key: str, value: Any, delete: bool
) -> None:
    frames = _frames(message[0])
    header = json.loads(frames[0])
    if delete:
        header.pop(key, None)
    else:
        header[key] = value
    msg = check_decode("header_fields", [json.dumps(header).encode(), *frames[1:]])
    if delete and key != "extra":
        assert msg is None


@SETTINGS
@given(message=valid_messages(), data=st.data())
def test_mutated_array_entries(message: tuple[dict[str, Any], dict[str, np.ndarray]], data: st.DataObject) -> None:
    frames = _frames(message[0])
    header = json.loads(frames[0])
    if not header["arrays"]:
        header["arrays"] = data.draw(junk)
    else:
        entry = header["arrays"][data.draw(st.integers(0, len(header["arrays"]) - 1))]
        part = data.draw(st.sampled_from(["name", "dtype", "shape", "arity"]))
        if part == "name":
            entry[0] = data.draw(junk | printable)
        elif part == "dtype":
            entry[1] = data.draw(st.sampled_from(DTYPE_STRINGS) | junk)
        elif part == "shape":
            entry[2] = data.draw(shape_junk)
        elif data.draw(st.booleans()):
            entry.append(data.draw(junk))
        else:
            entry.pop()
    check_decode("array_entries", [json.dumps(header).encode(), *frames[1:]])


@SETTINGS
@given(cap=st.integers(min_value=1, max_value=12), delta=st.integers(min_value=-2, max_value=2), data=st.data())
def test_frame_counts_near_the_cap(cap: int, delta: int, data: st.DataObject) -> None:
    n_arrays = max(0, cap - 1 + delta)
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=n_arrays, max_size=n_arrays))
    arrays = {f"a{i}": np.arange(size, dtype=np.int16) for i, size in enumerate(sizes)}
    frames = [bytes(f) for f in encode("model", sender="s", incarnation="i", seq=0, arrays=arrays, limits=Limits(100))]
    msg = check_decode("frame_cap", frames, Limits(max_frames=cap))
    assert (msg is not None) == (len(frames) <= cap)


@SETTINGS
@given(message=valid_messages(), data=st.data())
def test_mutated_header_bytes(message: tuple[dict[str, Any], dict[str, np.ndarray]], data: st.DataObject) -> None:
    frames = _frames(message[0])
    header = bytearray(frames[0])
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(header)))
        op = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        byte = data.draw(st.integers(0, 255))
        if op == "insert":
            header.insert(pos, byte)
        elif pos < len(header):
            if op == "flip":
                header[pos] = byte
            else:
                del header[pos]
    check_decode("header_bytes", [bytes(header), *frames[1:]])


@SETTINGS
@given(message=valid_messages(), limit=st.integers(min_value=0, max_value=2048))
def test_payload_and_header_limits(message: tuple[dict[str, Any], dict[str, np.ndarray]], limit: int) -> None:
    frames = _frames(message[0])
    payload = sum(len(f) for f in frames[1:])
    msg = check_decode("payload_limit", frames, Limits(max_message_bytes=limit))
    assert (msg is not None) == (payload <= limit)
    header_limit = max(64, limit)
    msg = check_decode("header_limit", frames, Limits(max_header_bytes=header_limit))
    assert (msg is not None) == (len(frames[0]) <= header_limit)
