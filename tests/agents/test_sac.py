"""Tests for SAC: the squashed log-probability, the three losses against hand computations,
targets, acting in the Box's bounds (numpy and torch alike), parameters, state and exploration."""

from __future__ import annotations

import copy
import io
import math
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from zmqrl import config
from zmqrl.agents.base import algorithm, resolve_backend
from zmqrl.agents.sac import SAC
from zmqrl.agents.sac.agent import SACAgent, SACPolicy, squash_log_prob
from zmqrl.agents.sac.config import SACConfig
from zmqrl.agents.sac.networks import stack_separate_critics
from zmqrl.agents.sac.numpy_policy import NumpySACPolicy
from zmqrl.config import Config, ConfigError

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
# non-symmetric bounds: the scale to [low, high] and back must really happen
ACT_SPACE = gym.spaces.Box(low=np.array([0.0, -2.0], np.float32), high=np.array([1.0, 2.0], np.float32))
LOW, HIGH = ACT_SPACE.low.astype(np.float64), ACT_SPACE.high.astype(np.float64)
SAC_ALGO = algorithm("sac")


def sac_cfg(**kw: object) -> SACConfig:
    base: dict[str, object] = {"hidden": [32, 32], "actor_lr": 1e-3, "critic_lr": 1e-3, "alpha_lr": 1e-3}
    base.update(kw)
    return SACConfig(**base)  # type: ignore[arg-type]


def run_cfg(env_id: str = "Pendulum-v1", **agent: object) -> Config:
    return config.from_dict({"env": {"id": env_id}, "agent": {"algo": "sac", "hidden": [32, 32], **agent},
                             "trainer": {"warmup": 256}})


def make_agent(seed: int = 0, **kw: object) -> SACAgent:
    return SACAgent(sac_cfg(**kw), OBS_SPACE, ACT_SPACE, seed=seed)


def make_batch(n: int = 64, seed: int = 0, weights: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    batch: dict[str, np.ndarray] = {
        "obs": rng.normal(size=(n, 3)).astype(np.float32),
        "action": rng.uniform(ACT_SPACE.low, ACT_SPACE.high, size=(n, 2)).astype(np.float32),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": rng.normal(size=(n, 3)).astype(np.float32),
        # a mix of terminal rows (discount 0) and bootstrapping rows
        "discount": np.where(np.arange(n) % 3 == 0, 0.0, 0.99 ** 3).astype(np.float32),
    }
    if weights:
        batch["weights"] = rng.uniform(0.1, 1.0, size=n).astype(np.float32)
    return batch


def params_of(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def perturb(module: nn.Module, seed: int, scale: float = 0.3) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))


# ---------------------------------------------------------------- hand computations (float64)


def hand_log_prob(mean: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Squashed action and log pi: Gaussian log-density of u minus sum log(1 - tanh(u)^2)."""
    std = log_std.exp()
    u = mean + std * noise
    gaussian = -0.5 * ((u - mean) / std) ** 2 - torch.log(std) - 0.5 * math.log(2 * math.pi)
    return torch.tanh(u), (gaussian - torch.log(1 - torch.tanh(u) ** 2)).sum(1)


@torch.no_grad()
def actor_out(actor: nn.Module, obs: np.ndarray, lo: float = -20.0, hi: float = 2.0) -> tuple[torch.Tensor, ...]:
    """Mean and clamped log-std from the actor's layers, applied one by one in float64."""
    a = copy.deepcopy(actor).double()
    x = torch.as_tensor(obs, dtype=torch.float64)
    for layer in a.torso:
        x = layer(x)
    return a.mean(x), a.log_std(x).clamp(lo, hi)


@torch.no_grad()
def q_of(critics: nn.Module, obs: np.ndarray | torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """Every critic's Q in float64, shape (n, batch): MLP over [obs, action]."""
    x0 = torch.cat([torch.as_tensor(obs, dtype=torch.float64), action.double()], dim=1)
    qs = []
    for i in range(critics.n):  # critic i: its slice of every layer's stacked weight and bias
        x = x0
        for layer, (w, b) in enumerate(zip(critics.weights, critics.biases, strict=True)):
            x = x @ w[i].double() + b[i, 0].double()
            x = x if layer == len(critics.weights) - 1 else x.clamp_min(0.0)
        qs.append(x.squeeze(1))
    return torch.stack(qs)


def to_unit(action: np.ndarray) -> torch.Tensor:
    """Env action -> [-1, 1]: 2 (a - low) / (high - low) - 1."""
    return torch.as_tensor(2.0 * (action.astype(np.float64) - LOW) / (HIGH - LOW) - 1.0)


# ---------------------------------------------------------------- the squashed log-probability


def test_squash_log_prob_matches_tanh_transformed_normal() -> None:
    gen = torch.Generator().manual_seed(0)
    mean = torch.randn(500, 3, generator=gen, dtype=torch.float64)
    log_std = torch.empty(500, 3, dtype=torch.float64).uniform_(-2.0, 0.5, generator=gen)
    noise = torch.randn(500, 3, generator=gen, dtype=torch.float64)
    u = mean + log_std.exp() * noise
    dist = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()), [torch.distributions.TanhTransform(cache_size=1)])
    expected = dist.log_prob(torch.tanh(u)).sum(1)  # cache: the transform inverts to u exactly
    got = squash_log_prob(noise, log_std, u)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
    # the same thing written out: Normal log-density minus sum log(1 - tanh^2)
    torch.testing.assert_close(got, hand_log_prob(mean, log_std, noise)[1], rtol=1e-9, atol=1e-9)
    # and the density of the action scaled to [low, high] is this minus sum log((high - low) / 2)
    scale = torch.as_tensor((HIGH - LOW) / 2)
    scaled = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean[:, :2], log_std[:, :2].exp()),
        [torch.distributions.TanhTransform(cache_size=1),
         torch.distributions.AffineTransform(torch.as_tensor(LOW) + scale, scale)])
    u2 = u[:, :2]
    env_action = torch.as_tensor(LOW) + scale * (torch.tanh(u2) + 1)
    torch.testing.assert_close(squash_log_prob(noise[:, :2], log_std[:, :2], u2) - torch.log(scale).sum(),
                               scaled.log_prob(env_action).sum(1), rtol=1e-7, atol=1e-7)


