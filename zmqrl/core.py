"""The small interfaces at the seams of zmqrl.

A *transition batch* is a ``dict[str, numpy.ndarray]`` with a common leading length:
``obs``, ``action``, ``reward`` (n-step discounted return), ``next_obs`` and ``discount``
(``gamma**k`` when the target bootstraps from ``next_obs``, ``0`` when the episode terminated).
Optional keys: ``priority`` (initial priorities), and, on sampled batches, ``indices`` and
``weights`` (importance weights). Every part of the system passes batches in this one form.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

Batch = dict[str, np.ndarray]
Params = dict[str, np.ndarray]


class Policy(Protocol):
    """What an actor needs: observations in, actions out, and a way to take new parameters.

    Actions are what the env takes (for a Box, within its bounds) in the dtype of the
    algorithm's batch spec; a policy may be numpy or torch inside, but speaks numpy.
    """

    def act(self, obs: np.ndarray, explore: float | np.ndarray) -> np.ndarray:
        """Exploring actions for a batch of observations; ``explore`` is the value of the
        algorithm's :class:`~zmqrl.agents.base.Exploration` (scalar or one per row)."""
        ...

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Deterministic actions (evaluation, ``zmqrl enjoy``)."""
        ...

    def load_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Replace the policy parameters with named arrays from :meth:`Agent.params`; names and
        shapes must match exactly (ValueError otherwise)."""
        ...

    def priorities(self, batch: Mapping[str, np.ndarray]) -> np.ndarray | None:
        """Initial replay priorities for transitions, computed locally; None where the algorithm
        has none (the learner then gives new transitions the maximum priority)."""
        ...


