"""Snapshots of a stream (the ZeroMQ guide's Clone pattern): a joiner asks for the newest control and
model on a ROUTER and gets them alone, instead of a subscription that makes the publisher broadcast.

The learner's publisher and each host's relay serve their stream this way. A request is one
SNAPSHOT message (:func:`~zmqrl.wire.encode_snapshot_request`) naming the model the role holds; the
reply is ``[control, model]`` as the packed frames the stream publishes (control alone when the
role holds the newest model already or none is due, nothing when there is neither).

What a peer may cost, whatever it sends:

* one model per version it has not been sent yet, and the same version again only after
  ``net.republish_s`` (a peer that asks in a loop gets what a subscriber gets, no more);
* peers are told apart by their connection (the ROUTER's routing id); the :data:`MAX_PEERS`
  most recently served are remembered, the rest forgotten (at worst one model more each);
* over every peer together, at most ``burst`` models at once and ``burst`` per ``republish_s``
  on average (a token bucket): a peer that reconnects to look new each time still costs a
  bounded number of models, and a whole host of joiners (``burst`` = ``net.max_peers``) is
  served at once.

Requests are read and answered in the server's thread without blocking; a reply the ROUTER cannot
queue (the peer's queue is full, or it left) is dropped by the ROUTER and counted as sent.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from zmqrl.wire import SNAPSHOT, Limits, WireError, decode
from zmqrl.wire.tracking import RateLimitedLog

log = logging.getLogger("zmqrl")

MAX_REQUESTS = 256  # requests read per call (a flood must not hold the thread)
MAX_PEERS = 4096  # peers whose last snapshot is remembered
REQUEST_LIMITS = Limits.only([SNAPSHOT], max_frames=1, max_header_bytes=1024, max_message_bytes=0)


@dataclass
class _Served:
    """What one peer was sent last."""

    key: tuple[str, int]  # (incarnation, version) of the model
    at: float  # monotonic time


class SnapshotServer:
    """Answers SNAPSHOT requests on ``sock`` (a ROUTER) with the newest control and model (module
    docstring); counters for the role's stats."""

    def __init__(self, sock: zmq.Socket, name: str, republish_s: float, burst: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sock, self.name, self.republish_s, self.burst = sock, name, republish_s, max(1, burst)
        self._clock = clock
        self._tokens = float(self.burst)
        self._filled_at = clock()
        self._served: OrderedDict[bytes, _Served] = OrderedDict()
        self.ratelog = RateLimitedLog(log, 10.0)
        self.requests = self.bad = 0
        self.models_sent = self.model_bytes = 0
        self.controls_sent = self.control_bytes = 0
        self.models_withheld = 0  # asked for a model the peer had just been sent, or over the bucket
        self.unanswered = 0  # requests that came while there was nothing to send

    def serve(self, control: bytes | None, model: bytes | None, key: tuple[str, int] | None) -> int:
        """Answer the requests waiting (at most :data:`MAX_REQUESTS`) with ``control`` and the ``model``
        whose (incarnation, version) is ``key``; returns how many were read."""
        read = 0
        for _ in range(MAX_REQUESTS):
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            read += 1
            self.requests += 1
            if len(frames) != 2:
                self.bad += 1
                self.ratelog.warn("frames", f"{self.name}: dropped a snapshot request of {len(frames) - 1} frames")
                continue
            try:
                msg = decode(frames[1:], REQUEST_LIMITS)
            except WireError as exc:
                self.bad += 1
                self.ratelog.warn(exc.reason, f"{self.name}: dropped a bad snapshot request: {exc}")
                continue
            self._answer(frames[0].bytes, _have(msg.meta), control, model, key)
        return read

    def _answer(self, peer: bytes, have: tuple[str, int] | None, control: bytes | None, model: bytes | None,
                key: tuple[str, int] | None) -> None:
        reply: list[Any] = [peer]
        if control is not None:
            reply.append(control)
        send_model = model is not None and key is not None and have != key and self._due(peer, key)
        if send_model:
            reply.append(model)
        if len(reply) == 1:
            self.unanswered += 1
            return
        try:
            self.sock.send_multipart(reply, zmq.NOBLOCK, copy=False)
        except zmq.Again:  # (a ROUTER drops rather than blocks; kept for a socket set otherwise)
            return
        if control is not None:
            self.controls_sent += 1
            self.control_bytes += len(control)
        if send_model:
            assert model is not None and key is not None
            self.models_sent += 1
            self.model_bytes += len(model)
            self._served[peer] = _Served(key, self._clock())
            self._served.move_to_end(peer)
            while len(self._served) > MAX_PEERS:
                self._served.popitem(last=False)

    def _due(self, peer: bytes, key: tuple[str, int]) -> bool:
        """Whether ``peer`` may be sent the model ``key`` now (and a token is taken for it)."""
        now = self._clock()
        served = self._served.get(peer)
        if served is not None and served.key == key and now - served.at < self.republish_s:
            self.models_withheld += 1
            return False
        self._tokens = min(float(self.burst), self._tokens + (now - self._filled_at) * self.burst / self.republish_s)
        self._filled_at = now
        if self._tokens < 1.0:
            self.models_withheld += 1
            self.ratelog.warn("bucket", f"{self.name}: snapshot requests beyond {self.burst} models per "
                                        f"net.republish_s={self.republish_s:g}s; withholding models")
            return False
        self._tokens -= 1.0
        return True

    def stats(self) -> dict[str, Any]:
        return {"snapshot_requests": self.requests, "snapshot_models": self.models_sent,
                "snapshot_model_bytes": self.model_bytes, "snapshot_controls": self.controls_sent,
                "snapshot_control_bytes": self.control_bytes, "snapshot_withheld": self.models_withheld,
                "snapshot_bad": self.bad, "snapshot_unanswered": self.unanswered}


def _have(meta: dict[str, Any]) -> tuple[str, int] | None:
    """The ``(incarnation, version)`` a request says its sender holds, or None."""
    have = meta.get("have")
    if (isinstance(have, list) and len(have) == 2 and isinstance(have[0], str) and isinstance(have[1], int)
            and not isinstance(have[1], bool)):
        return have[0], have[1]
    return None
