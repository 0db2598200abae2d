"""The hostile client's messages (see :mod:`hostile.client`): CartPole-v1 batches, headers written by hand
where they must hold numbers Python's ``json`` cannot (:class:`Literal`), and each attack kind's bad payload."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from batches import CARTPOLE_N, cartpole_batch
from zmqrl.wire import (
    BATCH,
    EVAL,
    PROTOCOL_NAME,
    PROTOCOL_VERSION,
    STATS,
    encode,
    eval_meta,
)

NAN = float("nan")
CARTPOLE_MAX_RETURN = 500.0
NAME_CHARS = 250  # long_names: characters per sender name


class Literal:
    """A JSON token written as is, for numbers Python's ``json`` cannot write (``1e400``)."""

    def __init__(self, text: str) -> None:
        self.text = text


def dumps(obj: Any) -> str:
    """``json.dumps`` (NaN, Infinity and ints of any size as Python writes them) with each
    :class:`Literal` spliced in as its raw text."""
    literals: list[str] = []

    def default(value: Any) -> str:
        if isinstance(value, Literal):
            literals.append(value.text)
            return f"\0literal{len(literals) - 1}\0"
        raise TypeError(f"{type(value).__name__} is not JSON serialisable")

    text = json.dumps(obj, default=default, separators=(",", ":"))
    for i, literal in enumerate(literals):
        text = text.replace(json.dumps(f"\0literal{i}\0"), literal)
    return text


Array = tuple[str, str, list[int], bytes]  # name, dtype (numpy's str), shape, bytes: what a header declares


def arrays_of(batch: Mapping[str, np.ndarray]) -> list[Array]:
    """The header entries and bytes of real arrays."""
    return [(name, a.dtype.str, list(a.shape), np.ascontiguousarray(a).tobytes()) for name, a in batch.items()]


def message(kind: str, sender: str, inc: str, seq: int, ver: int, arrays: list[Array],
            meta: Mapping[str, Any]) -> list[bytes]:
    """``[header, buffer...]`` built by hand: the header declares exactly ``arrays`` and holds ``meta``
    whatever its numbers; nothing is checked."""
    header = {"p": PROTOCOL_NAME, "v": PROTOCOL_VERSION, "kind": kind, "sender": sender, "inc": inc, "seq": seq,
              "ver": ver, "arrays": [[name, dtype, shape] for name, dtype, shape, _ in arrays], "meta": dict(meta)}
    return [dumps(header).encode(), *[data for *_, data in arrays]]


def sane_batch(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A CartPole-v1 batch of :data:`~batches.CARTPOLE_N` that fits the run's batch spec, with sane values."""
    return cartpole_batch(CARTPOLE_N, rng, priority=1.0)


def sane_arrays(rng: np.random.Generator) -> list[Array]:
    """:func:`sane_batch` as header entries and bytes."""
    return arrays_of(sane_batch(rng))


def batch_meta(env_steps: int, **extra: Any) -> dict[str, Any]:
    """A batch's meta as an actor writes it (episodes, exploration, its counters), with ``extra`` on top."""
    return {"episodes": {"returns": [], "lengths": []}, "explore": 0.1, "stats": {"env_steps": env_steps}, **extra}


def number_metas() -> list[tuple[str, dict[str, Any]]]:
    """meta_numbers' messages: (message kind, meta) with NaN, infinity and 10**400 where numbers are read."""
    inf = Literal("1e400")  # parsed as float infinity
    return [
        (BATCH, batch_meta(0, stats={"env_steps": NAN})),
        (BATCH, batch_meta(0, stats={"env_steps": inf})),
        (BATCH, batch_meta(0, stats={"env_steps": 10**400, "env_steps_per_s": inf})),
        (BATCH, batch_meta(0, explore=NAN)),
        (BATCH, batch_meta(0, explore=inf)),
        (BATCH, batch_meta(0, episodes={"returns": [1.0], "lengths": [NAN]})),
        (BATCH, batch_meta(0, episodes={"returns": [NAN], "lengths": [inf]})),
        (BATCH, batch_meta(0, episodes={"returns": [inf], "lengths": [10**400]})),
        (STATS, {"role": "proxy", "forwarded": 10**400, "bytes_per_s": NAN, "rejected_total": inf}),
        (EVAL, {"version": 0, "returns": [NAN] * 10, "lengths": [500] * 10}),
        (EVAL, {"version": 0, "returns": [inf] * 10, "lengths": [10**400] * 10}),
    ]


def zero_shape_arrays(rng: np.random.Generator) -> list[Array]:
    """A CartPole batch plus an array declared [0, 2**62]: zero bytes, an impossible shape."""
    return [*sane_arrays(rng), ("pad", "<f4", [0, 2**62], b"")]


def bad_value_batches(rng: np.random.Generator) -> list[tuple[str, dict[str, np.ndarray]]]:
    """bad_values' batches: (what is wrong, batch), each fitting the batch spec."""
    out = []
    for what, key, value in (("action 7", "action", 7), ("NaN reward", "reward", NAN), ("NaN obs", "obs", NAN),
                             ("NaN priority", "priority", NAN), ("inf priority", "priority", np.inf)):
        batch = sane_batch(rng)
        batch[key][CARTPOLE_N // 2] = value
        out.append((what, batch))
    return out


def forged_eval_frames(inc: str, seq: int, version: int) -> list[bytes | memoryview]:
    """An evaluation report claiming CartPole's best return for ``version``, as the evaluator names itself."""
    return encode(EVAL, sender="evaluator", incarnation=inc, seq=seq, version=version,
                  meta=eval_meta(version, [CARTPOLE_MAX_RETURN] * 10, [500] * 10))


def long_name(i: int) -> str:
    """The ``i``-th distinct sender name of :data:`NAME_CHARS` characters."""
    return f"hostile-{i:012d}-".ljust(NAME_CHARS, "x")


def many_frames_message(frames: int, inc: str, seq: int) -> list[bytes]:
    """One message of ``frames`` frames: a batch header, then two-byte frames."""
    header = message(BATCH, "hostile-many_frames", inc, seq, 0, [], batch_meta(0))[0]
    return [header, *[b"ab"] * (frames - 1)]


def junk_bytes(rng: np.random.Generator, i: int) -> bytes:
    """What junk_handshake sends: random bytes, a half ZMTP greeting with a wrong mechanism, or HTTP."""
    variants = [rng.bytes(int(rng.integers(1, 512))),
                b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"BOGUS".ljust(20, b"\0") + rng.bytes(64),
                b"GET / HTTP/1.1\r\nHost: zmqrl\r\n\r\n"]
    return variants[i % len(variants)]
