"""Test data for the tests in every folder: CartPole-v1 batches and the BATCH messages that carry them,
and receiving one message with a timeout.

Numpy and :mod:`zmqrl.wire` only, so the hostile client (a process of its own) builds its batches here too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import zmq

from zmqrl.wire import BATCH, DEFAULT_LIMITS, Limits, Message, decode, encode

CARTPOLE_N = 64  # transitions per batch: the shipped CartPole config's actor.n_buffer


def cartpole_batch(n: int, seed: int | np.random.Generator, priority: float | None = 0.5) -> dict[str, np.ndarray]:
    """``n`` CartPole-v1 transitions that fit the run's batch spec (random observations, actions 0 or 1),
    each with ``priority`` unless it is None. ``seed`` may be a generator, to draw one batch after another."""
    rng = np.random.default_rng(seed)
    batch: dict[str, np.ndarray] = {
        "obs": rng.standard_normal((n, 4)).astype(np.float32), "action": rng.integers(0, 2, n, dtype=np.int64),
        "reward": np.ones(n, np.float32), "next_obs": rng.standard_normal((n, 4)).astype(np.float32),
        "discount": np.full(n, 0.97, np.float32)}
    if priority is not None:
        batch["priority"] = np.full(n, priority, np.float32)
    return batch


def batch_frames(sender: str, seq: int, arrays: dict[str, np.ndarray], meta: dict[str, Any] | None = None,
                 inc: str = "inc-1") -> list[Any]:
    """A BATCH message of ``arrays`` at model version 0, with zmqrl's own encoder; ``meta`` defaults to
    the env steps an actor reports after ``seq + 1`` batches of :data:`CARTPOLE_N`."""
    return encode(BATCH, sender=sender, incarnation=inc, seq=seq, version=0, arrays=arrays,
                  meta=meta if meta is not None else {"stats": {"env_steps": CARTPOLE_N * (seq + 1)}})


def recv_message(sock: zmq.Socket, limits: Limits = DEFAULT_LIMITS, timeout_ms: int | None = 0) -> Message | None:
    """Wait up to ``timeout_ms`` (None: forever) for one message on ``sock`` and decode it; None on timeout
    (WireError, the message consumed, for a bad one)."""
    if not sock.poll(timeout_ms, zmq.POLLIN):
        return None
    try:
        frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
    except zmq.Again:
        return None
    return decode(frames, limits)
