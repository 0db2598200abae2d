"""The algorithm seam: what one algorithm hands the rest of zmqrl.

An algorithm is a folder ``zmqrl/agents/<algo>/`` whose ``__init__.py`` (which must not import
torch) defines ``ALGORITHM``, an instance of a subclass of :class:`Algorithm`, and one line in
:data:`zmqrl.config.algorithms.ALGORITHMS`. Roles, the single-process trainer, the bookkeeping and the
bench call only these methods; none of them names an algorithm.

What an algorithm provides:

- ``config_class``: the dataclass of its ``agent:`` section (a subclass of
  :class:`zmqrl.config.AgentConfig`), chosen by ``agent.algo``;
- :meth:`Algorithm.check_spaces`: refuse env spaces it cannot train on, naming the key;
- :meth:`Algorithm.make_policy`: the actor's policy (numpy for small MLPs on CPU, torch
  otherwise), a :class:`zmqrl.core.Policy`;
- :meth:`Algorithm.exploration`: the exploration schedule of one actor (Ape-X ε for Q-learning)
  or of the single-process trainer;
- :meth:`Algorithm.make_agent`: the learner's :class:`zmqrl.core.Agent` (imports torch);
- :meth:`Algorithm.initial_params`: model version 0 drawn with numpy, so the learner can
  publish before torch has loaded (``None`` to build the agent first);
- :meth:`Algorithm.batch_spec`: the arrays of a transition batch, so a learner rejects a batch
  that does not fit before it reaches replay;
- :meth:`Algorithm.value_limits` and :meth:`Algorithm.batch_problem`: what the values of such a
  batch may be, checked by the learner's intake before anything is stored;
- :meth:`Algorithm.new_frames_per_item`, :meth:`Algorithm.env_steps_per_item` and
  :meth:`Algorithm.env_steps_held`: what an honest sender's items bring (new image frames) and stand
  for (env steps), the learner's bounds on what a sender may claim;
- :meth:`Algorithm.segment_length` and :meth:`Algorithm.make_store`: for an on-policy algorithm, the
  segments its actors send (with each step's behaviour log-probability) and the learner's store of
  them (a bounded FIFO instead of replay).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from zmqrl.config import AgentConfig, Config, ConfigError
from zmqrl.config import algorithms as registry

if TYPE_CHECKING:
    from zmqrl.core import Agent, Params, Policy, ReplayBuffer

ArraySpec = tuple[np.dtype, tuple[int, ...]]  # dtype and per-item shape of one field of a batch


@dataclass(frozen=True)
class Exploration:
    """An exploration schedule: the value passed as ``explore`` to :meth:`Policy.act`.

    ``name`` is what the value means (``epsilon`` for ε-greedy), used for logs and the
    ``train/<name>`` record; ``schedule`` maps env steps taken so far to the value; ``shape``
    says how it changes, for logs ("1 -> 0.4 over 5000 env steps"; empty: see the value).
    """

    name: str
    schedule: Callable[[int], float | np.ndarray]  # a value, or one per env slot of the acting process
    shape: str = ""

    def __call__(self, env_steps: int) -> float | np.ndarray:
        return self.schedule(env_steps)

    def mean(self, env_steps: int) -> float:
        """The value, or the mean over the env slots (what records and logs show)."""
        return float(np.mean(self(env_steps)))

    def describe(self) -> str:
        """The value at the first step, or the schedule's shape where it has one."""
        first = np.atleast_1d(self(0))
        if self.shape:
            return self.shape
        return f"{first[0]:.4g}" if first.size == 1 else f"{_span(first)} over {first.size} envs"


def constant(name: str, value: float) -> Exploration:
    """The same exploration value at every step."""
    return Exploration(name, lambda _steps: value)


