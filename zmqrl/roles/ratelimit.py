"""The learner's rate limiter: samples per inserted transition kept within configured bounds.

``trainer.max_samples_per_insert`` makes the learner wait for data when it has sampled each
transition that often on average (it would overfit a small replay); ``trainer.min_samples_per_insert``
asks actors to pause when data comes in faster than the learner uses it (on a shared CPU the
learner then gets the cores). While the learner trains with that bound on, each control message
it sends with a new model version (and while it waits for data) also grants every actor an
allowance (:meth:`SamplesPerInsert.allowance`): a pause reaches actors only once the learner's
loop comes round to ask for it, and one slow iteration (two
busy actors and the learner's threads on two cores can stretch one update to a third of a
second) would otherwise let them fill replay with thousands of transitions from an early policy,
which the learner then spends thousands of updates on. Its counters are part of the learner's checkpoint, so a resumed
learner continues the same ratio instead of starting over at zero inserts.
"""

from __future__ import annotations

import collections
import math
import threading
from dataclasses import dataclass
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

    def update_pause(self, opt_steps: int, warm: bool, full: bool = False) -> bool:
        """Decide whether actors should pause now; True when that changed (tell them at once).

        Warm but the agent still loading also counts (0 samples per insert): actors need not fill
        replay with data nobody trains on, and their CPU is better spent loading torch. ``full``: the
        learner's store asks for a pause of its own (an on-policy FIFO at its capacity: back-pressure).
        """
        self.warm = warm
        pause = full or (warm and self.min_ratio > 0 and self.ratio(opt_steps) < self.min_ratio)
        if pause == self.paused:
            return False
        self.paused = pause
        self.pauses += pause
        return True

    def allowance(self) -> int | None:
        """Transitions each actor may make per grant it receives while the learner trains, or None
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


@dataclass
class _Account:
    """The learner's copy of one sender's allowance (as :class:`~zmqrl.roles.fit.Allowance` keeps it)."""

    made: int = 0  # transitions taken in from it while allowances were in force
    quota: float | None = None  # what it may reach, from the grants its batches say it applied
    last: int = 0  # the newest grant it applied
    share: float = 1.0  # of each grant's allowance (halved for each grant it overran in)
    overran: int = -1  # the last grant number in force when it overran


class Allowances:
    """The allowance enforced where the data arrives: each sender inserts only what the learner granted it.

    While the learner trains with ``min_samples_per_insert``, every control message it makes with a
    new model version, or while it waits for data, is a grant
    of :meth:`SamplesPerInsert.allowance` transitions, numbered. An actor applies each grant it
    receives once, none while paused (:class:`~zmqrl.roles.fit.Allowance`), and every batch lists
    the last grants it applied. Batches from one sender arrive in the order they were made, so the
    transitions taken in from it before the first batch that lists a grant are at most what it had
    made when it applied that grant (batches lost on the way make them fewer): the learner applies
    each grant there and finds an honest actor always within its account. A batch is refused when
    it lists a grant the learner never made or made while actors were paused; when it lists none while its sender
    has no grant yet beyond the first ``unstamped`` transitions (batches made before the
    allowance came into force, still on their way); or when its sender's account is spent.
    A sender that overruns also loses half its share of every later grant (down to
    :data:`MIN_SHARE`) and wins it back grant by grant once it stops: one that ignores pauses can
    insert a sliver, not push the samples-per-insert ratio down and keep everyone else paused.
    With no allowance in force (warm-up, the limiter off) every batch is taken.

    Grants are made where control is sent (the learner's publisher) and taken where batches
    arrive (its intake), two threads: each call holds the table's lock.
    """

    MIN_SHARE = 1 / 64
    PAUSED_KEPT = 100_000  # grant numbers remembered as paused (older ones are refused as unknown)

    def __init__(self, max_peers: int, idle_s: float, unstamped: int) -> None:
        from zmqrl.wire import PeerTable

        self._accounts: PeerTable[_Account] = PeerTable(_Account, max_peers, idle_s)
        self.unstamped = unstamped
        self.amount: int | None = None  # transitions per grant; None: no allowance in force
        self.grants = 0  # grants made (the newest's number)
        self._paused: collections.deque[int] = collections.deque()  # grant numbers made while paused
        self._paused_set: set[int] = set()
        self.refused_batches = 0
        self.refused_transitions = 0
        self._lock = threading.Lock()

    def grant(self, amount: int | None, paused: bool = False) -> int | None:
        """A control message is being encoded with ``amount`` as its allowance (None: none in force); the
        grant's number, to go into its meta (None without an allowance)."""
        with self._lock:
            return self._grant(amount, paused)

    def _grant(self, amount: int | None, paused: bool) -> int | None:
        self.amount = amount
        if amount is None:
            return None
        self.grants += 1
        if paused:
            self._paused.append(self.grants)
            self._paused_set.add(self.grants)
            while self._paused and self._paused[0] <= self.grants - self.PAUSED_KEPT:
                self._paused_set.discard(self._paused.popleft())
        return self.grants

    def take(self, sender: str, n: int, stamped: Any = None) -> bool:
        """Whether ``sender`` may insert a batch of ``n`` transitions that lists the grants ``stamped``
        (its meta's ``grants``) as applied since its previous batch; counted against it if so."""
        with self._lock:
            return self._take(sender, n, stamped)

    def _take(self, sender: str, n: int, stamped: Any) -> bool:
        amount = self.amount
        if amount is None:
            return True
        account = self._accounts.admit(sender)
        if account is None:  # no room to keep its account: the sequence check has refused it already
            return True
        if stamped:
            for number in stamped if type(stamped) is list else [stamped]:
                if type(number) is not int or number > self.grants:
                    return self._refuse(account, n)
                if number <= account.last:
                    continue  # applied already
                if number in self._paused_set or number <= self.grants - self.PAUSED_KEPT:
                    return self._refuse(account, n)
                fresh = amount * account.share
                account.quota = account.made + (fresh if account.quota is None else
                                                 min(2.0 * amount, account.quota - account.made + fresh))
                account.last = number
                if account.overran < number - 1:  # a whole grant without overrunning: its share comes back
                    account.share = min(1.0, account.share * 2.0)
        limit = self.unstamped if account.quota is None else account.quota
        if account.made >= limit:
            return self._refuse(account, n)
        account.made += n
        return True

    def _refuse(self, account: _Account, n: int) -> bool:
        if account.overran < self.grants:
            account.share = max(self.MIN_SHARE, account.share / 2)
            account.overran = self.grants
        self.refused_batches += 1
        self.refused_transitions += n
        return False
