"""What every process that acts or trains builds first, and the one acting loop they share.

:func:`make_task` resolves the configured algorithm and the env's spaces once, refusing spaces
the algorithm cannot train on with the config key in the message. :class:`ActingLoop` is the
vector env, the policy and its adder stepped together: the n-step builder for a feed-forward
policy, the sequence adder for a :class:`~zmqrl.core.RecurrentPolicy` (with a recurrent state per
env) and for an on-policy algorithm's segments (with each step's behaviour log-probability).
``zmqrl train``, the actor and the bench all act through it, so an algorithm's exploration and items
are the same wherever it runs. Its state (every env, the current observations and running episodes,
the adder's pending steps, the recurrent states) goes into checkpoints as :data:`STATE_FILE`, so a
resumed ``zmqrl train`` continues exactly where it stopped.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from zmqrl.agents.base import Algorithm, ArraySpec, Exploration, algorithm
from zmqrl.config import Config, EnvConfig
from zmqrl.core import RecordsLogProbs, RecurrentPolicy, ReusesActingValues
from zmqrl.envs.factory import make_stepper, spaces
from zmqrl.envs.state import capture_object, plan_restore
from zmqrl.envs.stepper import Step
from zmqrl.run import checkpoint
from zmqrl.run.adders import ENV_ID, FIRST_VALUES, NStepBuilder, SequenceAdder
from zmqrl.run.checkpoint import CheckpointError
from zmqrl.run.rewards import scaled

if TYPE_CHECKING:
    from zmqrl.core import Agent, Params, Policy

log = logging.getLogger("zmqrl")

STATE_FILE = "env_state.npz"  # in a checkpoint of `zmqrl train`: the acting loop's state
STATE_FORMAT = 1


@dataclass(frozen=True)
class Task:
    """The configured algorithm and the (single-env) spaces it trains on."""

    cfg: Config
    algo: Algorithm
    obs_space: gym.spaces.Space
    action_space: gym.spaces.Space

    def policy(self, seed: int, backend: str = "auto", device: str = "cpu") -> Policy:
        return self.algo.make_policy(self.cfg, self.obs_space, self.action_space, seed=seed, backend=backend,
                                     device=device)

    def agent(self, device: Any = "cpu", seed: int = 0) -> Agent:
        return self.algo.make_agent(self.cfg, self.obs_space, self.action_space, device=device, seed=seed)

    def initial_params(self) -> Params | None:
        return self.algo.initial_params(self.cfg, self.obs_space, self.action_space, self.cfg.run.seed)

    def exploration(self, actor_index: int | None) -> Exploration:
        return self.algo.exploration(self.cfg, actor_index)

    def batch_spec(self) -> dict[str, ArraySpec]:
        return self.algo.batch_spec(self.cfg, self.obs_space, self.action_space)

    def value_limits(self) -> dict[str, tuple[float, float]]:
        return self.algo.value_limits(self.cfg, self.obs_space, self.action_space)

    def batch_problem(self, arrays: Mapping[str, np.ndarray]) -> str | None:
        return self.algo.batch_problem(self.cfg, arrays)

    @property
    def replay_item(self) -> str:
        """What one replay item is: a transition, a sequence item or an on-policy segment (capacity,
        warm-up, batch size and samples per insert count these)."""
        if self.algo.segment_length(self.cfg):
            return "segment"
        return "sequence item" if type(self.cfg.agent).SEQUENCES else "transition"

    def new_frames_per_item(self) -> int:
        return self.algo.new_frames_per_item(self.cfg)

    def env_steps_per_item(self) -> int:
        return self.algo.env_steps_per_item(self.cfg)

    def env_steps_held(self) -> int:
        return self.algo.env_steps_held(self.cfg)


def make_task(cfg: Config) -> Task:
    """The algorithm ``agent.algo`` names and the env's spaces, checked against each other (and a torso of
    the user's own, ``agent.network_fn``, against the observations)."""
    algo = algorithm(cfg.agent.algo)
    obs_space, action_space = spaces(cfg.env)
    algo.check_spaces(cfg, obs_space, action_space)
    algo.check_torso(cfg, obs_space)
    return Task(cfg, algo, obs_space, action_space)


