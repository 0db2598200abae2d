"""What every process that acts or trains builds first, and the one acting loop they share.

:func:`make_task` resolves the configured algorithm and the env's spaces once, refusing spaces
the algorithm cannot train on with the config key in the message. :class:`ActingLoop` is the
vector env, the policy and the n-step builder stepped together: ``zmqrl train``, the actor and
the bench all act through it, so an algorithm's exploration and transitions are the same
wherever it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from zmqrl.agents import algorithm
from zmqrl.agents.base import Algorithm, ArraySpec, Exploration
from zmqrl.config import Config
from zmqrl.envs import VectorStepper, make_vector_env, spaces
from zmqrl.replay import NStepBuilder

if TYPE_CHECKING:
    from zmqrl.core import Agent, Params, Policy


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

    def step(self) -> Acted:
        """Act once in every env; returns what that completed."""
        explore = self.exploration(self.env_steps)
        step = self.stepper.step(self.policy.act(self.stepper.obs, explore))
        self.env_steps += self.num_envs
        transitions = self.nstep.push(step.obs, step.action, step.reward, step.next_obs,
                                      step.terminated, step.truncated)
        return Acted(transitions, step.episode_returns, step.episode_lengths, explore)

    def close(self) -> None:
        self.stepper.close()
