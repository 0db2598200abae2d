"""Tests for the DQN policy and agent: acting, targets, losses, target updates, parameters, state."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rigs import perturb_target
from zmqrl import config as config_mod
from zmqrl.agents.dqn.agent import DQNAgent, DQNPolicy
from zmqrl.agents.dqn.config import DQNConfig
from zmqrl.agents.dqn.networks import MLPQNetwork, NatureCNNQNetwork
from zmqrl.agents.staging import BatchStager
from zmqrl.agents.torch_util import clip_gradients, resolve_device
from zmqrl.config import ConfigError
from zmqrl.run.acting import make_task

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
ACT_SPACE = gym.spaces.Discrete(3)


def agent_cfg(**kw: object) -> DQNConfig:
    base: dict[str, object] = {"hidden": [16, 16], "lr": 1e-2, "target_update_interval": 1000}
    base.update(kw)
    return DQNConfig(**base)  # type: ignore[arg-type]


def make_batch(n: int = 32, seed: int = 0, weights: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    batch: dict[str, np.ndarray] = {
        "obs": rng.normal(size=(n, 4)).astype(np.float32),
        "action": rng.integers(3, size=n).astype(np.int64),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
        # a mix of terminal rows (discount 0) and bootstrapping rows
        "discount": np.where(np.arange(n) % 3 == 0, 0.0, 0.99 ** 3).astype(np.float32),
    }
    if weights:
        batch["weights"] = rng.uniform(0.1, 1.0, size=n).astype(np.float32)
    return batch



def q_values(net: torch.nn.Module, obs: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return net(torch.as_tensor(obs)).numpy().astype(np.float64)


def net_params(net: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def same_params(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


# ---------------------------------------------------------------- acting


def test_act_shapes_and_dtypes() -> None:
    policy = DQNPolicy(agent_cfg(), OBS_SPACE, ACT_SPACE, seed=0)
    obs = make_batch(10)["obs"]
    for eps in (0.0, 0.5, 1.0):
        actions = policy.act(obs, eps)
        assert actions.shape == (10,) and actions.dtype == np.int64
        assert ((actions >= 0) & (actions < 3)).all()
    assert policy.greedy(obs).shape == (10,)


def test_epsilon_zero_is_greedy_argmax() -> None:
    policy = DQNPolicy(agent_cfg(), OBS_SPACE, ACT_SPACE, seed=1)
    obs = np.random.default_rng(2).normal(size=(500, 4)).astype(np.float32)
    expected = q_values(policy.q, obs).argmax(axis=1)
    np.testing.assert_array_equal(policy.act(obs, 0.0), expected)
    np.testing.assert_array_equal(policy.greedy(obs), expected)
    assert len(np.unique(expected)) > 1  # the check is not vacuous


def test_epsilon_one_is_roughly_uniform() -> None:
    policy = DQNPolicy(agent_cfg(), OBS_SPACE, ACT_SPACE, seed=3)
    obs = np.zeros((6000, 4), dtype=np.float32)  # one greedy action for every row
    counts = np.bincount(policy.act(obs, 1.0), minlength=3)
    assert counts.sum() == 6000
    assert (np.abs(counts - 2000) < 200).all(), counts


def test_per_row_epsilon() -> None:
    policy = DQNPolicy(agent_cfg(), OBS_SPACE, ACT_SPACE, seed=4)
    obs = np.random.default_rng(5).normal(size=(3000, 4)).astype(np.float32)
    greedy = policy.greedy(obs)
    eps = np.where(np.arange(3000) % 2 == 0, 0.0, 1.0)
    actions = policy.act(obs, eps)
    np.testing.assert_array_equal(actions[eps == 0.0], greedy[eps == 0.0])
    # random rows hit the greedy action about a third of the time
    agree = float(np.mean(actions[eps == 1.0] == greedy[eps == 1.0]))
    assert 0.25 < agree < 0.42, agree


def test_acting_is_reproducible_for_a_seed() -> None:
    obs = make_batch(200)["obs"]
    a = DQNPolicy(agent_cfg(), OBS_SPACE, ACT_SPACE, seed=9).act(obs, 0.5)
    b = DQNPolicy(agent_cfg(), OBS_SPACE, ACT_SPACE, seed=9).act(obs, 0.5)
    c = DQNPolicy(agent_cfg(), OBS_SPACE, ACT_SPACE, seed=10).act(obs, 0.5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_dqn_refuses_continuous_actions_naming_the_env_and_the_way_out() -> None:
    cfg = config_mod.load("configs/cartpole_dqn.yaml", ["env.id=Pendulum-v1"])
    with pytest.raises(ConfigError, match=r"env.id: 'Pendulum-v1' .*Discrete.*agent.algo=sac"):
        make_task(cfg)


# ---------------------------------------------------------------- targets and losses


def expected_td(agent: DQNAgent, batch: dict[str, np.ndarray], double: bool) -> np.ndarray:
    """reward + discount * Q_target(next_obs, a*) - Q(obs, action), by hand, in float64."""
    q_next_online = q_values(agent.q, batch["next_obs"])
    q_next_target = q_values(agent.target, batch["next_obs"])
    rows = np.arange(len(batch["action"]))
    if double:
        next_q = q_next_target[rows, q_next_online.argmax(axis=1)]
    else:
        next_q = q_next_target.max(axis=1)
    target = batch["reward"].astype(np.float64) + batch["discount"].astype(np.float64) * next_q
    return target - q_values(agent.q, batch["obs"])[rows, batch["action"]]


@pytest.mark.parametrize("double", [True, False])
def test_priorities_are_abs_td_before_the_step(double: bool) -> None:
    agent = DQNAgent(agent_cfg(double=double), OBS_SPACE, ACT_SPACE, seed=0)
    perturb_target(agent)
    batch = make_batch(64, seed=1)
    td = expected_td(agent, batch, double)
    other = expected_td(agent, batch, not double)
    assert not np.allclose(np.abs(td), np.abs(other))  # double and plain targets really differ here
    q_before = q_values(agent.q, batch["obs"])
    _, priorities = agent.update(batch)
    assert priorities.dtype == np.float32 and priorities.shape == (64,)
    np.testing.assert_allclose(priorities, np.abs(td), rtol=1e-5, atol=1e-5)
    # terminal rows do not bootstrap: their target is the reward alone
    terminal = batch["discount"] == 0
    rows = np.flatnonzero(terminal)
    np.testing.assert_allclose(priorities[terminal],
                               np.abs(batch["reward"][terminal] - q_before[rows, batch["action"][terminal]]),
                               rtol=1e-5, atol=1e-5)
    assert not np.allclose(q_values(agent.q, batch["obs"]), q_before)  # and the step did happen


@pytest.mark.parametrize("loss", ["huber", "mse"])
def test_loss_metric_matches_hand_computation(loss: str) -> None:
    agent = DQNAgent(agent_cfg(loss=loss), OBS_SPACE, ACT_SPACE, seed=2)
    perturb_target(agent)
    batch = make_batch(48, seed=3, weights=True)
    batch["reward"] *= 5  # some |td| > 1 so Huber and MSE differ
    td = expected_td(agent, batch, double=True)
    q_taken = q_values(agent.q, batch["obs"])[np.arange(48), batch["action"]]
    if loss == "huber":
        elementwise = np.where(np.abs(td) < 1.0, 0.5 * td**2, np.abs(td) - 0.5)
    else:
        elementwise = 0.5 * td**2
    metrics, _ = agent.update(batch)
    assert np.abs(td).max() > 1.0
    assert metrics["loss"] == pytest.approx(float(np.mean(batch["weights"] * elementwise)), rel=1e-4)
    assert metrics["q_mean"] == pytest.approx(float(q_taken.mean()), rel=1e-4, abs=1e-5)
    assert metrics["td_abs_mean"] == pytest.approx(float(np.abs(td).mean()), rel=1e-4)
    assert metrics["grad_norm"] > 0
    assert set(metrics) == {"loss", "q_mean", "td_abs_mean", "grad_norm", "skipped"} and metrics["skipped"] == 0


def test_importance_weights_scale_the_loss() -> None:
    batch = make_batch(32, seed=4)
    ones = DQNAgent(agent_cfg(), OBS_SPACE, ACT_SPACE, seed=5)
    twos = DQNAgent(agent_cfg(), OBS_SPACE, ACT_SPACE, seed=5)
    m1, p1 = ones.update({**batch, "weights": np.ones(32, dtype=np.float32)})
    m2, p2 = twos.update({**batch, "weights": np.full(32, 2.0, dtype=np.float32)})
    assert m2["loss"] == pytest.approx(2 * m1["loss"], rel=1e-5)
    np.testing.assert_allclose(p1, p2)  # priorities do not depend on the weights
    # no weights at all means weights of one
    plain = DQNAgent(agent_cfg(), OBS_SPACE, ACT_SPACE, seed=5)
    m0, _ = plain.update(batch)
    assert m0["loss"] == pytest.approx(m1["loss"], rel=1e-6)


def test_zero_weights_change_nothing() -> None:
    agent = DQNAgent(agent_cfg(), OBS_SPACE, ACT_SPACE, seed=6)
    before = net_params(agent.q)
    metrics, priorities = agent.update({**make_batch(32, seed=7), "weights": np.zeros(32, dtype=np.float32)})
    assert metrics["loss"] == 0.0 and metrics["grad_norm"] == 0.0
    assert same_params(before, net_params(agent.q))
    assert (priorities > 0).any()
    # the same batch with non-zero weights does move the network
    agent.update({**make_batch(32, seed=7), "weights": np.ones(32, dtype=np.float32)})
    assert not same_params(before, net_params(agent.q))


def test_gradients_are_clipped() -> None:
    batch = make_batch(32, seed=8)
    batch["reward"] *= 1000.0
    agent = DQNAgent(agent_cfg(max_grad_norm=0.5, loss="mse"), OBS_SPACE, ACT_SPACE, seed=8)
    metrics, _ = agent.update(batch)
    assert metrics["grad_norm"] > 0.5  # the reported norm is the one before clipping
    grads = [p.grad for p in agent.q.parameters() if p.grad is not None]
    total = float(torch.norm(torch.stack([g.norm() for g in grads])))
    assert total == pytest.approx(0.5, rel=1e-3)


def test_no_clipping_when_max_grad_norm_is_zero() -> None:
    batch = make_batch(32, seed=8)
    batch["reward"] *= 1000.0
    agent = DQNAgent(agent_cfg(max_grad_norm=0.0, loss="mse"), OBS_SPACE, ACT_SPACE, seed=8)
    metrics, _ = agent.update(batch)
    grads = [p.grad for p in agent.q.parameters() if p.grad is not None]
    total = float(torch.norm(torch.stack([g.norm() for g in grads])))
    assert total == pytest.approx(metrics["grad_norm"], rel=1e-5) and total > 10


@pytest.mark.parametrize("max_norm", [0.0, 0.5, 1e9])
def test_clip_gradients_is_torchs_clip_bit_for_bit(max_norm: float) -> None:
    """Our lean clip against ``nn.utils.clip_grad_norm_``: the same norm and the same gradients,
    exactly, clipping (0.5), not needing to (1e9) and not asked to (0)."""
    torch.manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2)) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    x = torch.randn(32, 4)
    for net in nets:
        (net(x) ** 2).sum().mul(100.0).backward()
    ours = clip_gradients(nets[0], max_norm)
    if max_norm > 0:
        theirs = torch.nn.utils.clip_grad_norm_(nets[1].parameters(), max_norm)
    else:
        theirs = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in nets[1].parameters()]))
    assert float(theirs) > 1.0 and torch.equal(ours, theirs)
    for a, b in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    clipped = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in nets[0].parameters()])))
    assert clipped == pytest.approx(0.5, rel=1e-4) if max_norm == 0.5 else clipped == pytest.approx(float(ours))


# ---------------------------------------------------------------- target network


def test_hard_target_update_after_interval_only() -> None:
    agent = DQNAgent(agent_cfg(target_update_interval=3, tau=1.0), OBS_SPACE, ACT_SPACE, seed=10)
    initial = net_params(agent.target)
    assert same_params(initial, net_params(agent.q))  # starts as a copy
    for i in range(2):
        agent.update(make_batch(16, seed=20 + i))
        assert agent.opt_steps == i + 1
        assert same_params(initial, net_params(agent.target))
        assert not same_params(net_params(agent.q), net_params(agent.target))
    agent.update(make_batch(16, seed=22))
    assert agent.opt_steps == 3
    assert same_params(net_params(agent.q), net_params(agent.target))
    after_copy = net_params(agent.target)
    agent.update(make_batch(16, seed=23))
    assert same_params(after_copy, net_params(agent.target))


def test_soft_target_update_is_polyak_average() -> None:
    agent = DQNAgent(agent_cfg(target_update_interval=1, tau=0.5), OBS_SPACE, ACT_SPACE, seed=11)
    perturb_target(agent)
    old_target = net_params(agent.target)
    agent.update(make_batch(16, seed=30))
    new_q = net_params(agent.q)
    for t, old, q in zip(net_params(agent.target), old_target, new_q, strict=True):
        torch.testing.assert_close(t, 0.5 * old + 0.5 * q)
    assert not same_params(net_params(agent.target), new_q)


def test_target_network_is_not_trained() -> None:
    agent = DQNAgent(agent_cfg(target_update_interval=1000), OBS_SPACE, ACT_SPACE, seed=12)
    before = net_params(agent.target)
    for i in range(3):
        agent.update(make_batch(16, seed=40 + i))
    assert same_params(before, net_params(agent.target))
    assert all(not p.requires_grad for p in agent.target.parameters())


# ---------------------------------------------------------------- networks


def test_dueling_head_is_value_plus_centred_advantage() -> None:
    policy = DQNPolicy(agent_cfg(dueling=True), OBS_SPACE, ACT_SPACE, seed=13)
    net = policy.q
    assert isinstance(net, MLPQNetwork) and net.head.value is not None
    obs = torch.as_tensor(make_batch(20)["obs"])
    with torch.no_grad():
        features = net.torso(obs)
        q = net(obs)
        value = net.head.value(features).squeeze(1)
        adv = net.head.advantage(features)
    torch.testing.assert_close(q.mean(dim=1), value)
    torch.testing.assert_close(q - q.mean(dim=1, keepdim=True), adv - adv.mean(dim=1, keepdim=True))
    assert any(name.startswith("head.value.") for name in policy.params())


def test_plain_head_is_the_advantage_branch() -> None:
    policy = DQNPolicy(agent_cfg(dueling=False), OBS_SPACE, ACT_SPACE, seed=14)
    net = policy.q
    assert isinstance(net, MLPQNetwork) and net.head.value is None
    obs = torch.as_tensor(make_batch(20)["obs"])
    with torch.no_grad():
        torch.testing.assert_close(net(obs), net.head.advantage(net.torso(obs)))
    assert not any(name.startswith("head.value.") for name in policy.params())


def test_mlp_layer_sizes_follow_hidden() -> None:
    policy = DQNPolicy(agent_cfg(hidden=[7, 5], dueling=False), OBS_SPACE, ACT_SPACE)
    shapes = {k: v.shape for k, v in policy.params().items()}
    assert shapes == {"torso.0.weight": (7, 4), "torso.0.bias": (7,), "torso.2.weight": (5, 7),
                      "torso.2.bias": (5,), "head.advantage.weight": (3, 5), "head.advantage.bias": (3,)}


def test_mlp_flattens_matrix_observations() -> None:
    space = gym.spaces.Box(0.0, 1.0, shape=(3, 4), dtype=np.float32)
    policy = DQNPolicy(agent_cfg(), space, ACT_SPACE, seed=0)
    assert policy.params()["torso.0.weight"].shape == (16, 12)
    assert policy.act(np.zeros((5, 3, 4), dtype=np.float32), 0.0).shape == (5,)


def test_nature_cnn_forward_shape() -> None:
    space = gym.spaces.Box(0, 255, shape=(4, 84, 84), dtype=np.uint8)
    agent = DQNAgent(agent_cfg(network="nature_cnn"), space, gym.spaces.Discrete(6), seed=0)
    assert isinstance(agent.q, NatureCNNQNetwork)
    obs = np.random.default_rng(0).integers(0, 256, size=(2, 4, 84, 84), dtype=np.uint8)
    with torch.no_grad():
        q = agent.q(torch.as_tensor(obs))
    assert q.shape == (2, 6) and q.dtype == torch.float32
    actions = agent.act(obs, 0.0)
    assert actions.shape == (2,)
    np.testing.assert_array_equal(actions, q.argmax(dim=1).numpy())
    batch = {"obs": obs, "action": np.array([0, 5]), "reward": np.array([1.0, 0.0], dtype=np.float32),
             "next_obs": obs[::-1].copy(), "discount": np.array([0.99, 0.0], dtype=np.float32)}
    _, priorities = agent.update(batch)
    assert priorities.shape == (2,)


def test_nature_cnn_needs_image_observations() -> None:
    with pytest.raises(ConfigError, match="agent.network: nature_cnn needs"):
        DQNPolicy(agent_cfg(network="nature_cnn"), OBS_SPACE, ACT_SPACE)
    cfg = config_mod.load("configs/cartpole_dqn.yaml", ["agent.network=nature_cnn"])
    with pytest.raises(ConfigError, match="agent.network: nature_cnn needs"):
        make_task(cfg)


# ---------------------------------------------------------------- parameters and state


def test_params_load_params_round_trip() -> None:
    src = DQNPolicy(agent_cfg(), OBS_SPACE, ACT_SPACE, seed=15)
    dst = DQNPolicy(agent_cfg(), OBS_SPACE, ACT_SPACE, seed=16)
    obs = make_batch(50)["obs"]
    assert not np.allclose(q_values(src.q, obs), q_values(dst.q, obs))
    params = src.params()
    for name, array in params.items():
        assert isinstance(array, np.ndarray) and array.dtype == np.float32, name
        assert array.flags["C_CONTIGUOUS"], name
    dst.load_params(params)
    np.testing.assert_array_equal(q_values(src.q, obs), q_values(dst.q, obs))
    for name, array in dst.params().items():
        np.testing.assert_array_equal(array, params[name])
    # loaded arrays are copied, not shared
    for array in params.values():
        array[...] = 0.0
    assert not np.allclose(q_values(dst.q, obs), 0.0)


def test_load_params_wrong_shape_names_the_parameter() -> None:
    policy = DQNPolicy(agent_cfg(), OBS_SPACE, ACT_SPACE, seed=0)
    params = policy.params()
    params["torso.0.weight"] = np.zeros((16, 5), dtype=np.float32)
    before = policy.params()
    with pytest.raises(ValueError, match=r"torso\.0\.weight"):
        policy.load_params(params)
    for name, array in policy.params().items():  # nothing was loaded
        np.testing.assert_array_equal(array, before[name])


def test_load_params_wrong_names_are_listed() -> None:
    policy = DQNPolicy(agent_cfg(), OBS_SPACE, ACT_SPACE, seed=0)
    params = policy.params()
    params["torso.9.weight"] = params.pop("torso.0.weight")
    with pytest.raises(ValueError) as info:
        policy.load_params(params)
    assert "torso.0.weight" in str(info.value) and "torso.9.weight" in str(info.value)


def test_state_dict_round_trip_gives_identical_updates() -> None:
    cfg = agent_cfg(target_update_interval=2)
    a = DQNAgent(cfg, OBS_SPACE, ACT_SPACE, seed=17)
    for i in range(3):
        a.update(make_batch(32, seed=50 + i))
    a.act(make_batch(8)["obs"], 0.5)  # advance the exploration RNG
    b = DQNAgent(cfg, OBS_SPACE, ACT_SPACE, seed=18)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    assert b.opt_steps == 3
    for i in range(3):
        batch = make_batch(32, seed=60 + i, weights=True)
        ma, pa = a.update(batch)
        mb, pb = b.update(batch)
        assert ma == mb
        np.testing.assert_array_equal(pa, pb)
    assert same_params(net_params(a.q), net_params(b.q))
    assert same_params(net_params(a.target), net_params(b.target))
    obs = make_batch(100, seed=70)["obs"]
    np.testing.assert_array_equal(a.act(obs, 0.5), b.act(obs, 0.5))


def test_policy_priorities_use_the_local_network() -> None:
    policy = DQNPolicy(agent_cfg(), OBS_SPACE, ACT_SPACE, seed=19)
    batch = make_batch(40, seed=9)
    priorities = policy.priorities(batch)
    assert priorities.dtype == np.float32 and priorities.shape == (40,)
    assert (priorities >= 0).all()
    rows = np.arange(40)
    target = batch["reward"] + batch["discount"] * q_values(policy.q, batch["next_obs"]).max(axis=1)
    expected = np.abs(target - q_values(policy.q, batch["obs"])[rows, batch["action"]])
    np.testing.assert_allclose(priorities, expected, rtol=1e-5, atol=1e-5)


def test_factories_and_device() -> None:
    task = make_task(config_mod.load("configs/cartpole_dqn.yaml"))
    assert type(task.policy(0, backend="torch")) is DQNPolicy
    assert type(task.agent()) is DQNAgent
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda")
    with pytest.raises(ConfigError, match="run.device"):
        resolve_device("toaster")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            resolve_device("cuda")


def test_huber_reference_matches_torch() -> None:
    """The hand formula used above is torch's smooth_l1 with beta 1."""
    td = torch.tensor([-3.0, -0.5, 0.0, 0.2, 2.5])
    ours = torch.where(td.abs() < 1, 0.5 * td**2, td.abs() - 0.5)
    torch.testing.assert_close(F.smooth_l1_loss(td, torch.zeros(5), reduction="none"), ours)