def test_squash_log_prob_stays_finite_where_tanh_saturates() -> None:
    u = torch.tensor([[30.0, -30.0], [15.0, 0.0]])  # float32 tanh(u) is exactly +-1 here
    log_std = torch.zeros(2, 2)
    noise = torch.ones(2, 2)
    got = squash_log_prob(noise, log_std, u)
    assert torch.isfinite(got).all()
    # log(1 - tanh(u)^2) = log 4 - 2|u| - 2 log(1 + exp(-2|u|)) exactly, in float64
    ud = u.double()
    log_det = (math.log(4) - 2 * ud.abs() - 2 * torch.log1p(torch.exp(-2 * ud.abs()))).sum(1)
    expected = (-0.5 - 0.5 * math.log(2 * math.pi)) * 2 - log_det
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-4)


# ---------------------------------------------------------------- the three losses, by hand


@pytest.mark.parametrize("loss", ["mse", "huber"])
def test_losses_and_steps_match_hand_computation(loss: str) -> None:
    agent = make_agent(seed=1, loss=loss, init_alpha=0.3, tau=0.05)
    perturb(agent.targets, seed=2)  # targets differ from the critics, as after some training
    batch = make_batch(64, seed=3, weights=True)
    actor0, critics0, targets0 = (copy.deepcopy(m) for m in (agent.actor, agent.critics, agent.targets))
    alpha0 = 0.3
    gen = torch.Generator().manual_seed(0)
    gen.set_state(agent.noise.get_state())
    noise_next = torch.randn(64, 2, generator=gen)  # the update draws for next_obs first, then for obs
    noise_now = torch.randn(64, 2, generator=gen)

    metrics, priorities = agent.update(batch)

    # critic: y = r + d * (min_i Q'_i(s', a') - alpha log pi(a'|s')), loss = sum_i mean_b w_b l(y_b - Q_i(s_b, a_b))
    next_action, next_logp = hand_log_prob(*actor_out(actor0, batch["next_obs"]), noise_next.double())
    reward, discount = (torch.as_tensor(batch[k], dtype=torch.float64) for k in ("reward", "discount"))
    y = reward + discount * (q_of(targets0, batch["next_obs"], next_action).min(0).values - alpha0 * next_logp)
    q = q_of(critics0, batch["obs"], to_unit(batch["action"]))
    td = y - q
    if loss == "mse":
        elementwise = 0.5 * td ** 2
    else:
        elementwise = torch.where(td.abs() < 1, 0.5 * td ** 2, td.abs() - 0.5)
    w = torch.as_tensor(batch["weights"], dtype=torch.float64)
    critic_loss = (w * elementwise).mean(1).sum()
    assert metrics["critic_loss"] == pytest.approx(float(critic_loss), rel=1e-4)
    assert metrics["q_mean"] == pytest.approx(float(q.mean()), rel=1e-4, abs=1e-5)
    np.testing.assert_allclose(priorities, td.abs().mean(0).numpy(), rtol=1e-4, atol=1e-5)
    assert priorities.dtype == np.float32 and priorities.shape == (64,)
    assert metrics["td_abs_mean"] == pytest.approx(float(td.abs().mean()), rel=1e-4)

    # actor: mean_b(alpha log pi(a~|s) - min_i Q_i(s, a~)) with the critics after their step
    new_action, logp = hand_log_prob(*actor_out(actor0, batch["obs"]), noise_now.double())
    actor_loss = (alpha0 * logp - q_of(agent.critics, batch["obs"], new_action).min(0).values).mean()
    assert metrics["actor_loss"] == pytest.approx(float(actor_loss), rel=1e-4)
    assert metrics["entropy"] == pytest.approx(float(-logp.mean()), rel=1e-4)

    # alpha: -mean_b(log alpha * (log pi + target entropy)), target entropy -dim(A) = -2
    alpha_loss = -(math.log(alpha0) * (logp + (-2.0))).mean()
    assert metrics["alpha_loss"] == pytest.approx(float(alpha_loss), rel=1e-4)
    assert metrics["alpha"] == pytest.approx(alpha0, rel=1e-6)

    # each network moved by one Adam step on its own loss only (float32, as the agent computes)
    critics = copy.deepcopy(critics0)
    opt = torch.optim.Adam(critics.parameters(), lr=1e-3)
    yt = y.float()
    qt = critics(torch.as_tensor(batch["obs"]), to_unit(batch["action"]).float())
    el = 0.5 * (yt - qt) ** 2 if loss == "mse" else torch.nn.functional.smooth_l1_loss(
        qt, yt.expand_as(qt), reduction="none")
    (el * w.float()).mean(1).sum().backward()
    opt.step()
    for got, want in zip(agent.critics.parameters(), critics.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    actor = copy.deepcopy(actor0)
    opt = torch.optim.Adam(actor.parameters(), lr=1e-3)
    mean, log_std = actor(torch.as_tensor(batch["obs"]))
    u = mean + log_std.exp() * noise_now
    logp32 = squash_log_prob(noise_now, log_std, u)
    post = copy.deepcopy(agent.critics).requires_grad_(False)
    (alpha0 * logp32 - post(torch.as_tensor(batch["obs"]), torch.tanh(u)).min(0).values).mean().backward()
    opt.step()
    for got, want in zip(agent.actor.parameters(), actor.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # log alpha: one Adam step of size lr against the sign of its gradient (Adam's first step)
    grad = -(logp + (-2.0)).mean()
    assert float(agent.log_alpha.detach()) == pytest.approx(math.log(alpha0) - 1e-3 * float(torch.sign(grad)), abs=1e-6)
    # targets: Polyak with tau = 0.05 toward the critics after their step
    for got, t0, c in zip(agent.targets.parameters(), targets0.parameters(), agent.critics.parameters(), strict=True):
        torch.testing.assert_close(got, 0.95 * t0 + 0.05 * c, rtol=1e-5, atol=1e-6)


def test_terminal_rows_do_not_bootstrap() -> None:
    agent = make_agent(seed=4)
    batch = make_batch(32, seed=5)
    batch["discount"][:] = 0.0
    q = q_of(agent.critics, batch["obs"], to_unit(batch["action"]))
    _, priorities = agent.update(batch)
    np.testing.assert_allclose(priorities, (torch.as_tensor(batch["reward"]).double() - q).abs().mean(0).numpy(),
                               rtol=1e-4, atol=1e-5)


def test_importance_weights_scale_the_critic_loss() -> None:
    batch = make_batch(32, seed=6)
    plain, _ = make_agent(seed=7).update(batch)
    halved, _ = make_agent(seed=7).update({**batch, "weights": np.full(32, 0.5, np.float32)})
    assert halved["critic_loss"] == pytest.approx(0.5 * plain["critic_loss"], rel=1e-5)
    # rows of weight 0 give no gradient: with every weight 0 the critics do not move at all
    agent = make_agent(seed=7)
    critics = params_of(agent.critics)
    metrics, _ = agent.update({**batch, "weights": np.zeros(32, np.float32)})
    assert metrics["critic_loss"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(params_of(agent.critics), critics, strict=True))


def test_fixed_alpha_stays_put() -> None:
    agent = make_agent(seed=8, auto_alpha=False, init_alpha=0.2)
    assert agent.alpha_optimizer is None
    for i in range(5):
        metrics, _ = agent.update(make_batch(32, seed=i))
        assert metrics["alpha"] == pytest.approx(0.2) and metrics["alpha_loss"] == 0.0
    assert agent.alpha == pytest.approx(0.2)


def test_auto_alpha_moves_toward_the_target_entropy() -> None:
    # entropy of a fresh actor is far above a target of -10: alpha must fall
    agent = make_agent(seed=9, target_entropy=-10.0, alpha_lr=1e-2)
    assert agent.target_entropy == -10.0
    for i in range(20):
        metrics, _ = agent.update(make_batch(32, seed=i))
    assert metrics["entropy"] > -10.0
    assert agent.alpha < 0.9
    assert make_agent().target_entropy == -2.0  # default: -dim(A)


def test_repeated_updates_on_a_fixed_batch_lower_the_critic_loss() -> None:
    # a small fixed alpha: the target's own noise (alpha log pi of a sampled a') stays small
    agent = make_agent(seed=10, auto_alpha=False, init_alpha=0.01)
    batch = make_batch(128, seed=11)
    losses = [agent.update(batch)[0]["critic_loss"] for _ in range(300)]
    # seeds 8-12 end at 0.19-0.25 of the first losses (a wrong sign or a stale target would not fall)
    assert np.mean(losses[-10:]) < 0.3 * np.mean(losses[:10]), (losses[:10], losses[-10:])


def test_targets_follow_polyak_only_every_interval() -> None:
    agent = make_agent(seed=12, tau=0.2, target_update_interval=2)
    perturb(agent.targets, seed=13)
    before = params_of(agent.targets)
    agent.update(make_batch(32, seed=14))
    assert all(torch.equal(a, b) for a, b in zip(params_of(agent.targets), before, strict=True))
    agent.update(make_batch(32, seed=15))
    for got, t0, c in zip(agent.targets.parameters(), before, agent.critics.parameters(), strict=True):
        torch.testing.assert_close(got, 0.8 * t0 + 0.2 * c, rtol=1e-6, atol=1e-7)
        assert not torch.equal(got, t0)


def test_update_targets_formula_and_targets_are_not_trained() -> None:
    agent = make_agent(seed=16, tau=0.3)
    perturb(agent.critics, seed=17)
    t0, c0 = params_of(agent.targets), params_of(agent.critics)
    agent.update_target()
    for got, t, c in zip(agent.targets.parameters(), t0, c0, strict=True):
        torch.testing.assert_close(got, 0.7 * t + 0.3 * c, rtol=1e-6, atol=1e-7)
    assert not any(p.requires_grad for p in agent.targets.parameters())


def test_gradients_are_clipped() -> None:
    batch = make_batch(32, seed=18)
    batch["reward"] *= 1000.0  # huge TD errors
    clipped, free = make_agent(seed=19, max_grad_norm=0.01), make_agent(seed=19)
    # with plain SGD the step is lr * grad, so clipping shows in the size of the step
    for a in (clipped, free):
        a.critic_optimizer = torch.optim.SGD(a.critics.parameters(), lr=1.0)
    c0 = params_of(clipped.critics)
    clipped.update(batch)
    free.update(batch)
    step = torch.sqrt(sum(((p - q) ** 2).sum() for p, q in zip(params_of(clipped.critics), c0, strict=True)))
    free_step = torch.sqrt(sum(((p - q) ** 2).sum() for p, q in zip(params_of(free.critics), c0, strict=True)))
    assert float(step) == pytest.approx(0.01, rel=1e-3)
    assert float(free_step) > 100.0


# ---------------------------------------------------------------- acting


def test_greedy_is_tanh_of_the_mean_scaled_to_the_bounds() -> None:
    policy = SACPolicy(sac_cfg(), OBS_SPACE, ACT_SPACE, seed=20)
    obs = np.random.default_rng(21).normal(size=(50, 3)).astype(np.float32)
    mean, _ = actor_out(policy.actor, obs)
    expected = LOW + (torch.tanh(mean).numpy() + 1) / 2 * (HIGH - LOW)
    got = policy.greedy(obs)
    assert got.dtype == np.float32 and got.shape == (50, 2)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_actions_stay_within_non_symmetric_bounds(backend: str) -> None:
    cfg = run_cfg()
    policy = SAC_ALGO.make_policy(cfg, OBS_SPACE, ACT_SPACE, seed=22, backend=backend)
    params = SAC_ALGO.initial_params(cfg, OBS_SPACE, ACT_SPACE, seed=23)
    assert params is not None
    policy.load_params({k: v * 50 for k, v in params.items()})  # saturate tanh at both ends
    obs = np.random.default_rng(24).normal(size=(4000, 3)).astype(np.float32) * 5
    for explore in (0.0, 0.3, 1.0):
        actions = policy.act(obs, explore)
        assert actions.dtype == np.float32 and actions.shape == (4000, 2)
        assert (actions >= ACT_SPACE.low).all() and (actions <= ACT_SPACE.high).all()
        # both ends of each dimension are reached (saturation, or uniform draws)
        np.testing.assert_allclose(actions.min(0), ACT_SPACE.low, atol=0.05)
        np.testing.assert_allclose(actions.max(0), ACT_SPACE.high, atol=0.05)
    greedy = policy.greedy(obs)
    assert (greedy >= ACT_SPACE.low).all() and (greedy <= ACT_SPACE.high).all()


def test_uniform_exploration_covers_the_box_evenly() -> None:
    policy = NumpySACPolicy(sac_cfg(), OBS_SPACE, ACT_SPACE, seed=25)
    actions = policy.act(np.zeros((20_000, 3), np.float32), 1.0)
    for d in range(2):
        counts = np.histogram(actions[:, d], bins=4, range=(LOW[d], HIGH[d]))[0]
        assert (np.abs(counts - 5000) < 300).all(), counts


def test_samples_follow_the_actor_gaussian() -> None:
    policy = NumpySACPolicy(sac_cfg(), OBS_SPACE, ACT_SPACE, seed=26)
    obs = np.tile(np.array([[0.3, -0.2, 0.5]], np.float32), (40_000, 1))
    mean, log_std = policy.mean_log_std(obs[:1])
    unit = 2 * (policy.act(obs, 0.0).astype(np.float64) - LOW) / (HIGH - LOW) - 1
    u = np.arctanh(np.clip(unit, -1 + 1e-7, 1 - 1e-7))
    np.testing.assert_allclose(u.mean(0), mean[0], atol=0.02)
    np.testing.assert_allclose(u.std(0), np.exp(log_std[0]), rtol=0.03)


def test_explore_is_a_per_row_probability_of_a_uniform_action() -> None:
    policy = NumpySACPolicy(sac_cfg(), OBS_SPACE, ACT_SPACE, seed=27)
    params = SAC_ALGO.initial_params(run_cfg(), OBS_SPACE, ACT_SPACE, seed=28)
    assert params is not None
    params["log_std.bias"] = np.full(2, -100.0, np.float32)  # clamped to -20: samples are tanh(mean)
    policy.load_params(params)
    obs = np.random.default_rng(29).normal(size=(6000, 3)).astype(np.float32)
    greedy = policy.greedy(obs)
    explore = np.where(np.arange(6000) % 2 == 0, 0.0, 0.5)
    same = np.isclose(policy.act(obs, explore), greedy, atol=1e-5).all(axis=1)
    assert same[explore == 0.0].all()
    assert 0.45 < same[explore == 0.5].mean() < 0.55, same[explore == 0.5].mean()


def test_numpy_and_torch_policies_act_alike() -> None:
    cfg = run_cfg()
    params = SAC_ALGO.initial_params(cfg, OBS_SPACE, ACT_SPACE, seed=30)
    assert params is not None
    numpy_policy = SAC_ALGO.make_policy(cfg, OBS_SPACE, ACT_SPACE, seed=31, backend="numpy")
    torch_policy = SAC_ALGO.make_policy(cfg, OBS_SPACE, ACT_SPACE, seed=31, backend="torch")
    assert isinstance(numpy_policy, NumpySACPolicy) and isinstance(torch_policy, SACPolicy)
    for p in (numpy_policy, torch_policy):
        p.load_params(params)
    rng = np.random.default_rng(32)
    for explore in (0.0, 0.4, np.linspace(0, 1, 64), 1.0, 0.0):  # the RNGs stay in step across calls
        obs = rng.normal(size=(64, 3)).astype(np.float32)
        np.testing.assert_allclose(numpy_policy.greedy(obs), torch_policy.greedy(obs), rtol=1e-5, atol=1e-5)
        a, b = numpy_policy.act(obs, explore), torch_policy.act(obs, explore)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert numpy_policy.priorities(make_batch(4)) is None and torch_policy.priorities(make_batch(4)) is None


def test_acting_is_reproducible_for_a_seed() -> None:
    obs = make_batch(100)["obs"]
    a = NumpySACPolicy(sac_cfg(), OBS_SPACE, ACT_SPACE, seed=33).act(obs, 0.2)
    b = NumpySACPolicy(sac_cfg(), OBS_SPACE, ACT_SPACE, seed=33).act(obs, 0.2)
    c = NumpySACPolicy(sac_cfg(), OBS_SPACE, ACT_SPACE, seed=34).act(obs, 0.2)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_float64_action_space_gets_float64_actions() -> None:
    space = gym.spaces.Box(-3.0, 3.0, shape=(2,), dtype=np.float64)
    for policy in (NumpySACPolicy(sac_cfg(), OBS_SPACE, space, seed=35), SACPolicy(sac_cfg(), OBS_SPACE, space)):
        assert policy.act(make_batch(8)["obs"], 0.0).dtype == np.float64
        assert policy.greedy(make_batch(8)["obs"]).dtype == np.float64


# ---------------------------------------------------------------- parameters and state


def test_initial_params_fit_the_agent_and_are_adopted() -> None:
    cfg = run_cfg()
    params = SAC_ALGO.initial_params(cfg, OBS_SPACE, ACT_SPACE, seed=36)
    assert params is not None
    agent = SAC_ALGO.make_agent(cfg, OBS_SPACE, ACT_SPACE, seed=37)
    assert isinstance(agent, SACAgent)
    own = agent.params()
    assert {k: v.shape for k, v in params.items()} == {k: v.shape for k, v in own.items()}
    assert all(v.dtype == np.float32 for v in params.values())
    assert set(own) == {k for k in agent.actor.state_dict()}  # the actor only: no critic goes out
    targets = params_of(agent.targets)
    agent.adopt_initial(params)
    for k, v in agent.params().items():
        np.testing.assert_array_equal(v, params[k])
    assert all(torch.equal(a, b) for a, b in zip(params_of(agent.targets), targets, strict=True))
    # drawn like torch's Linear init: uniform within +-1/sqrt(fan_in)
    w = params["torso.0.weight"]
    assert np.abs(w).max() <= 1 / math.sqrt(3) and np.abs(w).max() > 0.9 / math.sqrt(3)
    again = SAC_ALGO.initial_params(cfg, OBS_SPACE, ACT_SPACE, seed=36)
    assert again is not None and all(np.array_equal(params[k], again[k]) for k in params)


def test_load_params_refuses_wrong_names_and_shapes() -> None:
    params = SAC_ALGO.initial_params(run_cfg(), OBS_SPACE, ACT_SPACE, seed=38)
    assert params is not None
    for policy in (NumpySACPolicy(sac_cfg(), OBS_SPACE, ACT_SPACE), SACPolicy(sac_cfg(), OBS_SPACE, ACT_SPACE)):
        with pytest.raises(ValueError, match="mean.weight"):
            policy.load_params({**params, "mean.weight": np.zeros((3, 32), np.float32)})
        with pytest.raises(ValueError, match="log_std.bias"):
            policy.load_params({k: v for k, v in params.items() if k != "log_std.bias"})


def test_state_dict_round_trip_gives_identical_updates() -> None:
    agent = make_agent(seed=39)
    for i in range(3):
        agent.update(make_batch(32, seed=i, weights=True))
    agent.act(make_batch(8)["obs"], 0.5)
    buffer = io.BytesIO()  # through torch.save / weights_only load, as a checkpoint goes
    torch.save(agent.state_dict(), buffer)
    buffer.seek(0)
    other = make_agent(seed=40)
    other.load_state_dict(torch.load(buffer, weights_only=True))
    assert other.opt_steps == 3
    for i in range(3, 6):
        batch = make_batch(32, seed=i, weights=True)
        m1, p1 = agent.update(batch)
        m2, p2 = other.update(batch)
        assert m1 == m2
        np.testing.assert_array_equal(p1, p2)
    for mod in ("actor", "critics", "targets"):
        assert all(torch.equal(a, b) for a, b in zip(params_of(getattr(agent, mod)), params_of(getattr(other, mod)),
                                                     strict=True))
    assert torch.equal(agent.log_alpha.detach(), other.log_alpha.detach())
    obs = make_batch(16)["obs"]
    np.testing.assert_array_equal(agent.act(obs, 0.5), other.act(obs, 0.5))


def test_critics_saved_before_the_stack_load_with_their_adam_moments() -> None:
    """Checkpoints written before the critics were stacked (an ``nn.Linear`` per critic and
    layer) resume: the same Q-values, and the next Adam step agrees (moments and step carried)."""
    agent = make_agent(seed=43)
    holder = nn.Module()
    holder.q = nn.ModuleList(nn.Sequential(nn.Linear(5, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
                             for _ in range(2))

    def separate(obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, action], dim=1)
        return torch.stack([net(x).squeeze(1) for net in holder.q])

    gen = torch.Generator().manual_seed(5)
    obs, action = torch.randn(16, 3, generator=gen), torch.rand(16, 2, generator=gen) * 2 - 1
    separate_opt = torch.optim.Adam(holder.parameters(), lr=1e-3, eps=agent.cfg.adam_eps)
    for target in (1.0, -2.0):  # two steps: moments that a fresh optimizer would not have
        separate_opt.zero_grad()
        (separate(obs, action) - target).pow(2).mean().backward()
        separate_opt.step()
    state = {**agent.state_dict(), "critics": holder.state_dict(), "targets": holder.state_dict(),
             "critic_optimizer": separate_opt.state_dict()}
    loaded = make_agent(seed=44)
    loaded.load_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(loaded.critics(obs, action), separate(obs, action))
        torch.testing.assert_close(loaded.targets(obs, action), separate(obs, action))
    for opt, q in ((separate_opt, separate), (loaded.critic_optimizer, loaded.critics)):
        opt.zero_grad()
        (q(obs, action) - 3.0).pow(2).mean().backward()
        opt.step()
    with torch.no_grad():
        torch.testing.assert_close(loaded.critics(obs, action), separate(obs, action))
        fresh = make_agent(seed=44)  # the control: the same weights with fresh moments step elsewhere
        fresh.critics.load_state_dict(stack_separate_critics(state["critics"]))
    fresh.critic_optimizer.zero_grad()
    (fresh.critics(obs, action) - 3.0).pow(2).mean().backward()
    fresh.critic_optimizer.step()
    with torch.no_grad():
        assert not torch.allclose(fresh.critics(obs, action), separate(obs, action), atol=1e-4)


def test_loaded_optimizer_state_is_not_shared() -> None:
    agent = make_agent(seed=41)
    agent.update(make_batch(32))
    state = agent.state_dict()
    other = make_agent(seed=41)
    other.load_state_dict(state)
    other.update(make_batch(32, seed=1))
    first = next(iter(agent.critic_optimizer.state.values()))["exp_avg"]
    second = next(iter(other.critic_optimizer.state.values()))["exp_avg"]
    assert first.data_ptr() != second.data_ptr() and not torch.equal(first, second)


# ---------------------------------------------------------------- the seam


def test_check_spaces_refuses_what_sac_cannot_train_on() -> None:
    cfg = run_cfg("SomeEnv-v0")
    SAC_ALGO.check_spaces(cfg, OBS_SPACE, ACT_SPACE)
    bad = {
        "Discrete": (OBS_SPACE, gym.spaces.Discrete(3), "agent.algo=dqn"),
        "unbounded": (OBS_SPACE, gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32), "finite bounds"),
        "half unbounded": (OBS_SPACE, gym.spaces.Box(np.array([0, -1], np.float32),
                                                     np.array([np.inf, 1], np.float32)), "finite bounds"),
        "2-D actions": (OBS_SPACE, gym.spaces.Box(-1, 1, shape=(2, 2), dtype=np.float32), "1-D Box actions"),
        "image obs": (gym.spaces.Box(0, 255, shape=(4, 84, 84), dtype=np.uint8), ACT_SPACE, "1-D Box"),
        "dict obs": (gym.spaces.Dict({"a": OBS_SPACE}), ACT_SPACE, "1-D Box"),
    }
    for name, (obs_space, act_space, hint) in bad.items():
        with pytest.raises(ConfigError, match="env.id: 'SomeEnv-v0'") as info:
            SAC_ALGO.check_spaces(cfg, obs_space, act_space)
        assert hint in str(info.value), (name, str(info.value))
    assert "agent.algo=dqn" in str(pytest.raises(ConfigError, SAC_ALGO.check_spaces, cfg, OBS_SPACE,
                                                 gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)).value)


def test_config_keys_are_checked() -> None:
    with pytest.raises(ConfigError, match="agent.log_std_min"):
        SAC_ALGO.check_spaces(run_cfg(log_std_min=3.0), OBS_SPACE, ACT_SPACE)
    with pytest.raises(ConfigError, match="agent.tau"):
        run_cfg(tau=1.5)
    with pytest.raises(ConfigError, match="agent.loss"):
        run_cfg(loss="l1")
    with pytest.raises(ConfigError, match="agent.n_critics"):
        run_cfg(n_critics=0)
    with pytest.raises(ConfigError, match="belongs to agent.algo=dqn"):
        run_cfg(eps_start=1.0)


@pytest.mark.slow
def test_shipped_configs_load_and_fit_their_envs() -> None:
    from pathlib import Path

    configs = Path(__file__).resolve().parents[2] / "configs"
    for name in ("pendulum_sac.yaml", "halfcheetah_sac.yaml", "hopper_sac.yaml"):
        cfg = config.load(configs / name)
        assert isinstance(cfg.agent, SACConfig) and cfg.agent.algo == "sac"
        if cfg.env.id != "Pendulum-v1":
            pytest.importorskip("mujoco")
        env = gym.make(cfg.env.id)
        try:
            SAC_ALGO.check_spaces(cfg, env.observation_space, env.action_space)
            assert SAC_ALGO.batch_spec(cfg, env.observation_space, env.action_space)["action"] == \
                (np.dtype(np.float32), env.action_space.shape)
        finally:
            env.close()


def test_exploration_random_phase_only_in_the_single_process_trainer() -> None:
    cfg = run_cfg(random_steps=500)
    schedule = SAC_ALGO.exploration(cfg, None)
    assert [schedule(s) for s in (0, 499, 500, 10_000)] == [1.0, 1.0, 0.0, 0.0]
    assert schedule.name == "random_action"
    assert SAC_ALGO.exploration(cfg, 0)(0) == 0.0 and SAC_ALGO.exploration(cfg, 3)(0) == 0.0


def test_backend_choice() -> None:
    cfg = run_cfg()
    assert isinstance(SAC_ALGO.make_policy(cfg, OBS_SPACE, ACT_SPACE), NumpySACPolicy)
    assert isinstance(SAC_ALGO.make_policy(cfg, OBS_SPACE, ACT_SPACE, backend="torch"), SACPolicy)
    assert resolve_backend("auto", True, "cuda") == "torch"
    assert isinstance(SAC_ALGO, SAC)


@pytest.mark.slow
def test_numpy_actor_process_never_imports_torch() -> None:
    code = ("import sys, numpy as np, gymnasium as gym\n"
            "from zmqrl import config\n"
            "from zmqrl.agents.base import algorithm\n"
            "cfg = config.from_dict({'env': {'id': 'Pendulum-v1'}, 'agent': {'algo': 'sac'},\n"
            "                        'trainer': {'warmup': 256}})\n"
            "alg = algorithm('sac')\n"
            "obs, act = gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Box(-2, 2, (1,), np.float32)\n"
            "p = alg.make_policy(cfg, obs, act)\n"
            "p.load_params(alg.initial_params(cfg, obs, act, 0))\n"
            "print(p.act(np.zeros((2, 3), np.float32), 0.0).shape, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(2, 1) False"


# ---------------------------------------------------------------- CUDA


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_agent_updates_acts_and_resumes() -> None:
    agent = SACAgent(sac_cfg(), OBS_SPACE, ACT_SPACE, device="cuda", seed=42)
    assert all(p.device.type == "cuda" for p in agent.critics.parameters())
    batch = make_batch(128, seed=43, weights=True)
    # the losses on the GPU match the hand computation made from the same networks and draws
    actor0, critics0, targets0 = (copy.deepcopy(m).cpu() for m in (agent.actor, agent.critics, agent.targets))
    gen = torch.Generator(device="cuda")
    gen.set_state(agent.noise.get_state())
    noise_next = torch.randn(128, 2, generator=gen, device="cuda").cpu().double()
    metrics, priorities = agent.update(batch)
    next_action, next_logp = hand_log_prob(*actor_out(actor0, batch["next_obs"]), noise_next)
    y = torch.as_tensor(batch["reward"]).double() + torch.as_tensor(batch["discount"]).double() * \
        (q_of(targets0, batch["next_obs"], next_action).min(0).values - next_logp)
    td = y - q_of(critics0, batch["obs"], to_unit(batch["action"]))
    critic_loss = (torch.as_tensor(batch["weights"]).double() * 0.5 * td ** 2).mean(1).sum()
    assert metrics["critic_loss"] == pytest.approx(float(critic_loss), rel=1e-3)
    assert isinstance(priorities, np.ndarray) and priorities.dtype == np.float32
    np.testing.assert_allclose(priorities, td.abs().mean(0).numpy(), rtol=1e-3, atol=1e-4)
    losses = [agent.update(batch)[0]["critic_loss"] for _ in range(200)]
    # With alpha tuned (entropy noise in the target) the loss falls to about half in 200 updates: 0.53 on
    # an H100, 0.52-0.57 on CPU for seeds 1-5 and 42; an update that does not learn stays near 1.
    # (0.3, the fixed-alpha test's bound above, was never reachable here: this test first ran on a GPU
    # host on 2026-11-27.)
    assert np.mean(losses[-10:]) < 0.7 * np.mean(losses[:10]), (losses[:10], losses[-10:])
    params = agent.params()
    assert all(isinstance(v, np.ndarray) for v in params.values())
    numpy_policy = NumpySACPolicy(sac_cfg(), OBS_SPACE, ACT_SPACE, seed=44)
    numpy_policy.load_params(params)
    gpu_policy = SACPolicy(sac_cfg(), OBS_SPACE, ACT_SPACE, device="cuda", seed=44)
    gpu_policy.load_params(params)
    obs = batch["obs"]
    np.testing.assert_allclose(gpu_policy.greedy(obs), numpy_policy.greedy(obs), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gpu_policy.act(obs, 0.3), numpy_policy.act(obs, 0.3), rtol=1e-4, atol=1e-4)
    other = SACAgent(sac_cfg(), OBS_SPACE, ACT_SPACE, device="cuda", seed=45)
    other.load_state_dict(copy.deepcopy(agent.state_dict()))
    m1, p1 = agent.update(batch)
    m2, p2 = other.update(batch)
    assert m1 == m2
    np.testing.assert_array_equal(p1, p2)
