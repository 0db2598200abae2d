"""The learner's accounting of its actors (per name and incarnation), and the checks of what a
peer's meta may say.

:class:`PeerAccounts` counts each batch once it is in replay (the update loop's side: env steps,
episodes, policy lag, each actor's reported counters); what the intake keeps as messages arrive
(sequences, proxies' reports, refusals: :mod:`~zmqrl.roles.intake`) joins it in the summary.
Every table is a :class:`~zmqrl.wire.PeerTable` bounded by ``net.max_peers``: a peer beyond
it is refused (its batches dropped and counted), so memory stays flat under a flood of new
sender names, and the actors already known keep their counters.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zmqrl.wire import Message, PeerTable

LAG_CAP = 100_000  # policy lags above this are counted as this (a sender picks its version freely)
ACTOR_STATS = ("env_steps", "episodes", "blocked_s", "paused_s", "model_updates", "env_steps_per_s")
MAX_COUNT = 2**53  # counts, times and rates a peer reports are at most this (exact in a float)
MAX_EPISODE_LENGTH = 2**31
MAX_EPISODES = 10_000  # episodes one batch may report
MAX_RETURN = 1e15  # an episode's return, in absolute value
STEP_SLACK = 4096  # env steps an actor may report beyond the transitions it sent (still in its buffers), by default
MAX_INCARNATIONS = 4  # incarnations of one name whose env step counters are kept


def number(meta: dict[str, Any], key: str, default: float = 0.0, lo: float = -MAX_COUNT,
           hi: float = MAX_COUNT) -> float:
    """``meta[key]`` when it is a plain number in ``[lo, hi]`` (finite), else ``default`` (meta comes
    from the network: NaN, 1e400 and 10**400 all parse)."""
    value = meta.get(key, default)
    if type(value) is float or type(value) is int:  # (a bool is not a number here)
        return float(value) if lo <= value <= hi else default  # NaN fails both comparisons
    return default


_NUMBERS = frozenset((int, float))  # meta is parsed JSON: exact types (a bool is not a number here)


def _finite(x: Any, lo: float, hi: float) -> bool:
    return type(x) in _NUMBERS and lo <= x <= hi


def episodes(meta: dict[str, Any]) -> tuple[list[float], list[int]]:
    """Episode returns and lengths carried in a batch's meta (already checked by :func:`meta_problem`,
    or an evaluation report's), ignoring anything malformed."""
    ep = meta.get("episodes")
    if _episodes_problem(ep) is not None or ep is None:
        return [], []
    return [float(r) for r in ep["returns"]], [int(n) for n in ep["lengths"]]


def _episodes_problem(ep: Any) -> str | None:
    """What is wrong with an ``{"returns": [...], "lengths": [...]}`` report, or None."""
    if ep is None:
        return None
    if type(ep) is not dict:
        return "episodes is not an object"
    returns, lengths = ep.get("returns"), ep.get("lengths")
    if not (type(returns) is list and type(lengths) is list and len(returns) == len(lengths)):
        return "episodes.returns and episodes.lengths must be lists of one length"
    if len(returns) > MAX_EPISODES:
        return f"episodes lists {len(returns)} episodes (at most {MAX_EPISODES})"
    for r in returns:  # (loops: half the cost of all() over a generator, on every batch)
        if not _finite(r, -MAX_RETURN, MAX_RETURN):
            return f"episodes.returns holds {str(r)[:40]}, not a finite number"
    for n in lengths:
        if type(n) is not int or not 0 <= n <= MAX_EPISODE_LENGTH:
            return f"episodes.lengths holds {str(n)[:40]}, not a length"
    return None


def meta_problem(meta: dict[str, Any]) -> str | None:
    """What is wrong with a batch's meta, for a batch to be refused (None when it is fine).

    Checked for meaning, not only form: every number the learner uses must be finite and in range
    (an ``int(nan)`` or ``float(10**400)`` would end the learner).
    """
    problem = _episodes_problem(meta.get("episodes"))
    if problem is not None:
        return problem
    stats = meta.get("stats")
    if stats is not None:
        if type(stats) is not dict:
            return "stats is not an object"
        for key in ACTOR_STATS:
            value = stats.get(key)
            if value is not None and not _finite(value, 0, MAX_COUNT):
                return f"stats.{key} is {str(value)[:40]}, not a count in 0..2**53"
    explore = meta.get("explore")
    if explore is not None and not _finite(explore, 0, MAX_COUNT):
        return f"explore is {str(explore)[:40]}, not a finite number >= 0"
    return None


def plain(value: Any, depth: int = 3, max_keys: int = 64, max_chars: int = 256) -> Any:
    """A peer's report reduced to what is safe to keep and write out: finite numbers within
    ``2**53``, booleans, strings cut to ``max_chars``, and objects of at most ``max_keys`` such
    entries, ``depth`` deep; anything else (lists, NaN, 10**400) becomes None."""
    if type(value) is bool or value is None:
        return value
    if type(value) in _NUMBERS:
        return value if -MAX_COUNT <= value <= MAX_COUNT else None
    if type(value) is str:
        return value[:max_chars]
    if type(value) is dict and depth > 0:
        return {str(k)[:max_chars]: plain(v, depth - 1, max_keys, max_chars)
                for k, v in list(value.items())[:max_keys]}
    return None


@dataclass
class ActorAccount:
    """What the learner knows of one actor (border's ``ActorStat`` as the learner sees it)."""

    batches: int = 0
    transitions: int = 0
    incarnations: int = 0
    lag_sum: int = 0
    incarnation: str = ""
    # per incarnation (the last MAX_INCARNATIONS): [env steps counted, transitions it sent]
    steps: collections.OrderedDict[str, list[int]] = field(default_factory=collections.OrderedDict)
    steps_counted: int = 0  # env steps counted for this name over all its incarnations
    env_steps: float = 0.0
    episodes: float = 0.0
    blocked_s: float = 0.0
    paused_s: float = 0.0
    model_updates: float = 0.0
    env_steps_per_s: float = 0.0
    explore: float = 0.0
    host: str = ""  # the machine it runs on, as it reports it


