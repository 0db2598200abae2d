"""Tests for IQN: the quantile Huber loss, the cosine embedding, the numpy policy, the config, and learning.

The slow tests train CartPole-v1 with the shipped config: ``zmqrl train`` on seeds 0, 1, 2 and one
``zmqrl local --actors 2`` run must reach a greedy evaluation mean >= 475 over 10 episodes.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml

from procs import REPO, Procs, log_tail, zmqrl_argv
from rigs import perturb_target
from tiers import nightly, seeds
from zmqrl import cli
from zmqrl import config as config_mod
from zmqrl.agents.base import algorithm
from zmqrl.agents.dqn.networks import NatureCNNQNetwork
from zmqrl.agents.iqn import ALGORITHM as IQN_ALGO
from zmqrl.agents.iqn.agent import IQNAgent, IQNPolicy, quantile_huber_loss
from zmqrl.agents.iqn.config import IQNConfig
from zmqrl.agents.iqn.networks import IQNNetwork, cosine_features
from zmqrl.agents.iqn.numpy_policy import NumpyIQNPolicy, midpoint_taus
from zmqrl.agents.iqn.numpy_policy import cosine_features as np_cosine_features
from zmqrl.config import ConfigError
from zmqrl.run.acting import make_task
from zmqrl.run.rundir import read_json

CARTPOLE_IQN = REPO / "configs" / "cartpole_iqn.yaml"
OBS_SPACE = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
ACT_SPACE = gym.spaces.Discrete(3)


def agent_cfg(**kw: object) -> IQNConfig:
    base: dict[str, object] = {"hidden": [16, 16], "head_hidden": [16], "embed_dim": 8, "n_quantiles": 6,
                               "n_target_quantiles": 5, "n_act_quantiles": 4, "lr": 1e-2,
                               "target_update_interval": 1000}
    base.update(kw)
    return IQNConfig(**base)  # type: ignore[arg-type]


def run_cfg(*overrides: str) -> config_mod.Config:
    return config_mod.load(CARTPOLE_IQN, list(overrides))


def make_batch(n: int = 32, seed: int = 0, weights: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    batch: dict[str, np.ndarray] = {
        "obs": rng.normal(size=(n, 4)).astype(np.float32),
        "action": rng.integers(3, size=n).astype(np.int64),
        "reward": (3.0 * rng.normal(size=n)).astype(np.float32),  # some |errors| beyond kappa
        "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
        "discount": np.where(np.arange(n) % 3 == 0, 0.0, 0.99 ** 3).astype(np.float32),
    }
    if weights:
        batch["weights"] = rng.uniform(0.1, 1.0, size=n).astype(np.float32)
    return batch



def net_params(net: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def same_params(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def quantiles(net: torch.nn.Module, obs: np.ndarray, taus: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return net(torch.as_tensor(obs), taus).numpy().astype(np.float64)


# ---------------------------------------------------------------- the loss, by brute force


def rho_loop(u: float, tau: float, kappa: float) -> float:
    """eq. (10) of Dabney et al. (2018) for one pair, written out."""
    huber = 0.5 * u * u if abs(u) <= kappa else kappa * (abs(u) - 0.5 * kappa)
    indicator = 1.0 if u < 0 else 0.0
    return abs(tau - indicator) * huber / kappa


@pytest.mark.parametrize("kappa", [1.0, 0.5, 2.0])
def test_quantile_huber_terms_match_loops(kappa: float) -> None:
    gen = torch.Generator().manual_seed(0)
    target = 3 * torch.randn(4, 5, generator=gen, dtype=torch.float64)
    pred = 3 * torch.randn(4, 6, generator=gen, dtype=torch.float64)
    taus = torch.rand(4, 6, generator=gen, dtype=torch.float64)
    rho = quantile_huber_loss(target, pred, taus, kappa).numpy()
    assert rho.shape == (4, 5, 6)  # (batch, target j, prediction i)
    for b in range(4):
        for j in range(5):
            for i in range(6):
                u = float(target[b, j] - pred[b, i])
                assert rho[b, j, i] == pytest.approx(rho_loop(u, float(taus[b, i]), kappa), rel=1e-12, abs=1e-12)
    errors = (target.unsqueeze(2) - pred.unsqueeze(1)).abs()
    assert (errors < kappa).any() and (errors > kappa).any()  # both branches of the Huber loss were used


@pytest.mark.parametrize("double", [False, True])
def test_update_loss_and_priorities_match_brute_force(double: bool) -> None:
    """The learner's loss (sum over N predictions, mean over N' targets, weighted mean over the batch)
    and the priorities it returns (that loss over N * N' pairs) against loops in float64."""
    cfg = agent_cfg(double=double, kappa=1.0)
    agent = IQNAgent(cfg, OBS_SPACE, ACT_SPACE, seed=0)
    perturb_target(agent)
    batch = make_batch(16, seed=1, weights=True)
    b, n, n_t = 16, cfg.n_quantiles, cfg.n_target_quantiles
    # the fractions the update will draw: target ones first, then the predictions'
    gen = torch.Generator().manual_seed(0)
    gen.set_state(agent.tau_rng.get_state())
    target_taus = torch.rand(b, n_t, generator=gen)
    taus = torch.rand(b, n, generator=gen)
    z_next = quantiles(agent.target, batch["next_obs"], target_taus)  # (B, N', A)
    chooser = quantiles(agent.q, batch["next_obs"], target_taus) if double else z_next
    z = quantiles(agent.q, batch["obs"], taus)  # (B, N, A)
    expected_loss, expected_prio, q_taken = 0.0, np.zeros(b), np.zeros(b)
    for row in range(b):
        best = int(np.argmax(chooser[row].mean(axis=0)))
        per_sample = 0.0
        for i in range(n):
            pred = z[row, i, batch["action"][row]]
            q_taken[row] += pred / n
            for j in range(n_t):
                target = float(batch["reward"][row]) + float(batch["discount"][row]) * z_next[row, j, best]
                per_sample += rho_loop(target - pred, float(taus[row, i]), cfg.kappa) / n_t
        expected_loss += float(batch["weights"][row]) * per_sample / b
        expected_prio[row] = per_sample / n
    metrics, priorities = agent.update(batch)
    assert metrics["loss"] == pytest.approx(expected_loss, rel=1e-4)
    assert metrics["q_mean"] == pytest.approx(float(q_taken.mean()), rel=1e-4, abs=1e-5)
    assert priorities.dtype == np.float32 and priorities.shape == (b,)
    np.testing.assert_allclose(priorities, expected_prio, rtol=1e-4, atol=1e-6)
    assert set(metrics) == {"loss", "q_mean", "td_abs_mean", "grad_norm", "skipped"} and metrics["grad_norm"] > 0
    assert metrics["skipped"] == 0


def test_double_and_plain_targets_differ() -> None:
    batch = make_batch(64, seed=2)
    losses = []
    for double in (False, True):
        agent = IQNAgent(agent_cfg(double=double), OBS_SPACE, ACT_SPACE, seed=3)
        perturb_target(agent)
        losses.append(agent.update(batch)[0]["loss"])
    assert losses[0] != pytest.approx(losses[1], rel=1e-6)


@pytest.mark.slow
def test_quantiles_learn_a_known_return_distribution() -> None:
    """One state, rewards uniform in [0, 10), no bootstrapping: Z_tau must approach 10 * tau.
    A wrong sign of the indicator (or a swapped sum and mean) ends elsewhere."""
    cfg = agent_cfg(n_quantiles=16, n_target_quantiles=16, lr=3e-3, hidden=[32], head_hidden=[32], embed_dim=32)
    agent = IQNAgent(cfg, OBS_SPACE, ACT_SPACE, seed=4)
    rng = np.random.default_rng(5)
    n = 128
    obs = np.full((n, 4), 0.5, np.float32)
    for _ in range(600):
        agent.update({"obs": obs, "action": np.zeros(n, np.int64), "reward": rng.uniform(0, 10, n).astype(np.float32),
                      "next_obs": obs, "discount": np.zeros(n, np.float32)})
    probe = np.array([[0.1, 0.25, 0.5, 0.75, 0.9]], np.float32)
    z = agent.quantile_values(obs[:1], probe)[0, :, 0]
    np.testing.assert_allclose(z, 10 * probe[0], atol=0.8)
    assert agent.q_values(obs[:1])[0, 0] == pytest.approx(5.0, abs=0.5)


def test_importance_weights_scale_the_loss_not_the_priorities() -> None:
    batch = make_batch(32, seed=4)
    ones = IQNAgent(agent_cfg(), OBS_SPACE, ACT_SPACE, seed=5)
    twos = IQNAgent(agent_cfg(), OBS_SPACE, ACT_SPACE, seed=5)
    m1, p1 = ones.update({**batch, "weights": np.ones(32, dtype=np.float32)})
    m2, p2 = twos.update({**batch, "weights": np.full(32, 2.0, dtype=np.float32)})
    assert m2["loss"] == pytest.approx(2 * m1["loss"], rel=1e-5)
    np.testing.assert_allclose(p1, p2)
    plain = IQNAgent(agent_cfg(), OBS_SPACE, ACT_SPACE, seed=5)
    assert plain.update(batch)[0]["loss"] == pytest.approx(m1["loss"], rel=1e-6)


def test_gradients_are_clipped() -> None:
    batch = make_batch(32, seed=8)  # the quantile Huber loss bounds each pair's gradient by 1: norms stay small
    agent = IQNAgent(agent_cfg(max_grad_norm=0.05), OBS_SPACE, ACT_SPACE, seed=8)
    metrics, _ = agent.update(batch)
    assert metrics["grad_norm"] > 0.05  # the reported norm is the one before clipping
    grads = [p.grad for p in agent.q.parameters() if p.grad is not None]
    assert float(torch.norm(torch.stack([g.norm() for g in grads]))) == pytest.approx(0.05, rel=1e-3)


# ---------------------------------------------------------------- target network


def test_hard_target_update_after_interval_only() -> None:
    agent = IQNAgent(agent_cfg(target_update_interval=3, tau=1.0), OBS_SPACE, ACT_SPACE, seed=10)
    initial = net_params(agent.target)
    assert same_params(initial, net_params(agent.q))
    for i in range(2):
        agent.update(make_batch(16, seed=20 + i))
        assert same_params(initial, net_params(agent.target))
    agent.update(make_batch(16, seed=22))
    assert agent.opt_steps == 3 and same_params(net_params(agent.q), net_params(agent.target))
    assert all(not p.requires_grad for p in agent.target.parameters())


def test_soft_target_update_is_polyak_average() -> None:
    agent = IQNAgent(agent_cfg(target_update_interval=1, tau=0.25), OBS_SPACE, ACT_SPACE, seed=11)
    perturb_target(agent)
    old_target = net_params(agent.target)
    agent.update(make_batch(16, seed=30))
    for t, old, q in zip(net_params(agent.target), old_target, net_params(agent.q), strict=True):
        torch.testing.assert_close(t, 0.75 * old + 0.25 * q)


# ---------------------------------------------------------------- networks


def test_cosine_embedding_shape_and_values() -> None:
    taus = torch.tensor([[0.0, 0.25, 0.5], [0.1, 0.9, 1.0]])
    emb = cosine_features(taus, 64)
    assert emb.shape == (2, 3, 64) and emb.dtype == torch.float32
    for b in range(2):
        for t in range(3):
            for i in range(64):
                assert float(emb[b, t, i]) == pytest.approx(math.cos(math.pi * i * float(taus[b, t])), abs=2e-5)
    assert torch.all(emb[..., 0] == 1.0)  # i = 0: the constant feature
    np.testing.assert_allclose(np_cosine_features(taus.numpy(), 64), emb.numpy(), atol=2e-6)


def test_network_is_torso_times_embedding_then_head() -> None:
    cfg = IQNConfig(hidden=[32, 24], head_hidden=[16])
    net = IQNPolicy(cfg, OBS_SPACE, ACT_SPACE, seed=0).q
    assert isinstance(net, IQNNetwork)
    assert net.embed.in_features == 64 and net.embed.out_features == 24  # cos(pi i tau), i < 64 -> features
    obs = torch.as_tensor(make_batch(5)["obs"])
    taus = torch.rand(5, 7, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = net(obs, taus)
        by_hand = net.head(net.torso(obs).unsqueeze(1) * torch.relu(net.embed(cosine_features(taus, 64))))
    assert out.shape == (5, 7, 3)
    torch.testing.assert_close(out, by_hand)
    # the quantile function is not constant in tau (the embedding reaches the output)
    assert not torch.allclose(out[:, 0], out[:, 1])


def test_nature_cnn_reuses_dqns_torso_and_scales_frames() -> None:
    space = gym.spaces.Box(0, 255, shape=(4, 84, 84), dtype=np.uint8)
    agent = IQNAgent(agent_cfg(network="nature_cnn"), space, gym.spaces.Discrete(6), seed=0)
    dqn_torso = NatureCNNQNetwork(4, 6, dueling=False).torso
    assert [type(m) for m in agent.q.torso] == [type(m) for m in dqn_torso]
    assert {k: v.shape for k, v in agent.q.torso.state_dict().items()} == \
        {k: v.shape for k, v in dqn_torso.state_dict().items()}
    assert agent.q.embed.out_features == 3136
    obs = np.random.default_rng(0).integers(0, 256, size=(2, 4, 84, 84), dtype=np.uint8)
    with torch.no_grad():
        torch.testing.assert_close(agent.q.features(torch.as_tensor(obs)),
                                   agent.q.torso(torch.as_tensor(obs).float() / 255.0))
    q = agent.q_values(obs)
    assert q.shape == (2, 6)
    np.testing.assert_array_equal(agent.greedy(obs), q.argmax(axis=1))
    batch = {"obs": obs, "action": np.array([0, 5]), "reward": np.array([1.0, 0.0], dtype=np.float32),
             "next_obs": obs[::-1].copy(), "discount": np.array([0.99, 0.0], dtype=np.float32)}
    _, priorities = agent.update(batch)
    assert priorities.shape == (2,)
    with pytest.raises(ConfigError, match="agent.network: nature_cnn needs"):
        make_task(run_cfg("agent.network=nature_cnn"))


# ---------------------------------------------------------------- the numpy policy


@pytest.mark.parametrize("hidden,head_hidden", [([16], [8]), ([32, 16], []), ([64, 64], [64])])
def test_numpy_policy_matches_torch(hidden: list[int], head_hidden: list[int]) -> None:
    cfg = IQNConfig(hidden=hidden, head_hidden=head_hidden, n_act_quantiles=32)
    reference = IQNPolicy(cfg, gym.spaces.Box(-5, 5, (6,), np.float32), ACT_SPACE, seed=3)
    rng = np.random.default_rng(3)  # wider than the default init, so greedy actions vary between observations
    reference.load_params({k: (0.5 * rng.standard_normal(v.shape)).astype(np.float32)
                           for k, v in reference.params().items()})
    policy = NumpyIQNPolicy(cfg, gym.spaces.Box(-5, 5, (6,), np.float32), ACT_SPACE, seed=0)
    policy.load_params(reference.params())
    obs = np.random.default_rng(1).uniform(-5, 5, (257, 6)).astype(np.float32)
    taus = np.random.default_rng(2).random((257, 32), dtype=np.float32)
    expected = reference.quantile_values(obs, taus)
    scale = float(np.abs(expected).max())  # float32 sums of large terms: compare on the scale of the outputs
    np.testing.assert_allclose(policy.quantile_values(obs, taus), expected, rtol=1e-5, atol=2e-6 * scale)
    q = reference.q_values(obs, taus)
    np.testing.assert_allclose(policy.q_values(obs, taus), q, rtol=1e-5, atol=2e-6 * scale)
    assert np.array_equal(policy.q_values(obs, taus).argmax(axis=1), q.argmax(axis=1))
    assert len(np.unique(q.argmax(axis=1))) > 1  # the comparison is not vacuous
    # greedy: the K midpoints, in both
    np.testing.assert_allclose(policy.q_values(obs), reference.q_values(obs, midpoint_taus(32)), rtol=1e-5,
                               atol=2e-6 * scale)
    np.testing.assert_array_equal(policy.greedy(obs), reference.greedy(obs))
    batch = {"obs": obs[:64], "action": np.arange(64) % 3, "reward": np.linspace(-3, 3, 64, dtype=np.float32),
             "next_obs": obs[64:128], "discount": np.full(64, 0.97, np.float32)}
    np.testing.assert_allclose(policy.priorities(batch), reference.priorities(batch), rtol=1e-4, atol=1e-6)


def test_numpy_and_torch_policies_act_alike_for_a_seed() -> None:
    """Both draw the acting fractions and the exploring rows from one numpy RNG in the same order."""
    cfg = IQNConfig(hidden=[16], head_hidden=[16])
    reference = IQNPolicy(cfg, OBS_SPACE, ACT_SPACE, seed=7)
    policy = NumpyIQNPolicy(cfg, OBS_SPACE, ACT_SPACE, seed=7)
    policy.load_params(reference.params())
    obs = make_batch(300, seed=3)["obs"]
    for eps in (0.0, 0.3, np.linspace(0, 1, 300)):
        np.testing.assert_array_equal(policy.act(obs, eps), reference.act(obs, eps))


def test_greedy_is_deterministic_and_act_samples_fractions() -> None:
    policy = NumpyIQNPolicy(IQNConfig(hidden=[16], head_hidden=[16]), OBS_SPACE, ACT_SPACE, seed=1)
    obs = make_batch(500, seed=4)["obs"]
    np.testing.assert_array_equal(policy.greedy(obs), policy.greedy(obs))
    actions = policy.act(obs, 0.0)
    assert actions.shape == (500,) and actions.dtype == np.int64 and ((actions >= 0) & (actions < 3)).all()
    counts = np.bincount(policy.act(np.zeros((3000, 4), np.float32), 1.0), minlength=3)
    assert (np.abs(counts - 1000) < 150).all(), counts


def test_initial_params_fit_the_torch_agent() -> None:
    cfg = run_cfg()
    task = make_task(cfg)
    initial = task.initial_params()
    assert initial is not None
    agent = task.agent()
    own = agent.params()
    assert {k: v.shape for k, v in initial.items()} == {k: v.shape for k, v in own.items()}
    for name, array in initial.items():
        assert array.dtype == np.float32, name
        fan_in = initial[name.rsplit(".", 1)[0] + ".weight"].shape[1]
        bound = 1.0 / math.sqrt(fan_in)
        assert np.abs(array).max() <= bound, name  # torch's default init: uniform within 1/sqrt(fan_in)
        if array.size >= 64:
            assert np.abs(array).max() > 0.9 * bound and abs(float(array.mean())) < 0.2 * bound, name
    agent.adopt_initial(initial)
    for name, array in agent.params().items():
        np.testing.assert_array_equal(array, initial[name])
    assert same_params(net_params(agent.q), net_params(agent.target))
    assert IQN_ALGO.initial_params(run_cfg("agent.network=nature_cnn"), task.obs_space, task.action_space, 0) is None
    policy = task.policy(0, backend="numpy")
    assert isinstance(policy, NumpyIQNPolicy)
    policy.load_params(initial)


def test_numpy_policy_rejects_mismatched_params_by_name() -> None:
    policy = NumpyIQNPolicy(IQNConfig(hidden=[16]), OBS_SPACE, ACT_SPACE)
    good = IQNPolicy(IQNConfig(hidden=[16]), OBS_SPACE, ACT_SPACE).params()
    with pytest.raises(ValueError, match="embed.weight"):
        policy.load_params({**good, "embed.weight": np.zeros((16, 8), np.float32)})
    with pytest.raises(ValueError, match="missing"):
        policy.load_params({k: v for k, v in good.items() if k != "head.2.bias"})


@pytest.mark.slow
def test_actor_with_iqn_does_not_import_torch() -> None:
    code = ("import sys; import zmqrl.roles.actor; from zmqrl import config; from zmqrl.run.acting import make_task; "
            f"cfg = config.load({str(CARTPOLE_IQN)!r}); task = make_task(cfg); p = task.policy(0); "
            "task.initial_params(); p.act(__import__('numpy').zeros((4, 4), 'float32'), 0.1); "
            "print(type(p).__name__, sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         cwd=REPO)
    assert out.stdout.strip() == "NumpyIQNPolicy []", out.stdout + out.stderr


# ---------------------------------------------------------------- parameters and state


def test_state_dict_round_trip_gives_identical_updates() -> None:
    cfg = agent_cfg(target_update_interval=2)
    a = IQNAgent(cfg, OBS_SPACE, ACT_SPACE, seed=17)
    for i in range(3):
        a.update(make_batch(32, seed=50 + i))
    a.act(make_batch(8)["obs"], 0.5)  # advance the acting RNG
    b = IQNAgent(cfg, OBS_SPACE, ACT_SPACE, seed=18)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    for i in range(3):
        batch = make_batch(32, seed=60 + i, weights=True)
        ma, pa = a.update(batch)
        mb, pb = b.update(batch)
        assert ma == mb
        np.testing.assert_array_equal(pa, pb)
    assert same_params(net_params(a.q), net_params(b.q))
    obs = make_batch(100, seed=70)["obs"]
    np.testing.assert_array_equal(a.act(obs, 0.5), b.act(obs, 0.5))


def test_load_params_wrong_shape_names_the_parameter() -> None:
    policy = IQNPolicy(agent_cfg(), OBS_SPACE, ACT_SPACE, seed=0)
    params = policy.params()
    params["embed.weight"] = np.zeros((16, 3), dtype=np.float32)
    with pytest.raises(ValueError, match=r"embed\.weight"):
        policy.load_params(params)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
def test_update_on_cuda_matches_cpu_for_the_same_fractions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same fractions give the same step on either device (each draws its own on the device, so
    both take them from one CPU generator here, so the CUDA agent runs eagerly: a graph cannot hold a
    host draw); the CUDA fraction generator survives a round trip."""
    cpu = IQNAgent(agent_cfg(), OBS_SPACE, ACT_SPACE, "cpu", seed=3)
    gpu = IQNAgent(agent_cfg(compile="none"), OBS_SPACE, ACT_SPACE, "cuda", seed=3)
    gpu.q.load_state_dict(cpu.q.state_dict())
    gpu.target.load_state_dict(cpu.target.state_dict())
    for agent in (cpu, gpu):
        gen = torch.Generator().manual_seed(9)
        monkeypatch.setattr(agent, "_draw", lambda rows, k, gen=gen, agent=agent:
                            torch.rand(rows, k, generator=gen).to(agent.device))
    for i in range(5):
        batch = make_batch(32, seed=80 + i, weights=True)
        m_cpu, p_cpu = cpu.update(batch)
        m_gpu, p_gpu = gpu.update(batch)
        np.testing.assert_allclose(p_gpu, p_cpu, rtol=1e-4, atol=1e-5)
        assert m_gpu["loss"] == pytest.approx(m_cpu["loss"], rel=1e-4, abs=1e-6)
    a = IQNAgent(agent_cfg(), OBS_SPACE, ACT_SPACE, "cuda", seed=4)
    a.update(make_batch(32, seed=90))
    b = IQNAgent(agent_cfg(), OBS_SPACE, ACT_SPACE, "cuda", seed=5)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    batch = make_batch(32, seed=91)
    np.testing.assert_allclose(a.update(batch)[1], b.update(batch)[1], rtol=1e-6)  # the same fractions drawn


# ---------------------------------------------------------------- config and seam


def test_config_rejects_keys_of_other_algorithms() -> None:
    with pytest.raises(ConfigError, match="key 'dueling' belongs to agent.algo=dqn, not iqn"):
        run_cfg("agent.dueling=true")
    with pytest.raises(ConfigError, match="key 'actor_lr' belongs to agent.algo=sac, not iqn"):
        run_cfg("agent.actor_lr=3e-4")
    with pytest.raises(ConfigError, match="did you mean 'n_quantiles'"):
        run_cfg("agent.n_quantile=8")
    # and DQN refuses IQN's own keys
    with pytest.raises(ConfigError, match="key 'kappa' belongs to agent.algo=iqn, not dqn"):
        config_mod.load(REPO / "configs" / "cartpole_dqn.yaml", ["agent.kappa=1.0"])


@pytest.mark.parametrize("override,fragment", [("agent.kappa=0", "agent.kappa must be > 0"),
                                               ("agent.n_quantiles=0", "agent.n_quantiles must be > 0"),
                                               ("agent.n_act_quantiles=0", "agent.n_act_quantiles must be > 0"),
                                               ("agent.embed_dim=0", "agent.embed_dim must be > 0"),
                                               ("agent.tau=1.5", "agent.tau must be within"),
                                               ("agent.network=resnet", "agent.network must be one of")])
def test_config_range_checks(override: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        run_cfg(override)


def test_layer_sizes_are_checked_at_start() -> None:
    with pytest.raises(ConfigError, match=r"agent.head_hidden: layer sizes must be > 0"):
        make_task(run_cfg("agent.head_hidden=[0]"))


def test_zmqrl_config_iqn_lists_its_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config", "iqn"]) == 0
    text = capsys.readouterr().out
    assert yaml.safe_load(text) == {"agent": dataclasses.asdict(IQNConfig())}
    for f in dataclasses.fields(IQNConfig):
        assert f"\n  {f.name}: " in text, f.name
    assert "agent.algo=iqn" in text
    assert algorithm("iqn").config_class is IQNConfig
    assert cli.main(["config"]) == 0
    assert "#   iqn " in capsys.readouterr().out


def test_seam_refuses_continuous_actions_and_explores_like_apex() -> None:
    with pytest.raises(ConfigError, match=r"env.id: 'Pendulum-v1' .*agent.algo=iqn needs a Discrete"):
        make_task(run_cfg("env.id=Pendulum-v1"))
    cfg = run_cfg("actor.num_actors=4")
    assert [IQN_ALGO.exploration(cfg, i)(0) for i in range(4)] == \
        [algorithm("dqn").exploration(cfg, i)(0) for i in range(4)]
    schedule = IQN_ALGO.exploration(cfg, None)
    assert schedule.name == "epsilon" and schedule(0) == cfg.agent.eps_start  # type: ignore[attr-defined]
    assert schedule(10**9) == cfg.agent.eps_end  # type: ignore[attr-defined]
    task = make_task(cfg)
    assert type(task.agent()) is IQNAgent and type(task.policy(0, backend="torch")) is IQNPolicy
    assert isinstance(task.policy(0), NumpyIQNPolicy)  # auto: numpy for the MLP on the CPU


# ---------------------------------------------------------------- learning


def first_solved(summary: dict) -> dict | None:
    return next((e for e in summary["evals"] if e["return_mean"] >= 475.0), None)


@pytest.mark.slow
@pytest.mark.timeout(600)
@nightly("IQN solving CartPole: test_local_solves_cartpole below; `zmqrl train` learning: "
         "tests/run/test_train.py::test_cartpole_learns and tests/system/test_learning_images.py::"
         "test_train_learns_catch_from_pixels[catch_dqn]")
@pytest.mark.parametrize("seed", seeds(0, 1, 2))
def test_train_solves_cartpole(tmp_path: Path, procs: Procs, seed: int) -> None:
    run_dir = tmp_path / "run"
    argv = zmqrl_argv("train", "--run-dir", str(run_dir), overrides=[f"run.seed={seed}"], config=CARTPOLE_IQN)
    started = time.monotonic()
    train = procs.start("train", argv)
    rc = train.wait(560)
    assert rc == 0, f"zmqrl train exited with {rc}\n{train.tail()}"
    summary = read_json(run_dir / "summary.json")
    assert summary is not None
    solved = first_solved(summary)
    assert solved is not None, f"seed {seed}: no evaluation >= 475 in {summary['evals']}"
    assert summary["stop_reason"].startswith("evaluation reached stop_return")
    print(f"seed {seed}: eval {solved['return_mean']:.1f} at {solved['env_steps']} env steps, "
          f"{solved['opt_steps']} opt steps, {time.monotonic() - started:.0f}s wall")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_local_solves_cartpole(tmp_path: Path, procs: Procs) -> None:
    run_dir = tmp_path / "run"
    procs.sweep_args.append(str(run_dir))
    argv = zmqrl_argv("local", "--actors", "2", "--run-dir", str(run_dir), overrides=["run.seed=0"],
                      config=CARTPOLE_IQN)
    started = time.monotonic()
    local = procs.start("local", argv)
    rc = local.wait(560)
    logs = "\n".join(f"--- {p.name}\n{log_tail(p, 15)}" for p in sorted((run_dir / "logs").glob("*.log")))
    assert rc == 0, f"zmqrl local exited with {rc}\n{procs.describe()}\n{logs}"
    summary = read_json(run_dir / "summary.json")
    assert summary is not None
    solved = first_solved(summary)
    assert solved is not None, summary["evals"]
    assert "stop_return" in summary["stop_reason"]
    assert summary["messages"]["rejected_total"] == 0 and summary["messages"]["config_mismatches"] == 0
    print(f"zmqrl local: eval {solved['return_mean']:.1f} at {solved['env_steps']} env steps, "
          f"{solved['opt_steps']} opt steps, {time.monotonic() - started:.0f}s wall")