@dataclass
class Acted:
    """One step of the acting loop: items it completed (n-step transitions, or sequence items of a
    recurrent policy) and episodes that ended."""

    transitions: dict[str, np.ndarray] | None
    episode_returns: list[float]
    episode_lengths: list[int]
    explore: float  # the exploration value it acted with (the mean over env slots where each has its own)
    env_steps: int  # env steps taken (envs that were resetting take none)


def _joined(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}


class ActingLoop:
    """A vector of ``env.num_envs`` envs, a policy acting for all of them in one call, and the
    n-step builder that turns their steps into transitions.

    ``explore`` for each step comes from ``exploration`` at the env steps taken so far (counted
    from ``env_steps``, so a resumed trainer continues its schedule).

    With ``priorities`` and a policy that :class:`~zmqrl.core.ReusesActingValues`, transitions
    come with their initial ``priority``, built from the values the policy computed when acting:
    those of each transition's first observation, and those of its bootstrap observation, which
    the next step acts on. A transition whose episode goes on therefore comes out one step later
    than without priorities (and one still waiting when the loop stops is not sent, like the
    n-step builder's pending steps); :meth:`state` does not hold the waiting ones. A transition
    whose episode terminated needs no bootstrap; one whose episode was truncated bootstraps from
    a final observation nobody acts on, and those take one small forward pass per step where they
    occur. The two values may come from different model versions when a new one arrived in
    between: initial priorities are estimates (the learner replaces them at the first replay), so
    this is not worth a forward pass. Otherwise (``priorities`` off, or a policy without reused
    values) transitions come without priorities, at once.

    An on-policy algorithm (:meth:`~zmqrl.agents.base.Algorithm.segment_length` > 0) gets segments from
    the :class:`~zmqrl.run.adders.SequenceAdder` (no burn-in, no overlap): that many steps of one
    episode and the step after them, each step with ``logp``, the log-probability its policy
    (:class:`~zmqrl.core.RecordsLogProbs`) gave the action it took.

    A :class:`~zmqrl.core.RecurrentPolicy` acts with a recurrent state per env, which the loop owns:
    each env starts every episode from the policy's initial state (reset once its episode ended, and
    where an asynchronous pool's row is an env's reset rather than a step); the state an env held
    before acting on an observation goes to the :class:`~zmqrl.run.adders.SequenceAdder` with that
    step, so each sequence item carries the state at its start. Its items come without priorities
    (the caller computes them per batch with ``policy.priorities``, one pass over whole items).
    """

    def __init__(self, cfg: Config, policy: Policy, exploration: Exploration, seed: int,
                 env_steps: int = 0, priorities: bool = False) -> None:
        self.policy = policy
        self.exploration = exploration
        self.num_envs = cfg.env.num_envs
        self.stepper = make_stepper(cfg.env, self.num_envs, seed)
        self.recurrent = policy if isinstance(policy, RecurrentPolicy) else None
        # an on-policy algorithm's segments: this many steps, each with its behaviour log-probability
        self.segment_length = algorithm(cfg.agent.algo).segment_length(cfg)
        self._env_bounds: tuple[np.ndarray, np.ndarray] | None = None  # an on-policy Box policy's: the env's clip
        self.adder: NStepBuilder | SequenceAdder
        if self.segment_length:
            if not isinstance(policy, RecordsLogProbs):
                raise TypeError(f"agent.algo={cfg.agent.algo} sends segments with behaviour log-probabilities, but "
                                f"its policy {type(policy).__name__} does not record them (RecordsLogProbs)")
            self.adder = SequenceAdder(self.num_envs, 0, self.segment_length, 0, cfg.agent.gamma)
            self._logp = np.zeros(self.num_envs, dtype=np.float32)  # per env: that of the action it last took
            # a Gaussian policy's action is its sample, kept with its log-probability; the env gets it clipped
            space = getattr(getattr(self.stepper, "vec", None), "single_action_space", None)
            if isinstance(space, gym.spaces.Box):
                self._env_bounds = (np.asarray(space.low), np.asarray(space.high))
        elif self.recurrent is None:
            self.adder = NStepBuilder(self.num_envs, cfg.agent.n_step, cfg.agent.gamma)
        else:
            rc = cfg.replay
            self.adder = SequenceAdder(self.num_envs, rc.burn_in, rc.sequence_length, rc.overlap, cfg.agent.gamma)
        if self.recurrent is not None:
            # each env's state for its current observation, and the one it held before its last act
            self.states = self.recurrent.initial_state(self.num_envs)
            self.acted_from = self.states.copy()
        self.env_steps = env_steps
        self.env_cfg = cfg.env
        self._warned = False
        self.reuse = policy if priorities and isinstance(policy, ReusesActingValues) and self.recurrent is None \
            else None
        self._waiting: dict[str, np.ndarray] | None = None  # transitions waiting for their bootstrap's values
        self._env_values: np.ndarray | None = None  # per env: the values of the observation it last acted on
        self.reward_factor = 1.0  # the learner's factor on rewards (zmqrl.run.rewards): priorities are computed with it

    @property
    def prioritises(self) -> bool:
        """Whether the transitions this loop returns carry their initial ``priority``."""
        return self.reuse is not None

    def step(self) -> Acted:
        """Act once for the envs the stepper holds observations of (every env, or with an
        asynchronous pool those that are ready); returns what that completed."""
        explore = self.exploration(self.env_steps)
        acted = self.stepper.env_ids  # the envs acted for (None: all, in order)
        if acted is not None and np.ndim(explore):
            explore = np.asarray(explore)[acted]
        if self.recurrent is not None:
            action = self._act_recurrent(explore, acted)
        else:
            action = self.policy.act(self.stepper.obs, explore)
        if self.segment_length:
            assert isinstance(self.policy, RecordsLogProbs)
            self._logp[slice(None) if acted is None else acted] = self.policy.acted_log_probs()
        if self._env_bounds is None:
            step = self.stepper.step(action)
        else:  # the env takes the sample clipped to its Box; the segment keeps the sample its logp is of
            step = self.stepper.step(np.clip(action, *self._env_bounds).astype(action.dtype, copy=False))
            step.action = action
        taken = len(step.reward) if step.valid is None else int(step.valid.sum())
        self.env_steps += taken
        if self.recurrent is not None or self.segment_length:
            transitions = self._sequences(step)
        elif self.reuse is None:
            transitions = self.nstep.push(step.obs, step.action, step.reward, step.next_obs,
                                          step.terminated, step.truncated, valid=step.valid, env_ids=step.env_ids)
        else:
            transitions = self._prioritised(step, self.reuse.acted_values(), acted)
        return Acted(transitions, step.episode_returns, step.episode_lengths, float(np.mean(explore)), taken)

    @property
    def nstep(self) -> NStepBuilder:
        """The n-step builder of a feed-forward policy's loop (one that makes no segments)."""
        assert isinstance(self.adder, NStepBuilder), "this loop has a sequence adder"
        return self.adder

    def _act_recurrent(self, explore: float | np.ndarray, acted: np.ndarray | None) -> np.ndarray:
        """The recurrent policy's actions for the envs ``acted`` (None: all) from their states, which move on."""
        assert self.recurrent is not None
        if acted is None:
            action, after = self.recurrent.act_recurrent(self.stepper.obs, explore, self.states)
            self.acted_from, self.states = self.states, np.asarray(after, dtype=np.float32)
        else:
            before = self.states[acted]
            action, after = self.recurrent.act_recurrent(self.stepper.obs, explore, before)
            self.acted_from[acted] = before
            self.states[acted] = after
        return action

    def _sequences(self, step: Step) -> dict[str, np.ndarray] | None:
        """The sequence items ``step`` completes, each with the state its env held at its start; then the
        states of envs whose next observation starts an episode go back to the initial state: those whose
        episode just ended, and an asynchronous pool's rows that were an env's reset, not a step."""
        assert isinstance(self.adder, SequenceAdder)
        rows = np.arange(self.num_envs) if step.env_ids is None else step.env_ids
        state = None if self.recurrent is None else self.acted_from[rows]
        extras = {"logp": self._logp[rows]} if self.segment_length else None
        items = self.adder.push(step.obs, step.action, step.reward, step.terminated, step.truncated,
                                state, valid=step.valid, env_ids=step.env_ids, extras=extras)
        if self.recurrent is None:
            return items
        fresh = step.terminated | step.truncated
        if step.valid is not None:
            fresh = fresh | ~step.valid
        if fresh.any():
            envs = rows[fresh]
            self.states[envs] = self.recurrent.initial_state(len(envs))
        return items

    def _prioritised(self, step: Step, values: np.ndarray, acted: np.ndarray | None) -> dict[str, np.ndarray] | None:
        """The transitions that ``step`` completes, with priorities: those waiting for the values
        of their bootstrap observation, which the envs ``acted`` (all: None) just acted on with
        ``values``, and those of episodes that ended; the others wait for their env's next act."""
        assert self.reuse is not None
        every = np.arange(self.num_envs)
        acted_envs = every if acted is None else acted
        if self._env_values is None:
            self._env_values = np.zeros((self.num_envs, *values.shape[1:]), dtype=values.dtype)
        self._env_values[acted_envs] = values
        ready = []
        if self._waiting is not None:
            waiting, self._waiting = self._waiting, None
            here = np.ones(len(waiting[ENV_ID]), dtype=bool) if acted is None else np.isin(waiting[ENV_ID], acted)
            if not here.all():
                self._waiting = {key: value[~here] for key, value in waiting.items()}
                waiting = {key: value[here] for key, value in waiting.items()}
            if here.any():
                ready.append(self._with_priority(waiting, self._env_values[waiting[ENV_ID]]))
        rows_envs = every if step.env_ids is None else step.env_ids  # the env of each row of the step
        new = self.nstep.push(step.obs, step.action, step.reward, step.next_obs, step.terminated,
                              step.truncated, values=self._env_values[rows_envs], valid=step.valid,
                              env_ids=step.env_ids)
        if new is not None:
            row_of = np.empty(self.num_envs, dtype=np.int64)
            row_of[rows_envs] = np.arange(len(rows_envs))
            ended = (step.terminated | step.truncated)[row_of[new[ENV_ID]]]
            if ended.all():
                ready.append(self._with_priority(new, self._final_values(new, step.next_obs, row_of)))
            elif not ended.any():
                self._waiting = new if self._waiting is None else _joined([self._waiting, new])
            else:
                going = {key: value[~ended] for key, value in new.items()}
                self._waiting = going if self._waiting is None else _joined([self._waiting, going])
                new = {key: value[ended] for key, value in new.items()}
                ready.append(self._with_priority(new, self._final_values(new, step.next_obs, row_of)))
        if not ready:
            return None
        return ready[0] if len(ready) == 1 else _joined(ready)

    def _final_values(self, ended: dict[str, np.ndarray], next_obs: np.ndarray, row_of: np.ndarray) -> np.ndarray:
        """Bootstrap values of transitions of ended episodes: none needed where the episode
        terminated (discount 0: zeros); one forward pass over the final observations of the envs
        truncated (one row per env, however many transitions it flushed; ``row_of``: each env's
        row of ``next_obs``)."""
        assert self.reuse is not None
        first = ended[FIRST_VALUES]
        boot = np.zeros_like(first)
        truncated = ended["discount"] > 0
        if truncated.any():
            envs, row = np.unique(ended[ENV_ID][truncated], return_inverse=True)
            boot[truncated] = self.reuse.values(next_obs[row_of[envs]])[row]
        return boot

    def _with_priority(self, batch: dict[str, np.ndarray], boot: np.ndarray) -> dict[str, np.ndarray]:
        """``batch`` without the builder's extra keys, with the priorities of its values."""
        assert self.reuse is not None
        first = batch.pop(FIRST_VALUES)
        del batch[ENV_ID]
        batch["priority"] = self.reuse.priorities_from_values(scaled(batch, self.reward_factor), first, boot)
        return batch

    # --- state for exact resumes ---------------------------------------------------------------
    def state(self) -> tuple[dict[str, Any], list[str]]:
        """The loop's state as plain data (copies), and what of the envs could not be captured."""
        stepper, missed = self.stepper.state()
        adder, adder_missed = capture_object(self.adder)
        state = {"format": STATE_FORMAT, "env": dataclasses.asdict(self.env_cfg), "env_steps": self.env_steps,
                 "stepper": stepper, "missed": missed + adder_missed}
        if isinstance(self.adder, NStepBuilder):
            state["nstep"] = adder
        else:  # the sequence adder's pending steps (segments: with the last actions' log-probabilities)
            state["sequences"] = adder
            if self.segment_length:
                state["logp"] = self._logp.copy()
        if self.recurrent is not None:  # every env's recurrent states
            state["recurrent"] = {"states": self.states.copy(), "acted_from": self.acted_from.copy()}
        return state, missed + adder_missed

    def snapshot(self) -> Callable[[Path], None]:
        """Take the state now (on the acting thread); the returned callable writes it to a path,
        from any thread. The first time something cannot be captured, says so in the log."""
        state, missed = self.state()
        if missed and not self._warned:
            self._warned = True
            log.warning("a resume of this run will not be exact for %s: %s cannot be saved", self.env_cfg.id,
                        ", ".join(missed))
        return lambda path: checkpoint.write_tree(path, state)

    def restore(self, path: Path, env_steps: int) -> list[str]:
        """Load a state file written by :meth:`snapshot` whose checkpoint counted ``env_steps``;
        returns why the resume is not exact (empty when it is). CheckpointError naming the file
        when it does not fit this config's env, before anything changes."""
        state = checkpoint.read_tree(path)
        try:
            load = self._plan_restore(state, env_steps)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CheckpointError(f"{path}: does not fit this config's env: {' '.join(str(exc).split())}") from None
        load()
        return [f"{self.env_cfg.id}: {m} could not be saved" for m in state.get("missed", [])]

    def _plan_restore(self, state: Any, env_steps: int) -> Callable[[], None]:
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"not an env state of format {STATE_FORMAT}")
        mine = dataclasses.asdict(self.env_cfg)
        saved_env = state.get("env")
        if not isinstance(saved_env, dict):
            raise ValueError("no env section")
        defaults = dataclasses.asdict(EnvConfig())  # keys newer than the file: their defaults
        for key in sorted(set(mine) | set(saved_env)):
            if saved_env.get(key, defaults.get(key)) != mine.get(key):
                raise ValueError(f"saved with env.{key}={saved_env.get(key)!r}, this config has "
                                 f"env.{key}={mine.get(key)!r} (resume with the env section it was saved with)")
        if state.get("env_steps") != env_steps:
            raise ValueError(f"saved at {state.get('env_steps')} env steps, but its checkpoint's "
                             f"{checkpoint.STATE_FILE} counts {env_steps}: the file belongs to another checkpoint")
        if not self.stepper.restorable:  # new episodes: nothing pending may join them
            return lambda: setattr(self, "env_steps", env_steps)
        load_stepper = self.stepper.plan_load(state.get("stepper"))
        if isinstance(self.adder, NStepBuilder):
            adder_steps = plan_restore(self.adder, state.get("nstep"), "n-step builder")
        else:
            adder_steps = plan_restore(self.adder, state.get("sequences"), "sequence adder")
        if self.segment_length:
            logp = state.get("logp")
            if not isinstance(logp, np.ndarray) or logp.shape != self._logp.shape:
                raise ValueError("no log-probabilities of the last actions (saved by a loop that made no segments)")
            adder_steps.append(lambda: self._logp.__setitem__(slice(None), logp))
        if self.recurrent is not None:
            adder_steps.append(self._plan_states(state.get("recurrent")))

        def load() -> None:
            load_stepper()
            for step in adder_steps:
                step()
            self.env_steps = env_steps
        return load

    def _plan_states(self, saved: Any) -> Callable[[], None]:
        """Check saved recurrent states against this loop's; returns the step that loads them."""
        if not isinstance(saved, dict):
            raise ValueError("no recurrent states (saved by a loop whose policy is not recurrent)")
        arrays = {}
        for key, mine in (("states", self.states), ("acted_from", self.acted_from)):
            value = saved.get(key)
            if not isinstance(value, np.ndarray) or value.shape != mine.shape or value.dtype != mine.dtype:
                raise ValueError(f"recurrent {key}: expected {mine.dtype} {mine.shape}, got "
                                 f"{getattr(value, 'dtype', type(value).__name__)} {getattr(value, 'shape', '')}")
            arrays[key] = value.copy()

        def load() -> None:
            self.states, self.acted_from = arrays["states"], arrays["acted_from"]
        return load

    def close(self) -> None:
        self.stepper.close()
