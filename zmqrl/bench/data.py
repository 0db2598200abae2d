"""Real transitions to measure with, made in this process as the product makes them.

:func:`transition_pool` steps the configured env under a uniform random policy through the n-step
builder (what an actor's acting loop builds, without a policy); :func:`pong_transitions` runs a
config's own acting loop (its policy, n-step and initial priorities) and returns what its actor
would send; :func:`acted_items` the items of any config's acting loop (a recurrent policy's
sequence items too). The bench groups measure with these, and the tests take their real data from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from zmqrl.bench.harness import CONFIGS

if TYPE_CHECKING:
    from zmqrl.config import Config

TRANSITION_KEYS = ("obs", "action", "reward", "next_obs", "discount")  # what transition_pool returns


def uniform_actions(stepper: Any, rng: np.random.Generator) -> np.ndarray:
    """One uniformly random action per env of a vector (dtype as the single env's action space)."""
    space = stepper.vec.single_action_space
    space.seed(int(rng.integers(2**31)))
    return np.stack([np.asarray(space.sample()) for _ in range(stepper.num_envs)])


def transition_pool(cfg: Config, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` real n-step transitions of the configured env under a uniform random policy, as actors build
    them (:data:`TRANSITION_KEYS`, contiguous arrays)."""
    from zmqrl.envs.factory import make_vector_env
    from zmqrl.envs.stepper import VectorStepper
    from zmqrl.run.adders import NStepBuilder

    stepper = VectorStepper(make_vector_env(cfg.env, cfg.env.num_envs, seed), seed)
    nstep = NStepBuilder(cfg.env.num_envs, cfg.agent.n_step, cfg.agent.gamma)
    rng = np.random.default_rng(seed)
    parts, count = [], 0
    try:
        while count < n:
            step = stepper.step(uniform_actions(stepper, rng))
            out = nstep.push(step.obs, step.action, step.reward, step.next_obs, step.terminated, step.truncated)
            if out is not None:
                parts.append(out)
                count += len(out["reward"])
    finally:
        stepper.close()
    return {k: np.ascontiguousarray(np.concatenate([p[k] for p in parts])[:n]) for k in TRANSITION_KEYS}


def acted_items(cfg: Config, n: int, seed: int = 0, priorities: bool = False) -> dict[str, np.ndarray]:
    """``n`` items of a config's acting loop (its policy acting for actor 0, on ``actor.backend``), in the order
    an actor batches them: n-step transitions (with ``priorities``, their initial ones where the loop makes
    them), or a recurrent policy's sequence items."""
    from zmqrl.run.acting import ActingLoop, make_task

    task = make_task(cfg)
    loop = ActingLoop(cfg, task.policy(seed, backend=cfg.actor.backend), task.exploration(0), seed,
                      priorities=priorities)
    parts, got = [], 0
    try:
        while got < n:
            acted = loop.step()
            if acted.transitions is not None:
                parts.append(acted.transitions)
                got += len(acted.transitions["reward"])
    finally:
        loop.close()
    return {k: np.ascontiguousarray(np.concatenate([p[k] for p in parts])[:n]) for k in parts[0]}


def pong_transitions(n: int, seed: int = 1, config: str | Path = CONFIGS / "pong_dqn.yaml"
                     ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The run's batch spec and ``n`` transitions of a config's actor (the shipped Pong config unless
    given): its acting loop, with n-step and initial priorities, in the order an actor batches them."""
    from zmqrl.config import load
    from zmqrl.run.acting import make_task

    cfg = load(config, [])
    return dict(make_task(cfg).batch_spec()), acted_items(cfg, n, seed, priorities=True)
