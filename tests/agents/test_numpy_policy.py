"""The numpy acting path computes what the torch network computes, and keeps torch out of actors."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from zmqrl import config as config_mod
from zmqrl.agents.base import resolve_backend
from zmqrl.agents.dqn.agent import DQNPolicy
from zmqrl.agents.dqn.config import DQNConfig as AgentConfig
from zmqrl.agents.dqn.numpy_policy import NumpyMLPPolicy
from zmqrl.config import ConfigError
from zmqrl.run.acting import make_task

OBS = gym.spaces.Box(-5, 5, (6,), np.float32)
ACT = gym.spaces.Discrete(3)


@pytest.mark.parametrize("dueling", [True, False])
@pytest.mark.parametrize("hidden", [[16], [32, 16, 8]])
def test_numpy_forward_matches_torch(dueling: bool, hidden: list[int]) -> None:
    cfg = AgentConfig(hidden=hidden, dueling=dueling)
    reference = DQNPolicy(cfg, OBS, ACT, seed=3)
    policy = NumpyMLPPolicy(cfg, OBS, ACT, seed=0)
    policy.load_params(reference.params())
    obs = np.random.default_rng(1).uniform(-5, 5, (257, 6)).astype(np.float32)
    import torch

    with torch.no_grad():
        expected = reference.q(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(policy.q_values(obs), expected, rtol=1e-5, atol=1e-5)
    assert np.array_equal(policy.greedy(obs), expected.argmax(axis=1))
    batch = {"obs": obs[:64], "action": np.arange(64) % 3, "reward": np.linspace(-1, 1, 64, dtype=np.float32),
             "next_obs": obs[64:128], "discount": np.full(64, 0.97, np.float32)}
    np.testing.assert_allclose(policy.priorities(batch), reference.priorities(batch), rtol=1e-4, atol=1e-5)


def test_numpy_policy_rejects_mismatched_params_by_name() -> None:
    policy = NumpyMLPPolicy(AgentConfig(hidden=[16]), OBS, ACT)
    good = DQNPolicy(AgentConfig(hidden=[16]), OBS, ACT).params()
    with pytest.raises(ValueError, match="torso.0.weight"):
        policy.load_params({**good, "torso.0.weight": np.zeros((8, 6), np.float32)})
    with pytest.raises(ValueError, match="missing"):
        policy.load_params({k: v for k, v in good.items() if k != "head.value.bias"})


def test_epsilon_one_explores_uniformly_and_zero_is_greedy() -> None:
    policy = NumpyMLPPolicy(AgentConfig(hidden=[8]), OBS, ACT, seed=5)
    obs = np.zeros((3000, 6), np.float32)
    counts = np.bincount(policy.act(obs, 1.0), minlength=3)
    assert counts.min() > 900
    assert np.array_equal(policy.act(obs, 0.0), policy.greedy(obs))


def test_backend_choice() -> None:
    assert resolve_backend("auto", numpy_ok=True) == "numpy"
    assert resolve_backend("auto", numpy_ok=False) == "torch"
    assert resolve_backend("auto", numpy_ok=True, device="cuda") == "torch"
    task = make_task(config_mod.load("configs/cartpole_dqn.yaml"))
    assert isinstance(task.policy(0, backend="auto"), NumpyMLPPolicy)
    with pytest.raises(ConfigError, match="actor.backend: numpy needs an MLP"):
        resolve_backend("numpy", numpy_ok=False)


@pytest.mark.slow
def test_actor_and_evaluator_roles_do_not_import_torch() -> None:
    code = ("import sys; import zmqrl.roles.actor, zmqrl.roles.evaluator, zmqrl.roles.proxy; "
            "from zmqrl import config; from zmqrl.run.acting import make_task; "
            "cfg = config.load('configs/cartpole_dqn.yaml'); "
            "make_task(cfg).policy(0, backend=cfg.actor.backend); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