def linear(name: str, start: float | np.ndarray, end: float | np.ndarray, decay_steps: int) -> Exploration:
    """A linear decay from ``start`` to ``end`` over ``decay_steps`` env steps, then ``end`` (each a
    value, or one per env slot)."""

    def schedule(step: int) -> float | np.ndarray:
        if decay_steps <= 0:
            return end
        return end + (start - end) * max(0.0, 1.0 - step / decay_steps)

    moves = decay_steps > 0 and np.any(np.asarray(start) != np.asarray(end))
    shape = f"{_span(start)} -> {_span(end)} over {decay_steps} env steps" if moves else ""
    return Exploration(name, schedule, shape)


def _span(value: float | np.ndarray) -> str:
    values = np.atleast_1d(value)
    return f"{values[0]:.4g}" if values.size == 1 else f"{values.max():.4g}..{values.min():.4g}"


def resolve_backend(backend: str, numpy_ok: bool, device: str = "cpu") -> str:
    """``auto`` picks numpy where the algorithm has a numpy policy for this config and the device
    is the CPU (several times faster per step, and no torch import), else torch."""
    if backend == "auto":
        return "numpy" if numpy_ok and str(device) == "cpu" else "torch"
    if backend not in ("numpy", "torch"):
        raise ConfigError(f"actor.backend: must be auto, numpy or torch, got {backend!r}")
    if backend == "numpy" and not numpy_ok:
        raise ConfigError("actor.backend: numpy needs an MLP policy (agent.network: mlp); use torch or auto")
    return backend


def item_shape(space: gym.spaces.Space) -> tuple[int, ...]:
    return tuple(int(d) for d in (space.shape or ()))


