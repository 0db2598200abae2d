"""Batches into replay, on the learner's update loop, between its steps (:class:`ReplayWriter`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from zmqrl.core import ReplayBuffer
from zmqrl.roles.intake import Arrived
from zmqrl.wire import Message, PeerTable, RateLimitedLog

log = logging.getLogger("zmqrl")

GROUP_BYTES = 1 << 20  # join batches into one replay.add up to this size (beyond it the copy costs more)
FRAMES_PER_ITEM = 2  # new image frames a sender's items may take in replay: twice what an honest item brings
FRAME_SLACK = 512  # ... plus this many (a sender's first batches bring whole stacks: frame_stack per env)


def _groups(batches: list[Arrived]) -> list[list[Arrived]]:
    """Runs of consecutive batches that can be joined: stored as given, with or without priorities alike, small."""
    groups: list[list[Arrived]] = []
    last: tuple[str, ...] | None = None
    size = 0
    for item in batches:
        sig = tuple(item.msg.arrays) if item.frames is None else ()
        nbytes = item.msg.nbytes
        if groups and sig and sig == last and size + nbytes <= GROUP_BYTES:
            groups[-1].append(item)
            size += nbytes
        else:
            groups.append([item])
            last, size = sig, nbytes
    return groups


class ReplayWriter:
    """Inserts checked batches into replay, in order, in as few calls as it can (each call has a fixed
    cost several times that of copying a small batch).

    A batch whose image frames came once goes in as they came (``replay.add_frames``). Where replay
    keeps image frames once (a frame pool), each sender's batches go in one by one against a budget
    of new frames: at most :data:`FRAMES_PER_ITEM` times ``frames_per_item`` (the new frames an
    honest item brings: one for a transition of stacked frames) per item it has sent, plus
    :data:`FRAME_SLACK`. Frames that share nothing (random bytes) would take every frame slot of
    every item and multiply replay's memory.

    With ``version_of`` (a store that keeps the model version of each item, an on-policy algorithm's
    :class:`~zmqrl.core.OnPolicyStore`), each batch's items go in with the version that function gives
    its message (``-1``: acted by another learner line).
    """

    def __init__(self, replay: ReplayBuffer, max_peers: int = 1024, idle_s: float = 600.0,
                 frames_per_item: int = 1, version_of: Callable[[Message], int] | None = None) -> None:
        self.replay = replay
        self.version_of = version_of
        self.rejected = 0  # batches replay refused (e.g. bad priorities)
        self.rejected_frames = 0  # batches refused for bringing more new frames than their sender's budget
        self.pooled = bool(getattr(replay, "frame_keys", ()))
        self.frames_per_item = max(1, int(frames_per_item))
        self._frames: PeerTable[list[int]] = PeerTable(lambda: [0, 0], max_peers, idle_s)  # sender: [items, frames]
        self.ratelog = RateLimitedLog(log, interval=10.0)

    def insert(self, batches: list[Arrived]) -> list[Arrived]:
        """Insert ``batches``; returns those that went in. Consecutive ones stored as given are joined into
        one ``add``; where that fails, each goes in on its own, so only a batch that does not fit is refused."""
        added: list[Arrived] = []
        for group in _groups(batches) if not self.pooled else [[m] for m in batches]:
            if len(group) > 1:
                arrays = {k: np.concatenate([m.msg.arrays[k] for m in group]) for k in group[0].msg.arrays}
                priorities = arrays.pop("priority", None)
                try:
                    self.replay.add(arrays, priorities=priorities, **self._versions(*group))
                except (ValueError, IndexError):
                    pass
                else:
                    added += group
                    continue
            added += [m for m in group if self._add(m)]
        return added

    def _add(self, item: Arrived) -> bool:
        """One batch into replay; one that does not fit is counted and logged."""
        arrays = dict(item.msg.arrays)
        priorities = arrays.pop("priority", None)
        sender = item.msg.sender
        budget = self._frames.admit(sender) if self.pooled else None
        n = item.rows
        max_new = None
        if budget is not None:
            max_new = max(0, FRAMES_PER_ITEM * self.frames_per_item * (budget[0] + n) + FRAME_SLACK - budget[1])
        try:
            if item.frames is not None:
                self.replay.add_frames(arrays, item.frames, item.indices, priorities=priorities, max_new_frames=max_new,
                                       fingerprints=item.fingerprints, **self._versions(item))
            else:
                self.replay.add(arrays, priorities=priorities, max_new_frames=max_new, **self._versions(item))
        except (ValueError, IndexError) as exc:
            if "new frames" in str(exc):
                self.rejected_frames += 1
            else:
                self.rejected += 1
            self.ratelog.warn(f"replay-{sender}", f"learner: batch from {sender} does not fit replay: {exc}")
            return False
        if budget is not None:
            budget[0] += n
            budget[1] += self.replay.new_frames
        return True

    def _versions(self, *items: Arrived) -> dict[str, Any]:
        """``versions=`` for a store that keeps each item's model version (nothing for replay)."""
        if self.version_of is None:
            return {}
        return {"versions": np.concatenate([np.full(item.rows, self.version_of(item.msg), dtype=np.int64)
                                            for item in items])}