@runtime_checkable
class RecurrentPolicy(Protocol):
    """Optional, on top of :class:`Policy`: a policy whose actions depend on a recurrent state per env.

    The caller owns the state and hands it in with every step: one float32 array ``(n, *shape)``
    for ``n`` envs, one row per env (R2D2's LSTM: ``(n, 2, lstm_size)``, ``[:, 0]`` the hidden
    state h and ``[:, 1]`` the cell c). One array, not a pair: an acting loop indexes it by env
    (``state[env_ids]``), resets the envs whose episode ended (``state[ended] = initial_state(k)``),
    hands it to the sequence adder and saves it with one operation each, and h and c never
    travel apart. An env's state at an episode's first step is its row of :meth:`initial_state`;
    the sequence adder stores, with each item, the state its env held before the item's first step.

    :meth:`Policy.act` and :meth:`Policy.greedy` of such a policy raise TypeError: acting without a
    state would silently forget the past.
    """

    def initial_state(self, n: int) -> np.ndarray:
        """The state of ``n`` envs at an episode's start (zeros for an LSTM)."""
        ...

    def act_recurrent(self, obs: np.ndarray, explore: float | np.ndarray,
                      state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exploring actions for one observation per env from each env's ``state``, and the state after
        it (a new array); ``explore`` as for :meth:`Policy.act`."""
        ...

    def greedy_recurrent(self, obs: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Deterministic actions (evaluation, ``zmqrl enjoy``) and the state after them."""
        ...


@runtime_checkable
class ReusesActingValues(Protocol):
    """Optional, on top of :class:`Policy`: initial priorities from what acting computed anyway.

    Each :meth:`Policy.act` call keeps, per row, the values priorities need of that observation
    (DQN: ``Q(s, .)``). The acting loop pairs, for every n-step transition, the values of its
    ``obs`` (kept when acting on it) with those of its ``next_obs`` (kept when acting on it one
    step later, or from :meth:`values` for a final observation never acted on), so priorities
    take no forward pass of their own. By definition
    ``priorities(batch) == priorities_from_values(batch, values(obs), values(next_obs))``.
    """

    def acted_values(self) -> np.ndarray:
        """The values of the observations of the last :meth:`Policy.act` call, one row each."""
        ...

    def values(self, obs: np.ndarray) -> np.ndarray:
        """The same values for observations (one forward pass)."""
        ...

    def priorities_from_values(self, batch: Mapping[str, np.ndarray], first: np.ndarray,
                               boot: np.ndarray) -> np.ndarray:
        """Initial priorities of ``batch`` from the values of its ``obs`` (``first``) and of its
        ``next_obs`` (``boot``; any finite values on rows whose ``discount`` is 0)."""
        ...


@runtime_checkable
class RecordsLogProbs(Protocol):
    """Optional, on top of :class:`Policy`: the behaviour log-probabilities of the actions it took.

    An on-policy algorithm's policy (IMPALA's, APPO's) keeps, per row of its last :meth:`Policy.act`
    call, ``log mu(a | s)`` of the action it drew; the acting loop stores it with each step of a
    segment, and the learner's V-trace weighs the step by ``pi(a | s) / mu(a | s)``.
    """

    def acted_log_probs(self) -> np.ndarray:
        """float32, one per row of the last :meth:`Policy.act` call: the log-probability (for a continuous
        action, the log-density) of the action taken."""
        ...


class Agent(Policy, Protocol):
    """What a learner needs on top of a policy: updates, parameters to publish, persistence.

    An agent may also implement :class:`DefersUpdates`; the learner then reads each step's results
    one step later, while the device runs the step (see there).
    """

    def update(self, batch: Mapping[str, np.ndarray]) -> tuple[dict[str, float], np.ndarray | None]:
        """One optimisation step; returns scalar metrics and new priorities (or None)."""
        ...

    def params(self) -> Params:
        """The policy parameters an actor needs, as named numpy arrays (CPU, contiguous)."""
        ...

    def adopt_initial(self, params: Mapping[str, np.ndarray]) -> None:
        """Start from version-0 policy parameters drawn by ``Algorithm.initial_params`` (target
        networks, where they copy the policy, copy these too)."""
        ...

    def state_dict(self) -> dict:
        """Everything needed to resume training: networks, optimiser, counters, RNG state."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict`."""
        ...


class PendingUpdate(Protocol):
    """An optimisation step already applied to the agent (or queued on its device) whose metrics and
    priorities have not been read yet (:class:`zmqrl.agents.torch_util.PendingStep`)."""

    def done(self) -> bool:
        """Whether :meth:`result` would return without waiting for the device."""
        ...

    def result(self) -> tuple[dict[str, float], np.ndarray | None]:
        """The step's scalar metrics and new priorities (or None), waiting for the device if need be;
        the same on every call."""
        ...


@runtime_checkable
class DefersUpdates(Protocol):
    """Optional, on top of :class:`Agent`: an update whose results are read later.

    ``update_deferred(batch)`` applies the step exactly as ``update(batch)`` does (the agent's
    parameters, optimiser state and counters move on at once, as far as anything that reads them
    can tell: on CUDA the work is queued on the device in order) but does not wait for its metrics and
    priorities: on CUDA they come back to the host in a non-blocking copy. By definition
    ``update(batch) == update_deferred(batch).result()``. A learner samples the next batch before
    reading a step's results, so the device computes while the host samples; it writes the step's
    priorities before anything reads the replay or the agent as a whole (a published model, a
    checkpoint, the summary, new transitions into replay). An agent without this method is
    updated with :meth:`Agent.update`, its results simply already read.
    """

    def update_deferred(self, batch: Mapping[str, np.ndarray]) -> PendingUpdate:
        """One optimisation step, its results read from what it returns (:meth:`PendingUpdate.result`)."""
        ...


class ReplayBuffer(Protocol):
    """Transitions stored on the learner (:mod:`zmqrl.replay`: uniform or prioritized)."""

    new_frames: int  # distinct image frames the last :meth:`add` stored anew (0 without a frame pool)

    def add(self, batch: Mapping[str, np.ndarray], priorities: np.ndarray | None = None,
            max_new_frames: int | None = None) -> np.ndarray:
        """Store a batch; returns the storage indices written. A batch that does not fit (its fields,
        non-finite priorities, more new frames than ``max_new_frames``) is a ValueError, nothing stored."""
        ...

    def add_frames(self, batch: Mapping[str, np.ndarray], frames: np.ndarray, frame_indices: Mapping[str, np.ndarray],
                   priorities: np.ndarray | None = None, max_new_frames: int | None = None,
                   fingerprints: np.ndarray | None = None) -> np.ndarray:
        """Store a batch whose image fields come as their distinct ``frames`` and, per field, indices into
        them (as the wire carries them): the items :meth:`add` would store with the stacks
        ``frames[indices]``, without building the stacks where replay keeps each frame once."""
        ...

    def sample(self, batch_size: int) -> Batch:
        """A batch with ``indices`` and ``weights`` added."""
        ...

    @property
    def num_added(self) -> int:
        """Items ever added: what :meth:`update_priorities` takes as ``sampled_at``."""
        ...

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray, sampled_at: int | None = None) -> None:
        """New priorities for previously sampled indices; with ``sampled_at`` (:attr:`num_added` when the
        batch was sampled), items written since then keep theirs."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Counters, sampling RNG and schedules (no contents), as JSON values."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        ...

    def save(self, path: str, stamp: Mapping[str, Any] | None = None) -> None:
        """The contents and state to a file, with ``stamp`` (what checkpoint it belongs to)."""
        ...

    def load(self, path: str) -> dict[str, Any]:
        """Inverse of :meth:`save`; returns its stamp."""
        ...

    def __len__(self) -> int: ...


@runtime_checkable
class OnPolicyStore(Protocol):
    """Optional, on top of :class:`ReplayBuffer`: the store of an on-policy algorithm
    (:class:`zmqrl.replay.onpolicy.SegmentQueue`), a bounded FIFO of segments, each trained on for a
    few passes and dropped once too many model versions old.

    ``add`` and ``add_frames`` take ``versions`` (one per item: the model version that acted for it,
    ``-1`` for another learner line). The learner tells it each new version, pauses its actors while it
    is :attr:`full`, and reports its :meth:`summary`; ``zmqrl train`` trains while
    :meth:`updates_ready` says a batch is there.
    """

    @property
    def full(self) -> bool:
        """Whether actors should pause until the learner has trained on what is queued."""
        ...

    def at_version(self, version: int) -> None:
        """The learner's model version is now ``version`` (segments too old for it are dropped, counted)."""
        ...

    def updates_ready(self, batch_size: int) -> int:
        """Batches it can hand out now (passes over one batch included)."""
        ...

    def summary(self) -> dict[str, Any]:
        """Segments added, trained on and dropped by reason, for the learner's summary."""
        ...


class Recorder(Protocol):
    """Where a run's records go (``run.trackers``: TensorBoard, MLflow, W&B): scalars at their step,
    histograms, text, the resolved config with the final metrics, and the run directory's files."""

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Record tagged scalars (``family/name``) at ``step``; non-finite values are left out."""
        ...

    def histogram(self, step: int, tag: str, values: np.ndarray) -> None: ...

    def hparams(self, flat_config: Mapping[str, Any], metrics: Mapping[str, float]) -> None:
        """The resolved config (flat ``section.key`` names) and the run's final metrics."""
        ...

    def text(self, tag: str, text: str) -> None: ...

    def artifacts(self, run_dir: Path) -> None:
        """At the end: the run directory's small files (config.yaml, summary.json, checkpoints/best)."""
        ...

    def flush(self) -> None: ...

    def close(self, failed: bool = False) -> None:
        """Send what is held and close; ``failed`` marks a run that ended in an error."""
        ...