class Algorithm:
    """Base class of an algorithm's entry in the registry (torch-free; subclasses import torch
    only inside :meth:`make_agent` and the torch branch of :meth:`make_policy`)."""

    name: str = ""
    config_class: type[AgentConfig] = AgentConfig
    takes_torso: bool = False  # whether its heads can sit on a torso of the user's own (agent.network_fn)

    def check_spaces(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space) -> None:
        """Raise :class:`ConfigError` naming ``env.id`` (and the key to change) for spaces this
        algorithm cannot train on."""
        raise NotImplementedError

    def make_policy(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                    seed: int = 0, backend: str = "auto", device: str = "cpu") -> Policy:
        """The acting half, for actors, the evaluator and ``zmqrl enjoy``."""
        raise NotImplementedError

    def check_torso(self, cfg: Config, obs_space: gym.spaces.Space) -> None:
        """With ``agent.network_fn`` (a torso of the user's own): ConfigError naming the key where this
        algorithm cannot take one (:attr:`takes_torso`), where ``actor.backend`` asks for numpy (the torso is
        torch), or where the torso does not fit the observations (built once here, with torch)."""
        if not cfg.agent.network_fn:
            return
        if not self.takes_torso:
            raise ConfigError(f"agent.network_fn: agent.algo={self.name} cannot put its heads on a torso of your "
                              f"own; leave agent.network_fn empty (algorithms that take one: "
                              f"{', '.join(_torso_takers()) or 'none'})")
        if cfg.actor.backend == "numpy":
            raise ConfigError("actor.backend: numpy cannot run the torch torso of agent.network_fn; set it to torch "
                              "or auto (auto acts with torch where a torso is the user's)")
        from zmqrl.agents.torso import user_torso

        user_torso(cfg.agent, obs_space)

    def exploration(self, cfg: Config, actor_index: int | None) -> Exploration:
        """Actor ``actor_index`` of ``cfg.actor.num_actors``, or the single-process trainer (None)."""
        raise NotImplementedError

    def make_agent(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                   device: Any = "cpu", seed: int = 0) -> Agent:
        """The learner's agent on ``device`` (a torch device or its name)."""
        raise NotImplementedError

    def initial_params(self, cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                       seed: int) -> Params | None:
        """Policy parameters of model version 0 drawn with numpy (what :meth:`Agent.params`
        would return for a fresh agent), or None where the learner must build the agent first."""
        return None

    def batch_spec(self, cfg: Config, obs_space: gym.spaces.Space,
                   action_space: gym.spaces.Space) -> dict[str, ArraySpec]:
        """Every array of a transition batch that actors send: dtype and per-item shape.

        ``priority`` (float32, optional) is not listed; the learner allows it on its own.
        """
        if isinstance(action_space, gym.spaces.Discrete):
            action: ArraySpec = (np.dtype(np.int64), ())
        else:
            action = (np.dtype(action_space.dtype or np.float32), item_shape(action_space))
        obs: ArraySpec = (np.dtype(obs_space.dtype or np.float32), item_shape(obs_space))
        return {"obs": obs, "action": action, "reward": (np.dtype(np.float32), ()), "next_obs": obs,
                "discount": (np.dtype(np.float32), ())}

    def value_limits(self, cfg: Config, obs_space: gym.spaces.Space,
                     action_space: gym.spaces.Space) -> dict[str, tuple[float, float]]:
        """Bounds every value of a batch field must lie in, checked before a batch reaches replay:
        a field's values inside ``[lo, hi]`` (NaN never is); ``(-inf, inf)`` means finite. Fields not
        listed (integer frames, say) are not checked beyond their dtype.

        Floats finite; discrete actions inside the action space, continuous ones inside its box;
        discounts in [0, 1]: a batch outside them would crash an update or poison the model.
        """
        finite = (-math.inf, math.inf)
        limits = {"reward": finite, "discount": (0.0, 1.0)}
        if isinstance(action_space, gym.spaces.Discrete):
            start = int(getattr(action_space, "start", 0))
            limits["action"] = (float(start), float(start + int(action_space.n) - 1))
        elif isinstance(action_space, gym.spaces.Box):
            low, high = float(np.min(action_space.low)), float(np.max(action_space.high))
            slack = 1e-4 * (high - low) if math.isfinite(high - low) else 0.0
            limits["action"] = (low - slack, high + slack) if math.isfinite(high - low) else finite
        if np.dtype(obs_space.dtype or np.float32).kind == "f":
            limits["obs"] = limits["next_obs"] = finite
        return limits

    def batch_problem(self, cfg: Config, arrays: Mapping[str, np.ndarray]) -> str | None:
        """What is wrong with a batch of items for this algorithm beyond its fields' value limits (a
        sentence naming the field, or the item, at fault), or None: a meaning check the learner's intake
        runs after :meth:`value_limits`. ``arrays`` holds the fields of :meth:`batch_spec` with a common
        leading length, less image fields whose frames came once (their indices are checked apart).
        Transitions need none (None); R2D2's sequence items check their masks and states."""
        return None

    def new_frames_per_item(self, cfg: Config) -> int:
        """Image frames an honest item brings that its sender's item before it did not: one for an
        n-step transition of stacked frames. The learner lets each sender's items take at most
        twice this many new frames in replay (a sender whose frames share nothing is refused)."""
        return 1

    def env_steps_per_item(self, cfg: Config) -> int:
        """Env steps an honest sender's items stand for, at most, on average: one per n-step transition.
        The learner counts no more of a sender's reported env steps than this many per item it sent,
        plus what its buffers may hold (:meth:`env_steps_held`)."""
        return 1

    def env_steps_held(self, cfg: Config) -> int:
        """Env steps one acting env may have taken that no item it sent covers yet: the n-step window."""
        return int(cfg.agent.n_step)

    def segment_length(self, cfg: Config) -> int:
        """Steps per segment for an on-policy algorithm (its actors' items are segments of that many steps
        with each step's behaviour log-probability, :class:`~zmqrl.core.RecordsLogProbs`); 0 for an
        algorithm that trains on n-step transitions or recurrent sequences from replay."""
        return 0

    def make_store(self, cfg: Config, spec: Mapping[str, ArraySpec]) -> ReplayBuffer | None:
        """The learner's store of items when it is not replay (an on-policy algorithm's FIFO of segments,
        :class:`~zmqrl.core.OnPolicyStore`), or None: the replay ``replay:`` configures."""
        return None


