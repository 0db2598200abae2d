"""A role's side of the learner's stream: its models and its control, each on a subscription of its own.

Both subscriptions conflate (only the newest message waits), so a role busy for a long time
finds the newest model and the newest control, and control never pushes a model out of the
queue. Control is taken from the learner line in use: the learner incarnation of the model the
role took last (any, before its first model); control from a newer line waits until its model
has been taken, then counts.

Each control message names the learner's newest model version. A role whose model stays older
than that for :data:`STALE_S` (the model was dropped on the way: a publisher drops what a slow
subscriber's queue cannot take) subscribes to models again; the learner's publisher takes that
as a new subscriber and sends the model, so it need not re-send models often on its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import zmq

from zmqrl.config import NetConfig
from zmqrl.roles.net import limits, options
from zmqrl.roles.skeleton import RoleProcess
from zmqrl.wire import (
    CONTROL,
    MODEL,
    MODEL_SUBSCRIPTION,
    Message,
    SocketOptions,
    VersionTracker,
    WireError,
    drain_control,
    drain_latest_model,
)
from zmqrl.wire.monitor import LinkMonitor

STALE_S = 1.0  # a model older than the one control names for this long is asked for again


class LearnerStream:
    """What a role hears from the learner at ``address`` (its XPUB): with ``models``, the newest model
    (:meth:`newest_model`), and always control (:meth:`take_control`). ``digest`` is the role's own
    task digest (:func:`~zmqrl.roles.fit.signature_digest`): control from a learner whose digest
    differs sets :attr:`foreign` (the role must not act for it; its model says how it differs)."""

    def __init__(self, role: RoleProcess, net: NetConfig, address: str, *, models: bool = True,
                 digest: str | None = None, on_error: Callable[[WireError], None] | None = None) -> None:
        self.address, self.digest, self.on_error = address, digest, on_error
        self.model_limits, self.control_limits = limits(net, MODEL), limits(net, CONTROL)
        self.control_sub = role.socket(zmq.SUB, options(net, SocketOptions.control(self.control_limits)),
                                       connect=address, link="to learner control {address}")
        self.control_link: LinkMonitor = role.links[-1]
        self.model_sub = None
        if models:
            self.model_sub = role.socket(zmq.SUB, options(net, SocketOptions.models(self.model_limits)),
                                         connect=address, link="to learner models {address}")
        self.versions = VersionTracker()
        self.bad = 0  # messages on the stream that did not decode (or came on the wrong topic)
        self.foreign = False  # the newest control came from a learner of another task
        self.asked = 0  # times a model older than control's was asked for again
        self._waiting: Message | None = None  # control from a newer learner line, until its model is taken
        self._announced = -1  # the newest model version control of the line in use named
        self._stale_since: float | None = None

    @property
    def down(self) -> bool:
        """Whether the link to the learner is down (no control can come)."""
        return self.control_link.down

    def take_control(self, apply: Callable[[Message], None]) -> int:
        """``apply`` each control message that came since the last call from the line in use (in order,
        the newest last); returns how many bad messages were read."""
        messages, bad = drain_control(self.control_sub, self.control_limits, on_error=self.on_error)
        self.bad += bad
        for msg in messages:
            self._waiting = msg
        if self._waiting is not None and self._current(self._waiting):
            msg, self._waiting = self._waiting, None
            task = msg.meta.get("task")
            self.foreign = self.digest is not None and isinstance(task, str) and task != self.digest
            self._announced = msg.version
            apply(msg)
        self._ask_if_stale()
        return bad

    def _ask_if_stale(self) -> None:
        """Subscribe to models again when the model in use has stayed older than control's for STALE_S."""
        if self.model_sub is None or self.versions.incarnation is None or self._announced <= self.versions.version:
            self._stale_since = None
            return
        now = time.monotonic()
        if self._stale_since is None:
            self._stale_since = now
        elif now - self._stale_since >= STALE_S:
            self.model_sub.setsockopt(zmq.SUBSCRIBE, MODEL_SUBSCRIPTION)  # the publisher sees a join
            self.asked += 1
            self._stale_since = now

    def _current(self, msg: Message) -> bool:
        return self.versions.incarnation is None or msg.incarnation == self.versions.incarnation

    def newest_model(self, observe: Callable[[Message], None] | None = None) -> tuple[Message | None, int]:
        """The newest model newer than the last one taken (None when none came), and how many bad
        messages were read; ``observe`` sees every model decoded."""
        if self.model_sub is None:
            return None, 0
        msg, bad = drain_latest_model(self.model_sub, self.versions, self.model_limits, observe=observe,
                                      on_error=self.on_error)
        self.bad += bad
        return msg, bad

    def wait(self, timeout_ms: int) -> bool:
        """Wait up to ``timeout_ms`` for anything on the stream; whether something came."""
        poller = zmq.Poller()
        poller.register(self.control_sub, zmq.POLLIN)
        if self.model_sub is not None:
            poller.register(self.model_sub, zmq.POLLIN)
        return bool(poller.poll(timeout_ms))