class PeerAccounts:
    """Per-actor counters of the batches in replay, and policy lag."""

    def __init__(self, max_peers: int, idle_s: float = 600.0, step_slack: int = STEP_SLACK,
                 steps_per_item: int = 1) -> None:
        self.step_slack = step_slack
        self.steps_per_item = steps_per_item  # env steps an item stands for at most (sequence items: their period)
        self.actors: PeerTable[ActorAccount] = PeerTable(ActorAccount, max_peers, idle_s)
        self.lags: collections.deque[int] = collections.deque(maxlen=10_000)
        self.lag_counts: collections.Counter[int] = collections.Counter()
        self.other_line_batches = 0

    def account(self, msg: Message, n: int, version: int, incarnation: str) -> tuple[int, list[float], list[int]]:
        """Counters of a batch now in replay (its meta checked by :func:`meta_problem`); returns the env
        steps it reports as new and its episodes.

        ``version``/``incarnation`` are the learner's current model version and incarnation: the
        policy lag is measured only for batches acted by this learner's version line. Each of an
        actor's incarnations counts its own env steps (a restart starts at 0; two processes under
        one name do not reset each other's), and never more for the name in all than
        ``steps_per_item`` per item it sent plus ``step_slack`` (what its buffers may hold): an actor cannot
        claim steps it never took.
        """
        actor = self.actors.admit(msg.sender)
        if actor is None:  # forgotten since its sequence check (idle) and no room now
            return 0, [], []
        meta = msg.meta
        counter = actor.steps.get(msg.incarnation)
        if counter is None:
            counter = actor.steps[msg.incarnation] = [0, 0]
            while len(actor.steps) > MAX_INCARNATIONS:
                actor.steps.popitem(last=False)
            actor.incarnations += 1
        else:
            actor.steps.move_to_end(msg.incarnation)
        actor.incarnation = msg.incarnation
        raw = meta.get("stats")
        stats: dict[str, Any] = raw if isinstance(raw, dict) else {}
        counter[1] += n
        actor.transitions += n
        reported = int(number(stats, "env_steps", lo=0))
        most = actor.transitions * self.steps_per_item + self.step_slack
        new_steps = min(max(0, reported - counter[0]), most - actor.steps_counted)
        new_steps = max(0, new_steps)
        counter[0] += new_steps
        actor.steps_counted += new_steps
        if meta.get("model_inc") == incarnation and 0 <= msg.version <= version:
            lag = min(version - msg.version, LAG_CAP)
            self.lags.append(lag)
            self.lag_counts[lag] += 1
            actor.lag_sum += lag
        else:
            self.other_line_batches += 1
        actor.batches += 1
        for key in ACTOR_STATS:
            if key in stats:
                setattr(actor, key, number(stats, key))
        actor.explore = number(meta, "explore")
        host = stats.get("host")
        if isinstance(host, str):
            actor.host = host[:255]
        return new_steps, *episodes(meta)

    # --- reports ------------------------------------------------------------------------------
    def lag_stats(self) -> dict[str, float]:
        if not self.lags:
            return {}
        lags = np.fromiter(self.lags, dtype=np.int64)
        return {"mean": float(lags.mean()), "p50": float(np.percentile(lags, 50)),
                "p90": float(np.percentile(lags, 90)), "max": int(lags.max())}

    def perf(self, intake: dict[str, Any]) -> dict[str, float]:
        """Records of the actors and proxies (``intake``: the intake's summary, for what it counts)."""
        values = {f"perf/policy_lag_{k}": v for k, v in self.lag_stats().items()}
        lost = intake.get("lost_by_sender", {})
        for name, actor in self.actors.items():
            if actor.batches:
                values[f"actors/{name}/env_steps_per_s"] = actor.env_steps_per_s
            values[f"actors/{name}/lost"] = float(lost.get(name, 0))
        for name, proxy in intake.get("proxies", {}).items():
            values[f"proxies/{name}/forwarded"] = number(proxy, "forwarded")
            values[f"proxies/{name}/bytes_per_s"] = number(proxy, "bytes_per_s")
        return values

    def actors_summary(self, intake: dict[str, Any]) -> dict[str, dict[str, Any]]:
        lost, dropped = intake.get("lost_by_sender", {}), intake.get("dropped_by_sender", {})
        refused = intake.get("refused_models", {})
        out = {}
        for name, a in self.actors.items():
            entry = dict(vars(a))  # its fields are plain values: asdict's deep copy cost 5 ms per summary at 256 actors
            del entry["steps"]
            # an incarnation id lets whoever knows it speak for the actor (without CURVE): shown in part
            entry["incarnation"] = a.incarnation[:8]
            entry["lost"], entry["dropped_old"] = lost.get(name, 0), dropped.get(name, 0)
            entry["refused_model"] = refused.get(name, "")
            entry["lag_mean"] = a.lag_sum / max(a.batches, 1)
            entry["last_seen"] = time.time() - (self.actors.last_seen_s(name) or 0.0)
            out[name] = entry
        return out

    def summary(self, intake: dict[str, Any]) -> dict[str, Any]:
        return {
            "policy_lag": {**self.lag_stats(), "histogram": {str(k): v for k, v in sorted(self.lag_counts.items())},
                           "other_line_batches": self.other_line_batches},
            "actors": self.actors_summary(intake),
            "proxies": intake.get("proxies", {}),
        }
