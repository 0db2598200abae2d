"""The learner's accounting of its peers: actors (per name and incarnation) and proxies.

Every table is a :class:`~zmqrl.wire.PeerTable` bounded by ``net.max_peers``: a peer beyond
it is refused (its batches dropped and counted), so memory stays flat under a flood of new
sender names, and the actors already known keep their counters.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from zmqrl.wire import Message, PeerTable, SequenceTracker

LAG_CAP = 100_000  # policy lags above this are counted as this (a sender picks its version freely)
ACTOR_STATS = ("env_steps", "episodes", "blocked_s", "paused_s", "model_updates", "env_steps_per_s")


def number(meta: dict[str, Any], key: str, default: float = 0.0) -> float:
    """``meta[key]`` when it is a plain number, else ``default`` (meta comes from the network)."""
    value = meta.get(key, default)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


_NUMBERS = frozenset((int, float))  # meta is parsed JSON: exact types (a bool is not a number here)


def episodes(meta: dict[str, Any]) -> tuple[list[float], list[int]]:
    """Episode returns and lengths carried in a batch's meta, ignoring anything malformed."""
    ep = meta.get("episodes")
    if type(ep) is not dict:
        return [], []
    returns, lengths = ep.get("returns"), ep.get("lengths")
    if not (type(returns) is list and type(lengths) is list and len(returns) == len(lengths)):
        return [], []
    for x in returns + lengths:  # (a loop: half the cost of all() over a generator, on every batch)
        if type(x) not in _NUMBERS:
            return [], []
    return [float(r) for r in returns], [int(n) for n in lengths]


@dataclass
class ActorAccount:
    """What the learner knows of one actor (border's ``ActorStat`` as the learner sees it)."""

    batches: int = 0
    transitions: int = 0
    lost: int = 0
    dropped_old: int = 0
    incarnations: int = 0
    lag_sum: int = 0
    incarnation: str = ""
    incarnation_steps: int = 0  # env steps this incarnation has reported (its counter starts at 0)
    env_steps: float = 0.0
    episodes: float = 0.0
    blocked_s: float = 0.0
    paused_s: float = 0.0
    model_updates: float = 0.0
    env_steps_per_s: float = 0.0
    explore: float = 0.0
    host: str = ""  # the machine it runs on, as it reports it
    refused_model: str = ""  # why it refused the learner's model (config mismatch), if it did


