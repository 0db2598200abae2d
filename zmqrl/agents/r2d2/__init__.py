"""R2D2 through the algorithm seam: recurrent replay distributed DQN (Kapturowski et al. 2019), an LSTM
Q-network trained on stored sequences with burn-in, double n-step targets, value rescaling and
per-sequence priorities; Ape-X exploration per actor.

Torch-free at import: the torch agent and policy load only when asked for.

The sequence item
-----------------
Where DQN sends transitions, R2D2 sends *sequence items*, built per env by
:class:`zmqrl.run.adders.SequenceAdder`. With ``B = replay.burn_in``, ``L = replay.sequence_length``
and ``T = B + L + 1`` (Acme: burn-in + trace + 1), one item is ``T`` consecutive steps of one
episode: ``B`` burn-in steps that only warm up the recurrent state, ``L`` trained steps, and one
more to bootstrap the last of them from. Its fields (leading dim: items):

- ``obs`` (T, \\*obs_shape), obs dtype: the observation each step's action was taken on;
- ``action`` (T,) int64: the action taken;
- ``reward`` (T,) float32: the reward of that step;
- ``discount`` (T,) float32: ``gamma`` where the episode goes on after the step (truncated ones
  too), 0 where it terminated with it;
- ``mask`` (T,) float32: 1 for the episode's real steps, 0 for padding;
- ``state_h``, ``state_c`` (lstm_size,) float32: the recurrent state the actor held before acting
  on the item's first step (h in [-1, 1], |c| within
  :data:`~zmqrl.agents.r2d2.sequences.STATE_C_LIMIT`);
- ``priority`` (optional, per item): the actor's initial priority.

Items never cross an episode boundary. An episode's items have their first trained step at the
episode's steps ``0, P, 2P, ...`` (``P = L - replay.overlap``), so trained parts overlap by
``replay.overlap`` steps and together cover the whole episode. Item ``k`` holds the episode's
steps ``kP - B .. kP + L``; those that do not exist are padding (``obs``, ``action``, ``reward``,
``discount`` and ``mask`` all 0):

- *burn-in before the episode's start is masked*: an item whose burn-in reaches back before the
  episode's first step (``kP < B``, the first one always when ``B > 0``) begins with ``B - kP``
  padding steps, then the episode from its first step; its stored state is the state the actor
  held before that first step, the zero (initial) state. Padding leaves the recurrent state as it
  was, so the first real step sees exactly the state the actor acted with;
- *the episode's end is padded*: an item whose steps reach past the episode's last step ends with
  padding. Where the episode terminated, the last real step has discount 0 and its reward counts;
  where it was truncated, the last real step keeps ``gamma`` but has no next observation in the
  item: it has no target of its own, and the steps before it bootstrap from it.

So a mask is one run of ones, the item's first trained step (step ``B``) is real, and an item is
only made where at least one trained step has a target. Each trained step ``j`` bootstraps from step
``min(j + n, R')`` (``R'`` the last real step, or one past it where the episode terminated):
truncated at the item's end (fewer than ``n`` steps, from the last step available, as SEED RL
does) and at the episode's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from zmqrl.agents.base import ArraySpec
from zmqrl.agents.qlearning import DiscreteQAlgorithm
from zmqrl.agents.r2d2.config import R2D2Config
from zmqrl.agents.r2d2.sequences import STATE_C_LIMIT, item_problem, layout
from zmqrl.config import Config, ConfigError


def check_config(ac: R2D2Config) -> None:
    """What the range checks of the config cannot say about R2D2's keys; its update has no captured
    CUDA graph (the LSTM's burn-in and unroll run eager), so ``agent.compile: graph`` is refused."""
    if any(size <= 0 for size in ac.hidden):
        raise ConfigError(f"agent.hidden: layer sizes must be > 0, got {ac.hidden}")
    if ac.compile == "graph":
        raise ConfigError("agent.compile: graph is not available for agent.algo=r2d2 (its update has no captured "
                          "CUDA graph); use auto or none, which run it eager")


class R2D2(DiscreteQAlgorithm):
    name = "r2d2"
    config_class = R2D2Config
    numpy_policy = "zmqrl.agents.r2d2.numpy_policy:NumpyR2D2Policy"
    torch_policy = "zmqrl.agents.r2d2.agent:R2D2Policy"
    agent_class = "zmqrl.agents.r2d2.agent:R2D2Agent"
    initial_mlp_params = "zmqrl.agents.r2d2.numpy_policy:initial_mlp_params"

    def check(self, ac: R2D2Config) -> None:
        check_config(ac)

    def class_args(self, cfg: Config) -> tuple[Any, ...]:
        """The policies and the agent take the item layout (:func:`~zmqrl.agents.r2d2.sequences.layout`)."""
        return (layout(cfg),)

    def batch_spec(self, cfg: Config, obs_space: gym.spaces.Space,
                   action_space: gym.spaces.Space) -> dict[str, ArraySpec]:
        """The fields of a sequence item (see the package's docstring)."""
        steps = layout(cfg).steps
        ac = self.agent_config(cfg)
        assert isinstance(ac, R2D2Config)
        size = ac.lstm_size
        f32 = np.dtype(np.float32)
        obs_shape = tuple(int(d) for d in (obs_space.shape or ()))
        return {"obs": (np.dtype(obs_space.dtype or np.float32), (steps, *obs_shape)),
                "action": (np.dtype(np.int64), (steps,)), "reward": (f32, (steps,)), "discount": (f32, (steps,)),
                "mask": (f32, (steps,)), "state_h": (f32, (size,)), "state_c": (f32, (size,))}

    def value_limits(self, cfg: Config, obs_space: gym.spaces.Space,
                     action_space: gym.spaces.Space) -> dict[str, tuple[float, float]]:
        """As for transitions (finite rewards, discounts in [0, 1], actions inside the space), and masks in
        [0, 1], ``state_h`` in [-1, 1], ``state_c`` within :data:`~zmqrl.agents.r2d2.sequences.STATE_C_LIMIT`."""
        limits = {k: v for k, v in super().value_limits(cfg, obs_space, action_space).items() if k != "next_obs"}
        return {**limits, "mask": (0.0, 1.0), "state_h": (-1.0, 1.0), "state_c": (-STATE_C_LIMIT, STATE_C_LIMIT)}

    def batch_problem(self, cfg: Config, arrays: Mapping[str, np.ndarray]) -> str | None:
        """Masks of 0 and 1 in one run, a real first trained step and one with a target, terminations only
        at an item's end, finite and bounded states (:func:`~zmqrl.agents.r2d2.sequences.item_problem`)."""
        return item_problem(arrays, layout(cfg).burn_in)

    def new_frames_per_item(self, cfg: Config) -> int:
        """An episode's items start every ``P = sequence_length - overlap`` steps and each step brings one
        new frame (a stack shares all but its newest with the step before), so an item brings about P."""
        return layout(cfg).period

    def env_steps_per_item(self, cfg: Config) -> int:
        """An episode of ``E`` steps makes ``ceil(E / P)`` items: at most P env steps per item."""
        return layout(cfg).period

    def env_steps_held(self, cfg: Config) -> int:
        """An env's steps not yet in a sent item: at most one item's ``T`` steps."""
        return layout(cfg).steps


ALGORITHM = R2D2()
