"""IMPALA and APPO through the algorithm seam: on-policy actor-critics with V-trace's off-policy correction.

IMPALA (Espeholt et al. 2018): actors send segments of ``agent.unroll_length`` steps with their
behaviour policy's log-probabilities; the learner trains on each segment once, V-trace correcting for
the versions the policy moved on by while the segment was made and sent. APPO (Sample Factory, RLlib)
is the same with PPO's clipped surrogate, and optionally ``agent.epochs`` passes over each batch.

What differs from the replay algorithms, and where:

- **Segments, not transitions**: :meth:`~Impala.segment_length` makes the acting loop build them
  (:mod:`zmqrl.agents.impala.segments` has the format) with each step's behaviour log-probability;
  the policy draws its actions (``explore`` is not used) and records them
  (:class:`~zmqrl.core.RecordsLogProbs`).
- **A FIFO, not replay**: :meth:`~Impala.make_store` gives the learner a
  :class:`~zmqrl.replay.onpolicy.SegmentQueue` of ``replay.capacity`` segments: each trained on
  ``agent.epochs`` times, oldest first; one more than ``trainer.max_policy_lag`` versions old dropped
  and counted; a full queue pauses the actors.
- **Checks**: the intake refuses a segment whose log-probabilities are not finite or above what the
  policy can give (0 for a categorical one), or whose mask, discounts and steps do not make a segment.

Torch-free at import: the torch agent and policy load only when asked for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from zmqrl.agents.base import Algorithm, ArraySpec, Exploration, item_shape, resolve_backend
from zmqrl.agents.impala.config import APPOConfig, ImpalaConfig
from zmqrl.agents.impala.numpy_policy import LOGP_MIN, logp_bound
from zmqrl.agents.impala.segments import segment_problem
from zmqrl.agents.r2d2.sequences import STATE_C_LIMIT
from zmqrl.config import Config, ConfigError

if TYPE_CHECKING:
    from zmqrl.core import Agent, Params, Policy, ReplayBuffer

SAMPLE_REACH = 1e4  # Box widths beyond the Box a Gaussian's sampled action may lie (the intake's bound)
SAMPLED = Exploration("sampled", lambda _steps: 1.0, "actions drawn from the policy")


class Impala(Algorithm):
    name = "impala"
    config_class: type[ImpalaConfig] = ImpalaConfig

    def agent_config(self, cfg: Config) -> ImpalaConfig:
        assert isinstance(cfg.agent, ImpalaConfig), f"the agent section is not {self.name}'s"
        return cfg.agent

    def check_spaces(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space) -> None:
        ac, env, algo = self.agent_config(cfg), f"env.id: {cfg.env.id!r}", cfg.agent.algo
        if any(size <= 0 for size in ac.hidden):
            raise ConfigError(f"agent.hidden: layer sizes must be > 0, got {ac.hidden}")
        if ac.compile == "graph":
            raise ConfigError(f"agent.compile: graph is not available for agent.algo={algo} (its update has no "
                              "captured CUDA graph); use auto or none, which run it eager")
        if ac.lstm_size and ac.network != "mlp":
            raise ConfigError(f"agent.lstm_size: an LSTM follows agent.network: mlp only (got {ac.network}); set it "
                              "to 0")
        if ac.normalize_observations and ac.network != "mlp":
            raise ConfigError(f"agent.normalize_observations: for agent.network: mlp only (got {ac.network}, whose "
                              "frames are scaled to [0, 1]); set it to false")
        if ac.ent_coef_end is not None and not (math.isfinite(ac.ent_coef_end) and ac.ent_coef_end >= 0):
            raise ConfigError(f"agent.ent_coef_end: must be a number >= 0 or null, got {ac.ent_coef_end}")
        if cfg.trainer.warmup > cfg.replay.capacity:
            raise ConfigError(f"trainer.warmup ({cfg.trainer.warmup}) exceeds replay.capacity "
                              f"({cfg.replay.capacity}): agent.algo={algo} keeps at most that many segments queued and "
                              "would wait forever for more (set trainer.warmup to agent.batch_size)")
        if isinstance(action_space, gym.spaces.Box):
            low, high = np.asarray(action_space.low, np.float64), np.asarray(action_space.high, np.float64)
            if len(action_space.shape) != 1 or not (np.isfinite(low).all() and np.isfinite(high).all()
                                                    and (high > low).all()):
                raise ConfigError(f"{env} has action space {action_space}; agent.algo={algo} needs 1-D Box actions "
                                  "with finite bounds, low < high, or Discrete ones")
        elif not isinstance(action_space, gym.spaces.Discrete):
            raise ConfigError(f"{env} has action space {action_space}; agent.algo={algo} needs Discrete or 1-D Box "
                              "actions")
        shape = obs_space.shape or () if isinstance(obs_space, gym.spaces.Box) else None
        if ac.network == "nature_cnn":
            if shape is None or len(shape) != 3:
                raise ConfigError(f"agent.network: nature_cnn needs (C, H, W) observations; {cfg.env.id!r} gives "
                                  f"{obs_space}")
        elif shape is None or len(shape) != 1:
            raise ConfigError(f"{env} has observation space {obs_space}; agent.algo={algo} with agent.network: mlp "
                              "needs a 1-D Box (vector observations; frames: agent.network: nature_cnn)")

    def make_policy(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                    seed: int = 0, backend: str = "auto", device: str = "cpu") -> Policy:
        ac = self.agent_config(cfg)
        if resolve_backend(backend, ac.network == "mlp", device) == "numpy":
            from zmqrl.agents.impala.numpy_policy import NumpyActorCriticPolicy, NumpyRecurrentActorCritic

            numpy_class = NumpyRecurrentActorCritic if ac.lstm_size else NumpyActorCriticPolicy
            return numpy_class(ac, obs_space, action_space, seed=seed)
        import torch

        from zmqrl.agents.impala.agent import ActorCriticPolicy, RecurrentActorCriticPolicy

        torch.set_num_threads(1)
        torch_class = RecurrentActorCriticPolicy if ac.lstm_size else ActorCriticPolicy
        return torch_class(ac, obs_space, action_space, device, seed)

    def exploration(self, cfg: Config, actor_index: int | None) -> Exploration:
        """None to schedule: every actor, and ``zmqrl train``, draws its actions from the policy."""
        return SAMPLED

    def make_agent(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                   device: Any = "cpu", seed: int = 0) -> Agent:
        from zmqrl.agents.impala.agent import ImpalaAgent, RecurrentImpalaAgent

        self.check_spaces(cfg, obs_space, action_space)
        agent_class = RecurrentImpalaAgent if self.agent_config(cfg).lstm_size else ImpalaAgent
        return agent_class(self.agent_config(cfg), obs_space, action_space, device, seed, max_opts=cfg.trainer.max_opts)

    def initial_params(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                       seed: int) -> Params | None:
        from zmqrl.agents.impala.numpy_policy import initial_policy_params

        if self.agent_config(cfg).network != "mlp":
            return None  # (the learner builds the CNN first)
        return initial_policy_params(self.agent_config(cfg), int(np.prod(obs_space.shape or ())), action_space, seed)

    def batch_spec(self, cfg: Config, obs_space: gym.spaces.Space,
                   action_space: gym.spaces.Space) -> dict[str, ArraySpec]:
        """The fields of a segment (:mod:`zmqrl.agents.impala.segments`): ``T = unroll_length + 1`` steps each."""
        steps = self.segment_length(cfg) + 1
        f32 = np.dtype(np.float32)
        if isinstance(action_space, gym.spaces.Discrete):
            action: ArraySpec = (np.dtype(np.int64), (steps,))
        else:
            action = (np.dtype(action_space.dtype or np.float32), (steps, *item_shape(action_space)))
        spec = {"obs": (np.dtype(obs_space.dtype or np.float32), (steps, *item_shape(obs_space))), "action": action,
                "reward": (f32, (steps,)), "discount": (f32, (steps,)), "mask": (f32, (steps,)),
                "logp": (f32, (steps,))}
        size = self.agent_config(cfg).lstm_size
        if size:  # the LSTM's state before the segment's first step (as R2D2's items carry it)
            spec.update({"state_h": (f32, (size,)), "state_c": (f32, (size,))})
        return spec

    def value_limits(self, cfg: Config, obs_space: gym.spaces.Space,
                     action_space: gym.spaces.Space) -> dict[str, tuple[float, float]]:
        """As for transitions (finite rewards, discounts in [0, 1], actions inside the space), masks in [0, 1],
        and behaviour log-probabilities finite and no larger than the policy can give: 0 for a categorical
        policy (a probability is at most 1), a Gaussian's density at its mean with the smallest std allowed."""
        limits = {k: v for k, v in super().value_limits(cfg, obs_space, action_space).items() if k != "next_obs"}
        limits = {**limits, "mask": (0.0, 1.0), "logp": (LOGP_MIN, logp_bound(self.agent_config(cfg), action_space))}
        if isinstance(action_space, gym.spaces.Box) and "action" in limits:
            # a Gaussian's action is its sample, which may lie beyond the Box the env clips it to: bounded
            # only against absurd values (no honest policy's mean wanders 10,000 Box widths away)
            low, high = limits["action"]
            reach = SAMPLE_REACH * (high - low)
            limits["action"] = (low - reach, high + reach)
        if self.agent_config(cfg).lstm_size:  # an LSTM's h lies in [-1, 1]; |c| grows by less than 1 a step
            limits.update({"state_h": (-1.0, 1.0), "state_c": (-STATE_C_LIMIT, STATE_C_LIMIT)})
        return limits

    def batch_problem(self, cfg: Config, arrays: Mapping[str, np.ndarray]) -> str | None:
        """Masks of 0 and 1 in one run from the first step, terminations only on the last real step, a trained
        step (:func:`~zmqrl.agents.impala.segments.segment_problem`)."""
        return segment_problem(arrays)

    def segment_length(self, cfg: Config) -> int:
        return int(self.agent_config(cfg).unroll_length)

    def new_frames_per_item(self, cfg: Config) -> int:
        """A segment's steps each bring one new frame (a stack shares all but its newest with the step before)."""
        return self.segment_length(cfg)

    def env_steps_per_item(self, cfg: Config) -> int:
        """An episode of ``E`` steps makes ``ceil(E / L)`` segments: at most L env steps per segment."""
        return self.segment_length(cfg)

    def env_steps_held(self, cfg: Config) -> int:
        """An env's steps not yet in a sent segment: at most one segment's ``L + 1``."""
        return self.segment_length(cfg) + 1

    def make_store(self, cfg: Config, spec: Mapping[str, ArraySpec]) -> ReplayBuffer:
        """A FIFO of ``replay.capacity`` segments, each trained on ``agent.epochs`` times, dropped once more than
        ``trainer.max_policy_lag`` versions old (:class:`~zmqrl.replay.onpolicy.SegmentQueue`)."""
        from zmqrl.replay.onpolicy import SegmentQueue

        return SegmentQueue(cfg.replay.capacity, epochs=self.agent_config(cfg).epochs,
                            max_lag=cfg.trainer.max_policy_lag, schema=spec)


class APPO(Impala):
    name = "appo"
    config_class = APPOConfig


IMPALA = Impala()
ALGORITHM = IMPALA
"""``agent.algo: impala``; ``appo`` is :data:`APPO_ALGORITHM` (``zmqrl.agents.impala:APPO_ALGORITHM``)."""
APPO_ALGORITHM = APPO()