class PeerAccounts:
    """Sequence checks, per-actor and per-proxy counters, and policy lag."""

    def __init__(self, max_peers: int, idle_s: float = 600.0) -> None:
        self.sequences = SequenceTracker(max_peers, idle_s)
        self.actors: PeerTable[ActorAccount] = PeerTable(ActorAccount, max_peers, idle_s)
        self.proxies: PeerTable[dict[str, Any]] = PeerTable(dict, max_peers, idle_s)
        self.lags: collections.deque[int] = collections.deque(maxlen=10_000)
        self.lag_counts: collections.Counter[int] = collections.Counter()
        self.other_line_batches = 0
        self.mismatches = 0  # peers that refused the learner's model as not fitting their config

    def in_sequence(self, msg: Message) -> bool:
        """Sequence check per sender incarnation: counts lost batches; False for a repeat, an
        older one, or a sender refused for lack of room."""
        accept, lost = self.sequences.observe(msg.sender, msg.incarnation, msg.seq)
        actor = self.actors.admit(msg.sender) if accept or msg.sender in self.actors else None
        if actor is None:
            return False
        actor.lost += lost
        if not accept:
            actor.dropped_old += 1
        return accept

    def account(self, msg: Message, n: int, version: int, incarnation: str) -> tuple[int, list[float], list[int]]:
        """Counters of a batch now in replay; returns the env steps it reports as new and its episodes.

        ``version``/``incarnation`` are the learner's current model version and incarnation: the
        policy lag is measured only for batches acted by this learner's version line.
        """
        actor = self.actors.admit(msg.sender)
        if actor is None:  # forgotten since its sequence check (idle) and no room now
            return 0, [], []
        meta = msg.meta
        if actor.incarnation != msg.incarnation:
            actor.incarnation, actor.incarnation_steps = msg.incarnation, 0
            actor.incarnations += 1
        raw = meta.get("stats")
        stats: dict[str, Any] = raw if isinstance(raw, dict) else {}
        steps = int(number(stats, "env_steps"))
        new_steps = max(0, steps - actor.incarnation_steps)
        actor.incarnation_steps = max(steps, actor.incarnation_steps)
        if meta.get("model_inc") == incarnation and 0 <= msg.version <= version:
            lag = min(version - msg.version, LAG_CAP)
            self.lags.append(lag)
            self.lag_counts[lag] += 1
            actor.lag_sum += lag
        else:
            self.other_line_batches += 1
        actor.batches += 1
        actor.transitions += n
        for key in ACTOR_STATS:
            if key in stats:
                setattr(actor, key, number(stats, key))
        actor.explore = number(meta, "explore")
        host = stats.get("host")
        if isinstance(host, str):
            actor.host = host[:255]
        return new_steps, *episodes(meta)

    def proxy_stats(self, msg: Message) -> None:
        table = self.proxies.admit(msg.sender)
        if table is not None:
            table.clear()
            table.update(msg.meta)
            table["incarnation"] = msg.incarnation

    def mismatch(self, msg: Message) -> str | None:
        """A peer's report that the learner's model does not fit its config; the reason, if it is one."""
        reason = msg.meta.get("refused_model")
        if not isinstance(reason, str):
            return None
        self.mismatches += 1
        actor = self.actors.admit(msg.sender)
        if actor is not None:
            actor.refused_model = reason[:1000]
        return reason

    # --- reports ------------------------------------------------------------------------------
    def lag_stats(self) -> dict[str, float]:
        if not self.lags:
            return {}
        lags = np.fromiter(self.lags, dtype=np.int64)
        return {"mean": float(lags.mean()), "p50": float(np.percentile(lags, 50)),
                "p90": float(np.percentile(lags, 90)), "max": int(lags.max())}

    def perf(self) -> dict[str, float]:
        values = {f"perf/policy_lag_{k}": v for k, v in self.lag_stats().items()}
        for name, actor in self.actors.items():
            if actor.batches:
                values[f"actors/{name}/env_steps_per_s"] = actor.env_steps_per_s
            values[f"actors/{name}/lost"] = float(actor.lost)
        for name, proxy in self.proxies.items():
            values[f"proxies/{name}/forwarded"] = number(proxy, "forwarded")
            values[f"proxies/{name}/bytes_per_s"] = number(proxy, "bytes_per_s")
        return values

    def actors_summary(self) -> dict[str, dict[str, Any]]:
        out = {}
        for name, a in self.actors.items():
            entry = dict(vars(a))  # its fields are plain values: asdict's deep copy cost 5 ms per summary at 256 actors
            entry["lag_mean"] = a.lag_sum / max(a.batches, 1)
            entry["last_seen"] = time.time() - (self.actors.last_seen_s(name) or 0.0)
            out[name] = entry
        return out

    def proxies_summary(self) -> dict[str, dict[str, Any]]:
        return {name: {**p, "last_seen": time.time() - (self.proxies.last_seen_s(name) or 0.0)}
                for name, p in self.proxies.items()}

    def summary(self) -> dict[str, Any]:
        actors = [a for _, a in self.actors.items()]
        return {
            "policy_lag": {**self.lag_stats(), "histogram": {str(k): v for k, v in sorted(self.lag_counts.items())},
                           "other_line_batches": self.other_line_batches},
            "batches_lost": sum(a.lost for a in actors),
            "batches_dropped_old": sum(a.dropped_old for a in actors),
            "peers_refused": self.sequences.refused + self.proxies.refused,
            "refused_names": sorted(self.sequences.refused_names | self.proxies.refused_names)[:8],
            "config_mismatches": self.mismatches,
            "actors": self.actors_summary(),
            "proxies": self.proxies_summary(),
        }