def check_discrete_spaces(cfg: Config, obs_space: gym.spaces.Space, action_space: gym.spaces.Space,
                          network: str) -> None:
    """What a Q-learning algorithm over ``network`` (mlp or nature_cnn) needs: Discrete actions,
    Box observations, (C, H, W) frames for the CNN; ConfigError naming the key otherwise."""
    algo = cfg.agent.algo
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(f"env.id: {cfg.env.id!r} has action space {action_space}; agent.algo={algo} needs a "
                          "Discrete one (for continuous actions: agent.algo=sac, as in configs/pendulum_sac.yaml)")
    if not isinstance(obs_space, gym.spaces.Box):
        raise ConfigError(f"env.id: {cfg.env.id!r} has observation space {obs_space}; a Box is needed")
    shape = obs_space.shape or ()
    if network == "nature_cnn" and len(shape) != 3:
        raise ConfigError(f"agent.network: nature_cnn needs (C, H, W) observations; {cfg.env.id!r} gives "
                          f"shape {shape}")


def epsilon_exploration(cfg: Config, actor_index: int | None) -> Exploration:
    """ε-greedy: in ``zmqrl train`` (``actor_index`` None) a linear decay over the agent section's
    ``eps_start``, ``eps_end`` and ``eps_decay_steps``; Ape-X's fixed ε per actor index otherwise,
    reached from ``eps_start`` over the actor's first ``actor.eps_decay_steps`` env steps."""
    ac: Any = cfg.agent
    if actor_index is None:
        return linear("epsilon", ac.eps_start, ac.eps_end, ac.eps_decay_steps)
    eps: float | np.ndarray
    if cfg.actor.eps_per_env:  # Ape-X's ladder over every env slot of every actor, not over actors
        envs = cfg.env.num_envs
        slots = actor_index * envs + np.arange(envs)
        eps = np.array([apex_epsilon(cfg.actor.eps, cfg.actor.eps_alpha, int(i), cfg.actor.num_actors * envs)
                        for i in slots])
    else:
        eps = apex_epsilon(cfg.actor.eps, cfg.actor.eps_alpha, actor_index, cfg.actor.num_actors)
    if cfg.actor.eps_decay_steps > 0:
        return linear("epsilon", np.maximum(ac.eps_start, eps), eps, cfg.actor.eps_decay_steps)
    return Exploration("epsilon", lambda _steps: eps)


def epsilon_greedy(greedy_actions: np.ndarray, epsilon: float | np.ndarray, rng: np.random.Generator,
                   num_actions: int) -> np.ndarray:
    """Replace each greedy action by a uniform random one with probability ``epsilon`` (scalar or per row)."""
    explore = rng.random(len(greedy_actions)) < epsilon
    if explore.any():
        greedy_actions[explore] = rng.integers(num_actions, size=int(explore.sum()))
    return greedy_actions


def apex_epsilon(eps: float, alpha: float, index: int, num_actors: int) -> float:
    """Ape-X exploration: actor i of N uses eps ** (1 + alpha * i / (N - 1)); one actor uses eps."""
    if num_actors <= 1:
        return eps
    return float(eps ** (1.0 + alpha * index / (num_actors - 1)))


def algorithm(name: str) -> Algorithm:
    """The algorithm registered as ``name`` (:mod:`zmqrl.config.algorithms`)."""
    return registry.entry(name)  # type: ignore[no-any-return]


def _torso_takers() -> list[str]:
    """The registered algorithms whose heads can sit on a torso of the user's own."""
    names = []
    for name in registry.ALGORITHMS:
        try:
            if algorithm(name).takes_torso:
                names.append(name)
        except Exception:  # an algorithm that cannot load here takes none
            continue
    return names