def test_stager_on_cpu_shares_memory_with_the_arrays() -> None:
    stage = BatchStager("cpu")
    obs = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = stage({"obs": obs, "action": np.array([0, 1, 1])})
    assert not stage.pinned and out["obs"].data_ptr() == obs.ctypes.data  # no copy
    assert out["action"].dtype == torch.int64 and out["action"].tolist() == [0, 1, 1]


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
def test_stager_on_cuda_reuses_pinned_buffers_without_overwriting_transfers() -> None:
    stage = BatchStager("cuda")
    batches = [{"obs": np.full((256, 4, 84, 84), k, dtype=np.uint8), "reward": np.full(256, k, np.float32)}
               for k in range(6)]
    outs = [stage(b) for b in batches]  # three rounds through the two buffers
    torch.cuda.synchronize()
    assert stage.pinned and all(b["obs"].is_pinned() for b in stage._buffers)
    for k, out in enumerate(outs):
        assert out["obs"].device.type == "cuda"
        assert int(out["obs"].min()) == int(out["obs"].max()) == k
        assert float(out["reward"].sum()) == 256 * k


@needs_cuda
def test_update_on_cuda_matches_cpu() -> None:
    rng = np.random.default_rng(0)
    batch = {"obs": rng.standard_normal((32, 4)).astype(np.float32), "action": rng.integers(0, 2, 32),
             "reward": rng.random(32).astype(np.float32), "next_obs": rng.standard_normal((32, 4)).astype(np.float32),
             "discount": np.full(32, 0.97, np.float32), "weights": rng.random(32).astype(np.float32)}
    cpu = DQNAgent(agent_cfg(), OBS_SPACE, ACT_SPACE, "cpu", seed=3)
    gpu = DQNAgent(agent_cfg(), OBS_SPACE, ACT_SPACE, "cuda", seed=3)
    gpu.load_state_dict(cpu.state_dict())
    for _ in range(5):
        m_cpu, p_cpu = cpu.update(batch)
        m_gpu, p_gpu = gpu.update(batch)
        np.testing.assert_allclose(p_gpu, p_cpu, rtol=1e-4, atol=1e-5)
        assert m_gpu["loss"] == pytest.approx(m_cpu["loss"], rel=1e-4, abs=1e-6)
