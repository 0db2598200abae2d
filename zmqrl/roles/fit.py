"""Whether a role's config fits the learner's: what the learner announces, and what a role says
when it does not fit (naming both sides and the config key to change).

The learner puts :func:`task_signature` in the meta of every model message. An actor or an
evaluator compares it with its own before loading the parameters; a difference, or parameters
whose names or shapes do not fit its network, is a config mistake that retrying cannot mend:
the role reports it to the learner, logs it and exits 2.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from zmqrl.acting import Task
from zmqrl.config import to_dict

EXIT_CONFIG_MISMATCH = 2


def describe_space(space: gym.spaces.Space) -> list[Any]:
    """A space as JSON-able data: kind, then shape and dtype (Box) or size (Discrete)."""
    if isinstance(space, gym.spaces.Discrete):
        return ["Discrete", int(space.n)]
    if isinstance(space, gym.spaces.Box):
        return ["Box", [int(d) for d in space.shape], space.dtype.str if space.dtype is not None else ""]
    return [type(space).__name__]


def task_signature(task: Task) -> dict[str, Any]:
    """What must agree between the learner and the roles that act for it."""
    return {"algo": task.cfg.agent.algo, "env_id": task.cfg.env.id, "obs": describe_space(task.obs_space),
            "action": describe_space(task.action_space), "agent": to_dict(task.cfg)["agent"]}


_FIELDS = (("algo", "agent.algo"), ("env_id", "env.id"), ("obs", "env.id, env.wrappers or env.kwargs"),
           ("action", "env.id or env.kwargs"))


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
