"""Whether a role's config fits the learner's: what the learner announces, and what a role says
when it does not fit (naming both sides and the config key to change).

The learner puts :func:`task_signature` in the meta of every model message (and its
:func:`signature_digest` in every control message). An actor or an evaluator compares it with
its own before loading the parameters; a difference, or parameters
whose names or shapes do not fit its network, is a config mistake that retrying cannot mend:
the role reports it to the learner, logs it and exits 2.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from zmqrl.config import to_dict
from zmqrl.core import Policy
from zmqrl.run import user_callables
from zmqrl.run.acting import Task
from zmqrl.wire import Message

EXIT_CONFIG_MISMATCH = 2


def describe_space(space: gym.spaces.Space) -> list[Any]:
    """A space as JSON-able data: kind, then shape and dtype (Box) or size (Discrete)."""
    if isinstance(space, gym.spaces.Discrete):
        return ["Discrete", int(space.n)]
    if isinstance(space, gym.spaces.Box):
        return ["Box", [int(d) for d in space.shape], space.dtype.str if space.dtype is not None else ""]
    return [type(space).__name__]


def task_signature(task: Task) -> dict[str, Any]:
    """What must agree between the learner and the roles that act for it: with callables from Python
    (``env.fn``, ``env.wrappers_fn``, ``agent.network_fn``) the sha256 of each file, and an env from
    ``env.fn`` is known by its file's hash, not by ``env.id`` (then only a label)."""
    return {"algo": task.cfg.agent.algo, "env_id": None if task.cfg.env.fn else task.cfg.env.id,
            "obs": describe_space(task.obs_space), "action": describe_space(task.action_space),
            "agent": to_dict(task.cfg)["agent"], **user_callables.hashes(task.cfg)}


_FIELDS = (("algo", "agent.algo"), ("env_id", "env.id"), ("obs", "env.id, env.wrappers or env.kwargs"),
           ("action", "env.id or env.kwargs"), ("env_fn", "env.fn (the sha256 of its file)"),
           ("wrappers_fn", "env.wrappers_fn (the sha256 of its file)"),
           ("network_fn", "agent.network_fn (the sha256 of its file)"))


def signature_digest(signature: dict[str, Any]) -> str:
    """A short digest of what must agree for a role to act for a learner (the fields :func:`misfit`
    compares): the learner's control messages carry it, so a role that does not fit knows at once."""
    text = json.dumps([signature.get(key) for key, _ in _FIELDS], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def misfit(mine: dict[str, Any], theirs: Any) -> str | None:
    """Why a config with signature ``mine`` cannot act for a learner announcing ``theirs``, or None.

    An older learner that announces nothing is given the benefit of the doubt (its parameters
    are still checked name by name and shape by shape).
    """
    if not isinstance(theirs, dict):
        return None
    diffs = [f"{what}: {mine[key]!r} here, {theirs.get(key)!r} at the learner"
             for key, what in _FIELDS if theirs.get(key) != mine[key]]
    if not diffs:
        return None
    return "; ".join(diffs)


def parameter_misfit(mine: dict[str, Any], theirs: Any, error: Exception) -> str:
    """Parameters that do not fit the local network: the error, and the ``agent.*`` keys that differ."""
    agent_mine = mine.get("agent", {})
    agent_theirs = theirs.get("agent", {}) if isinstance(theirs, dict) else {}
    keys = [f"agent.{k}: {agent_mine[k]!r} here, {agent_theirs.get(k)!r} at the learner"
            for k in agent_mine if isinstance(agent_theirs, dict) and k in agent_theirs
            and agent_theirs[k] != agent_mine[k]]
    hint = "; ".join(keys) if keys else "the network settings of the agent section (agent.*)"
    return f"its parameters do not fit this config's network ({error}); differing keys: {hint}"


def load_if_fits(policy: Policy, mine: dict[str, Any], msg: Message) -> str | None:
    """Load the learner's model into ``policy`` if it fits this config; else say why (and load nothing)."""
    theirs = msg.meta.get("task")
    problem = misfit(mine, theirs)
    if problem is None:
        try:
            policy.load_params(msg.arrays)
        except ValueError as exc:
            problem = parameter_misfit(mine, theirs, exc)
    if problem is None:
        return None
    return f"the learner's model (version {msg.version}) does not fit this config: {problem}"


def learner_done(msg: Message) -> str:
    """The stop reason when a control message says the run is over; "" otherwise."""
    done = msg.meta.get("done")
    return done if isinstance(done, str) else ""


def hold_limit(meta: Mapping[str, Any], made: int, quota: int | None = None) -> int | None:
    """How many transitions in all an actor that has made ``made`` may reach before it holds, as a
    control message's meta says: while the learner trains, its ``allow`` more than the limit so far (``quota``,
    the limit from this learner's previous grant; ``made`` when there is none), but never more than
    two grants ahead of ``made``; while the learner loads torch, its start-up ``quota``; else None
    (no bound). :class:`Allowance` applies it once per grant."""
    allow = _count(meta.get("allow"))
    if allow is not None:
        return made + (allow if quota is None else min(2 * allow, quota - made + allow))
    return _count(meta.get("quota"))


MAX_STAMPED_GRANTS = 4  # grants a batch lists: the last ones applied (three reach the cap from any state)


class Allowance:
    """An actor's side of the learner's rate limiter, as control from the learner line in use says it.

    ``pause``: hold. ``allow`` with a ``grant`` number (control made while the learner trains):
    the actor may make that many more transitions; each grant counts once (control sent again grants
    nothing) and none counts while paused. Every batch lists the last grants applied (:meth:`stamp`;
    a batch lost on the way loses none), so the learner can keep the same account of each actor
    (:class:`~zmqrl.roles.ratelimit.Allowances`) and refuse what an actor makes beyond it.
    """

    def __init__(self) -> None:
        self.paused = False
        self.quota: int | None = None  # hold once ``made`` reaches this, until control lifts or moves it
        self._seen: tuple[str, Any] = ("", None)  # the last (incarnation, grant) looked at
        self._from: str | None = None  # the learner incarnation whose grants ``quota`` comes from
        self._applied: list[int] = []  # the last grants applied (numbers of this learner line)

    def observe(self, msg: Message, made: int) -> None:
        """Take the control fields of ``msg``, control from the learner line in use."""
        meta = msg.meta
        self.paused = meta.get("pause") is True
        grant = (msg.incarnation, meta.get("grant"))
        if self.paused or (grant[1] is not None and grant == self._seen):
            return
        self._seen = grant
        allow = _count(meta.get("allow"))
        self.quota = hold_limit(meta, made, self.quota if self._from == msg.incarnation else None)
        number = _count(grant[1])
        if self._from != msg.incarnation:
            self._applied = []
        self._from = msg.incarnation if allow is not None else None
        if allow is not None and number is not None:
            self._applied = [*self._applied, number][-MAX_STAMPED_GRANTS:]

    def reached(self, made: int) -> bool:
        """Whether an actor that has made ``made`` transitions must hold now (paused, or its allowance made)."""
        return self.paused or (self.quota is not None and made >= self.quota)

    def stamp(self) -> list[int]:
        """The last grants applied, oldest first: what a batch finished now carries in ``meta["grants"]``."""
        return list(self._applied)


def _count(value: object) -> int | None:
    """A non-negative int, or None: absent, or not a count (a bool, a float, a negative number)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
