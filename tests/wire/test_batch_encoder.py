"""BatchEncoder: the same frames as codec.encode for a stream of batches, from a header template."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from zmqrl.wire import BATCH, Limits, WireError, decode, encode, pack
from zmqrl.wire import batches as wire_batches
from zmqrl.wire.batches import BatchEncoder

SENDER, INC = "actor-3", "0123456789abcdef"


def batch(n: int, seed: int = 0, obs_shape: tuple[int, ...] = (4,), priority: bool = True) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {"obs": rng.standard_normal((n, *obs_shape)).astype(np.float32),
              "action": rng.integers(0, 2, n),
              "reward": rng.standard_normal(n).astype(np.float32),
              "next_obs": rng.standard_normal((n, *obs_shape)).astype(np.float32),
              "discount": np.full(n, 0.97, np.float32)}
    if priority:
        arrays["priority"] = rng.uniform(0, 2, n).astype(np.float32)
    return arrays


def meta(i: int) -> dict[str, Any]:
    return {"episodes": {"returns": [float(i), 21.5] * (i % 3), "lengths": [i, 21] * (i % 3)}, "actor": 3,
            "max_version": i + 2, "model_inc": "learner-inc" if i % 2 else None, "epsilon": 0.4 ** (i + 1),
            "stats": {"env_steps": 1000 * i, "blocked_s": 0.125, "wall_s": 1e-7 * i, "name": "ünïcode \"q\""}}


def reference(seq: int, version: int, arrays: dict[str, np.ndarray], m: Any, limits: Limits = Limits()) -> list[bytes]:
    return [bytes(f) for f in encode(BATCH, sender=SENDER, incarnation=INC, seq=seq, version=version,
                                     arrays=arrays, meta=m, limits=limits)]


def frames_of(encoder: BatchEncoder, seq: int, version: int, arrays: dict[str, np.ndarray], m: Any) -> list[bytes]:
    return [bytes(f) for f in encoder.encode(seq, version, arrays, m)]


def test_frames_equal_encode_for_a_stream_of_batches() -> None:
    encoder = BatchEncoder(SENDER, INC)
    for i in range(40):
        arrays = batch(64 + i % 5, seed=i)
        seq, version = i, (i // 3 if i % 7 else -1)
        assert frames_of(encoder, seq, version, arrays, meta(i)) == reference(seq, version, arrays, meta(i))
    assert encoder.fast == 39  # all but the first, which made the template
    msg = decode(encoder.encode(41, 5, batch(70, seed=41), meta(41)))
    assert (msg.kind, msg.sender, msg.incarnation, msg.seq, msg.version) == (BATCH, SENDER, INC, 41, 5)
    assert msg.meta == meta(41)
    for name, array in batch(70, seed=41).items():
        np.testing.assert_array_equal(msg.arrays[name], array)


def test_small_batches_leave_as_one_packed_frame() -> None:
    """Below ``pack_below`` bytes of arrays a batch is ``pack`` of the frames ``encode`` makes (one
    frame, the same message once decoded); at or above it, the frames themselves (zero-copy)."""
    small, large = batch(64, seed=1), batch(4096, seed=2)
    small_bytes = sum(a.nbytes for a in small.values())
    encoder = BatchEncoder(SENDER, INC, pack_below=small_bytes + 1)
    for seq in range(3):  # the first through encode, the others from the template
        (frame,) = frames_of(encoder, seq, 7, small, meta(seq))
        assert frame == pack(reference(seq, 7, small, meta(seq)))
        msg = decode([frame])
        assert (msg.seq, msg.meta) == (seq, meta(seq))
        for name, array in small.items():
            np.testing.assert_array_equal(msg.arrays[name], array)
    assert encoder.fast == 2
    assert frames_of(encoder, 3, 7, large, meta(3)) == reference(3, 7, large, meta(3))
    exact = BatchEncoder(SENDER, INC, pack_below=small_bytes)
    assert len(exact.encode(0, 7, small, meta(0))) == 1 + len(small)


@pytest.mark.parametrize("arrays", [
    {"obs": np.arange(2 * 4 * 3 * 3, dtype=np.uint8).reshape(2, 4, 3, 3), "done": np.array([True, False]),
     "h": np.ones(2, np.float16), "i": np.arange(2, dtype=np.int16)},
    {"empty": np.zeros((0, 3), np.float32), "also": np.zeros(0, np.int64)},
])
def test_other_dtypes_shapes_and_empty_batches(arrays: dict[str, np.ndarray]) -> None:
    encoder = BatchEncoder(SENDER, INC)
    for seq in range(3):
        assert frames_of(encoder, seq, 0, arrays, {"k": seq}) == reference(seq, 0, arrays, {"k": seq})
    assert encoder.fast == 2


def test_each_layout_has_its_own_template() -> None:
    encoder = BatchEncoder(SENDER, INC)
    layouts = [batch(8), batch(8, priority=False), batch(8, obs_shape=(2, 3)),
               {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in batch(8).items()}]
    for round_ in range(2):
        for j, arrays in enumerate(layouts):
            seq = 10 * round_ + j
            assert frames_of(encoder, seq, 1, arrays, meta(j)) == reference(seq, 1, arrays, meta(j))
    assert encoder.fast == len(layouts)


def test_what_only_encode_handles_goes_through_encode() -> None:
    encoder = BatchEncoder(SENDER, INC)
    arrays = batch(16)
    encoder.encode(0, 0, arrays, meta(0))
    odd_metas = [{"x": np.float32(1.5), "n": np.int64(3)},  # numpy scalars: encode converts them
                 {"a": np.arange(3)}]  # arrays in meta: encode makes lists of them
    for seq, m in enumerate(odd_metas, start=1):
        assert frames_of(encoder, seq, 0, arrays, m) == reference(seq, 0, arrays, m)
    strided = {**arrays, "obs": np.asfortranarray(np.ones((16, 4), np.float32))}
    assert frames_of(encoder, 9, 0, strided, meta(9)) == reference(9, 0, strided, meta(9))
    assert encoder.fast == 0


def test_the_fast_path_checks_what_it_fills_in() -> None:
    arrays = batch(64)
    limits = Limits(max_header_bytes=2048, max_message_bytes=sum(a.nbytes for a in arrays.values()))
    encoder = BatchEncoder(SENDER, INC, limits)
    encoder.encode(0, 0, arrays, meta(0))
    for seq, version in ((-1, 0), (0, -2), (2**63, 0), (True, 0), (1, 1.5)):
        with pytest.raises(WireError):
            encoder.encode(seq, version, arrays, meta(1))  # type: ignore[arg-type]
    with pytest.raises(WireError, match="max_message_bytes"):
        encoder.encode(1, 0, batch(65), meta(1))
    with pytest.raises(WireError, match="header"):
        encoder.encode(1, 0, arrays, {"big": "x" * 4000})
    deep: dict[str, Any] = {}
    for _ in range(20):
        deep = {"d": deep}
    with pytest.raises(WireError, match="meta"):  # too deep for the template: encode refuses it
        encoder.encode(1, 0, arrays, deep)
    with pytest.raises(WireError, match="meta"):
        encoder.encode(1, 0, arrays, {"f": {1, 2}})
    assert encoder.fast == 0
    good = reference(1, 0, arrays, meta(1), limits)
    assert frames_of(encoder, 1, 0, arrays, meta(1)) == good and encoder.fast == 1


def test_no_template_when_it_does_not_reproduce_the_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    """A codec whose header format changed (here: spaces after separators) is followed, not overridden."""
    import json

    def spaced(*args: Any, **kwargs: Any) -> list[bytes | memoryview]:
        frames = encode(*args, **kwargs)
        return [json.dumps(json.loads(bytes(frames[0]))).encode(), *frames[1:]]

    monkeypatch.setattr(wire_batches, "encode", spaced)
    encoder = BatchEncoder(SENDER, INC)
    for seq in range(3):
        got = frames_of(encoder, seq, 0, batch(8), meta(seq))
        assert got[0] == json.dumps(json.loads(reference(seq, 0, batch(8), meta(seq))[0])).encode()
    assert encoder.fast == 0


def test_non_finite_floats_in_meta_match_encode() -> None:
    encoder = BatchEncoder(SENDER, INC)
    arrays = batch(4)
    encoder.encode(0, 0, arrays, meta(0))
    m = {"stats": {"a": math.nan, "b": math.inf, "c": -math.inf, "d": 1e300, "e": -0.0}}
    assert frames_of(encoder, 1, 0, arrays, m) == reference(1, 0, arrays, m)
    assert encoder.fast == 1
