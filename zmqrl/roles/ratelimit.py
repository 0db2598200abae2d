"""The learner's rate limiter: samples per inserted transition kept within configured bounds.

``trainer.max_samples_per_insert`` makes the learner wait for data when it has sampled each
transition that often on average (it would overfit a small replay); ``trainer.min_samples_per_insert``
asks actors to pause when data comes in faster than the learner uses it (on a shared CPU the
learner then gets the cores). While the learner trains with that bound on, each model it
publishes also grants every actor an allowance (:meth:`SamplesPerInsert.allowance`): a pause
reaches actors only once the learner's loop comes round to send it, and one slow iteration (two
busy actors and the learner's threads on two cores can stretch one update to a third of a
second) would otherwise let them fill replay with thousands of transitions from an early policy,
which the learner then spends thousands of updates on. Its counters are part of the learner's checkpoint, so a resumed
learner continues the same ratio instead of starting over at zero inserts.
"""

from __future__ import annotations

import math
from typing import Any

from zmqrl.config import TrainerConfig


class SamplesPerInsert:
    """Samples (optimisation steps × batch size) per transition inserted into replay."""

    def __init__(self, tc: TrainerConfig, batch_size: int) -> None:
        self.min_ratio, self.max_ratio = tc.min_samples_per_insert, tc.max_samples_per_insert
        self.batch_size = batch_size
        self.sync_interval = tc.sync_interval
        self.warm = False  # replay holds trainer.warmup transitions (as the last update_pause saw it)
        self.inserted = 0  # transitions inserted over the whole run, resumes included
        self.paused = False  # actors asked to pause
        self.pauses = 0

    def ratio(self, opt_steps: int) -> float:
        return opt_steps * self.batch_size / max(self.inserted, 1)

    def throttled(self, opt_steps: int) -> bool:
        """Whether the learner should wait for data before its next optimisation step."""
        return self.max_ratio > 0 and self.ratio(opt_steps) > self.max_ratio

    def update_pause(self, opt_steps: int, warm: bool) -> bool:
        """Decide whether actors should pause now; True when that changed (tell them at once).

        Warm but the agent still loading also counts (0 samples per insert): actors need not fill
        replay with data nobody trains on, and their CPU is better spent loading torch.
        """
        self.warm = warm
        pause = warm and self.min_ratio > 0 and self.ratio(opt_steps) < self.min_ratio
        if pause == self.paused:
            return False
        self.paused = pause
        self.pauses += pause
        return True

    def allowance(self) -> int | None:
        """Transitions each actor may make per model it receives while the learner trains, or None
        (no bound: the limiter is off, or replay is still warming up and needs all the data actors give).

        Twice what the learner uses between two publications at ``min_samples_per_insert``
        (``sync_interval`` updates of ``batch_size`` samples), so one actor alone keeps it fed
        and the pause, not the allowance, sets the ratio while models come on time.
        """
        if not (self.warm and self.min_ratio > 0):
            return None
        return max(1, math.ceil(2 * self.sync_interval * self.batch_size / self.min_ratio))

    def state_dict(self) -> dict[str, Any]:
        return {"inserted": self.inserted, "pauses": self.pauses}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inserted = int(state.get("inserted", 0))
        self.pauses = int(state.get("pauses", 0))


class Allowances:
    """The allowance enforced where the data arrives: each sender may insert what the learner granted it.

    Every model the learner encodes while it trains with ``min_samples_per_insert`` grants each
    actor :meth:`SamplesPerInsert.allowance` more transitions (the model's ``grant`` number tells
    actors which grants they have seen; re-sends of one model grant nothing). An honest actor makes
    at most that much per grant it receives and then holds; one that ignores the pause or the
    allowance would otherwise fill replay with its data and, by pushing the samples-per-insert
    ratio down, keep every honest actor paused. Here each sender's credit grows by the allowance
    per grant (up to two grants' worth: a sender that was idle does not save up; a new sender
    starts with one) and each of its batches spends it; a batch that finds the credit spent is
    refused. One batch may overdraw the credit (an actor holds only once a whole batch is made).

    A sender refused for overrunning its credit also has its share halved (down to
    :data:`MIN_SHARE`) for each grant in which it overran, and doubled back for each grant in
    which it did not: a sender that keeps flooding gets a sliver of an allowance, so what it does
    insert cannot push the ratio down and pause everyone else. With no allowance in force
    (warm-up, the limiter off) every batch is taken.
    """

    MIN_SHARE = 1 / 64

    def __init__(self, max_peers: int, idle_s: float) -> None:
        from zmqrl.wire import PeerTable

        # per sender: [credit, grant seen, share, last grant it overran in]
        self._credit: PeerTable[list[float]] = PeerTable(lambda: [0.0, -1, 1.0, -1], max_peers, idle_s)
        self.amount: int | None = None  # transitions per grant; None: no allowance in force
        self.grants = 0
        self.refused_batches = 0
        self.refused_transitions = 0

    def grant(self, amount: int | None) -> int:
        """One more grant of ``amount`` transitions to every sender (None: no allowance); its number."""
        self.amount = amount
        if amount is not None:
            self.grants += 1
        return self.grants

    def take(self, sender: str, n: int) -> bool:
        """Whether ``sender`` may insert a batch of ``n`` transitions now (spending its credit if so)."""
        amount = self.amount
        if amount is None:
            return True
        entry = self._credit.admit(sender)
        if entry is None:  # no room to track it: the sequence check has refused it already
            return True
        credit, seen, share, overran = entry
        new_grants = self.grants - int(seen)
        if seen < 0:
            credit = float(amount)
        elif new_grants > 0:
            if overran < seen:  # no overrun in the grants since it was last seen: its share comes back
                share = min(1.0, share * 2.0 ** new_grants)
            credit = min(2.0 * amount, credit + share * amount * new_grants)
        entry[1] = self.grants
        if credit <= 0:
            if overran < self.grants:
                share = max(self.MIN_SHARE, share / 2)
            entry[0], entry[2], entry[3] = credit, share, self.grants
            self.refused_batches += 1
            self.refused_transitions += n
            return False
        entry[0], entry[2] = credit - n, share
        return True
