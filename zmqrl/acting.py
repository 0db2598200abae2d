"""What every process that acts or trains builds first, and the one acting loop they share.

:func:`make_task` resolves the configured algorithm and the env's spaces once, refusing spaces
the algorithm cannot train on with the config key in the message. :class:`ActingLoop` is the
vector env, the policy and the n-step builder stepped together: ``zmqrl train``, the actor and
the bench all act through it, so an algorithm's exploration and transitions are the same
wherever it runs. Its state (every env, the current observations and running episodes, the
n-step builder's pending steps) goes into checkpoints as :data:`STATE_FILE`, so a resumed
``zmqrl train`` continues exactly where it stopped.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from zmqrl import checkpoint
from zmqrl.agents import algorithm
from zmqrl.agents.base import Algorithm, ArraySpec, Exploration
from zmqrl.checkpoint import CheckpointError
from zmqrl.config import Config
from zmqrl.envs import VectorStepper, capture_object, make_vector_env, plan_restore, spaces
from zmqrl.replay import NStepBuilder

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


def make_task(cfg: Config) -> Task:
    """The algorithm ``agent.algo`` names and the env's spaces, checked against each other."""
    algo = algorithm(cfg.agent.algo)
    obs_space, action_space = spaces(cfg.env)
    algo.check_spaces(cfg, obs_space, action_space)
    return Task(cfg, algo, obs_space, action_space)


@dataclass
class Acted:
    """One step of the acting loop: transitions it completed and episodes that ended."""

    transitions: dict[str, np.ndarray] | None
    episode_returns: list[float]
    episode_lengths: list[int]
    explore: float


class ActingLoop:
    """A vector of ``env.num_envs`` envs, a policy acting for all of them in one call, and the
    n-step builder that turns their steps into transitions.

    ``explore`` for each step comes from ``exploration`` at the env steps taken so far (counted
    from ``env_steps``, so a resumed trainer continues its schedule).
    """

    def __init__(self, cfg: Config, policy: Policy, exploration: Exploration, seed: int,
                 env_steps: int = 0) -> None:
        self.policy = policy
        self.exploration = exploration
        self.num_envs = cfg.env.num_envs
        self.stepper = VectorStepper(make_vector_env(cfg.env, self.num_envs, seed), seed)
        self.nstep = NStepBuilder(self.num_envs, cfg.agent.n_step, cfg.agent.gamma)
        self.env_steps = env_steps
        self.env_cfg = cfg.env
        self._warned = False

    def step(self) -> Acted:
        """Act once in every env; returns what that completed."""
        explore = self.exploration(self.env_steps)
        step = self.stepper.step(self.policy.act(self.stepper.obs, explore))
        self.env_steps += self.num_envs
        transitions = self.nstep.push(step.obs, step.action, step.reward, step.next_obs,
                                      step.terminated, step.truncated)
        return Acted(transitions, step.episode_returns, step.episode_lengths, explore)

    # --- state for exact resumes ---------------------------------------------------------------
    def state(self) -> tuple[dict[str, Any], list[str]]:
        """The loop's state as plain data (copies), and what of the envs could not be captured."""
        stepper, missed = self.stepper.state()
        nstep, nstep_missed = capture_object(self.nstep)
        return {"format": STATE_FORMAT, "env": dataclasses.asdict(self.env_cfg), "env_steps": self.env_steps,
                "stepper": stepper, "nstep": nstep, "missed": missed + nstep_missed}, missed + nstep_missed

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
        for key in sorted(set(mine) | set(saved_env)):
            if saved_env.get(key) != mine.get(key):
                raise ValueError(f"saved with env.{key}={saved_env.get(key)!r}, this config has "
                                 f"env.{key}={mine.get(key)!r} (resume with the env section it was saved with)")
        if state.get("env_steps") != env_steps:
            raise ValueError(f"saved at {state.get('env_steps')} env steps, but its checkpoint's "
                             f"{checkpoint.STATE_FILE} counts {env_steps}: the file belongs to another checkpoint")
        load_stepper = self.stepper.plan_load(state.get("stepper"))
        nstep_steps = plan_restore(self.nstep, state.get("nstep"), "n-step builder")

        def load() -> None:
            load_stepper()
            for step in nstep_steps:
                step()
            self.env_steps = env_steps
        return load

    def close(self) -> None:
        self.stepper.close()
