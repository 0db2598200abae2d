"""R2D2: config keys, the sequence item's spec and meaning check, value rescaling, the recurrent network,
the numpy and torch policies, and the learner's update against a per-step reference built from the
definitions (burn-in without gradient, double n-step targets truncated at item and episode ends,
value rescaling, per-sequence priorities)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from zmqrl import config
from zmqrl.agents.base import algorithm
from zmqrl.agents.r2d2.agent import R2D2Agent, R2D2Policy, inverse_rescale, rescale
from zmqrl.agents.r2d2.config import R2D2Config
from zmqrl.agents.r2d2.networks import R2D2Network
from zmqrl.agents.r2d2.numpy_policy import NumpyR2D2Policy, initial_mlp_params
from zmqrl.agents.r2d2.sequences import STATE_C_LIMIT, Layout, sequence_targets
from zmqrl.agents.r2d2.sequences import inverse_rescale as np_inverse_rescale
from zmqrl.agents.r2d2.sequences import rescale as np_rescale
from zmqrl.config import ConfigError
from zmqrl.core import DefersUpdates, RecurrentPolicy
from zmqrl.run.acting import make_task
from zmqrl.run.adders import SequenceAdder

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
OBS = gym.spaces.Box(-2.0, 2.0, shape=(3,), dtype=np.float32)
ACT = gym.spaces.Discrete(3)
LAYOUT = Layout(burn_in=3, length=5, overlap=2)
SMALL = ("agent.algo=r2d2", "replay.burn_in=3", "replay.sequence_length=5", "replay.overlap=2", "agent.hidden=[16]",
         "agent.lstm_size=8", "agent.head_hidden=0", "agent.n_step=3", "agent.gamma=0.9", "agent.batch_size=8",
         "trainer.warmup=8")


def small_cfg(*overrides: str) -> config.Config:
    return config.load(None, [*SMALL, *overrides])


def agent_cfg(**changes: object) -> R2D2Config:
    base = {"hidden": [16], "lstm_size": 8, "head_hidden": 0, "n_step": 3, "gamma": 0.9, "lr": 1e-2,
            "target_update_interval": 3}
    return R2D2Config(**{**base, **changes})  # type: ignore[arg-type]


def make_items(policy: Any, gamma: float, seed: int, num_envs: int = 3,
               steps: int = 60, layout: Layout = LAYOUT) -> dict[str, np.ndarray]:
    """Sequence items from random episodes (some short, terminated or truncated) acted on by ``policy``
    (so the stored states are real LSTM states), with random importance weights."""
    rng = np.random.default_rng(seed)
    adder = SequenceAdder(num_envs, layout.burn_in, layout.length, layout.overlap, gamma)
    state = policy.initial_state(num_envs)
    parts = []
    for _ in range(steps):
        obs = rng.uniform(-2, 2, (num_envs, 3)).astype(np.float32)
        action, after = policy.act_recurrent(obs, 0.5, state)
        term = rng.random(num_envs) < 0.06
        trunc = ~term & (rng.random(num_envs) < 0.04)
        out = adder.push(obs, action.astype(np.int64), rng.normal(size=num_envs).astype(np.float32), term, trunc,
                         state)
        state = after
        state[term | trunc] = policy.initial_state(int((term | trunc).sum()))
        if out is not None:
            parts.append(out)
    batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    batch["weights"] = rng.uniform(0.2, 1.0, len(batch["mask"])).astype(np.float32)
    return batch


# --- config --------------------------------------------------------------------------------------


def test_r2d2_needs_a_sequence_length_and_others_refuse_one() -> None:
    with pytest.raises(ConfigError, match=r"replay\.sequence_length.*r2d2"):
        config.load(None, ["agent.algo=r2d2"])
    with pytest.raises(ConfigError, match=r"replay\.sequence_length.*dqn"):
        config.load(None, ["replay.sequence_length=10"])
    with pytest.raises(ConfigError, match=r"replay\.overlap"):
        small_cfg("replay.overlap=5")
    with pytest.raises(ConfigError, match=r"replay\.burn_in"):
        small_cfg("replay.burn_in=-1")
    with pytest.raises(ConfigError, match=r"agent\.priority_eta"):
        small_cfg("agent.priority_eta=1.5")
    with pytest.raises(ConfigError, match=r"agent\.lstm_size"):
        small_cfg("agent.lstm_size=0")
    with pytest.raises(ConfigError, match=r"agent\.network"):
        small_cfg("agent.network=resnet")
    cfg = small_cfg()
    assert isinstance(cfg.agent, R2D2Config) and cfg.replay.sequence_length == 5
    defaults = R2D2Config()
    assert (defaults.gamma, defaults.n_step, defaults.max_grad_norm, defaults.target_update_interval,
            defaults.rescale_eps, defaults.priority_eta, defaults.lstm_size) == (0.997, 5, 40.0, 2500, 1e-3, 0.9, 512)


def test_compile_graph_is_refused_naming_the_key_and_the_agent_says_it_runs_eager(
        caplog: pytest.LogCaptureFixture) -> None:
    cfg = small_cfg("agent.compile=graph", "run.device=auto")
    with pytest.raises(ConfigError, match=r"agent\.compile: graph .*r2d2"):
        make_task(cfg)
    task = make_task(small_cfg("agent.compile=auto"))
    with caplog.at_level("INFO", logger="zmqrl"):
        task.agent()
    assert "r2d2 updates run eager on cpu (agent.compile=auto" in caplog.text


def test_sequence_items_stand_for_their_period_in_env_steps_and_new_frames() -> None:
    task = make_task(small_cfg())  # burn-in 3, length 5, overlap 2: an item every 3 steps, 9 steps an item
    assert (task.env_steps_per_item(), task.new_frames_per_item(), task.env_steps_held()) == (3, 3, 9)
    assert task.replay_item == "sequence item"
    dqn = make_task(config.load(None))
    assert (dqn.env_steps_per_item(), dqn.new_frames_per_item(), dqn.replay_item) == (1, 1, "transition")


@pytest.mark.slow
def test_the_algorithm_entry_and_numpy_policy_do_not_import_torch() -> None:
    code = ("import sys; import gymnasium as gym, numpy as np; from zmqrl import config; "
            "from zmqrl.agents.base import algorithm; "
            f"cfg = config.load(None, {list(SMALL)!r}); a = algorithm('r2d2'); "
            "obs, act = gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Discrete(2); "
            "a.check_spaces(cfg, obs, act); "
            "p = a.make_policy(cfg, obs, act); p.load_params(a.initial_params(cfg, obs, act, 0)); "
            "a.batch_spec(cfg, obs, act); print(type(p).__name__, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["NumpyR2D2Policy", "False"]


@pytest.mark.parametrize("name", ["cartpole_pomdp_r2d2", "cartpole_pomdp_dqn", "pong_r2d2"])
def test_shipped_configs_load_with_their_sequence_layout(name: str) -> None:
    cfg = config.load(REPO / "configs" / f"{name}.yaml")
    if cfg.agent.algo == "dqn":
        assert cfg.replay.sequence_length == 0 and cfg.env.wrappers == ["mask_velocity"]
        return
    assert isinstance(cfg.agent, R2D2Config)
    lay = (cfg.replay.burn_in, cfg.replay.sequence_length, cfg.replay.overlap)
    if name == "pong_r2d2":  # R2D2's Atari settings
        assert lay == (40, 80, 40) and (cfg.agent.n_step, cfg.agent.gamma) == (5, 0.997)
        assert (cfg.replay.alpha, cfg.replay.beta0) == (0.9, 0.6) and cfg.agent.network == "nature_cnn"
    else:
        assert cfg.env.wrappers == ["mask_velocity"] and cfg.agent.network == "mlp"


# --- the item: spec, limits, meaning -------------------------------------------------------------


def test_adder_items_fit_the_batch_spec_and_pass_the_checks() -> None:
    cfg = small_cfg()
    algo = algorithm("r2d2")
    policy = algo.make_policy(cfg, OBS, ACT, seed=0)
    assert isinstance(policy, NumpyR2D2Policy)
    batch = make_items(policy, 0.9, seed=1)
    del batch["weights"]
    spec = algo.batch_spec(cfg, OBS, ACT)
    assert set(spec) == set(batch)
    for key, (dtype, shape) in spec.items():
        assert batch[key].dtype == dtype and batch[key].shape[1:] == shape, key
    limits = algo.value_limits(cfg, OBS, ACT)
    assert limits["state_h"] == (-1.0, 1.0) and limits["state_c"] == (-STATE_C_LIMIT, STATE_C_LIMIT)
    assert limits["mask"] == (0.0, 1.0) and limits["action"] == (0.0, 2.0) and "next_obs" not in limits
    for key, (lo, hi) in limits.items():
        assert lo <= batch[key].min() and batch[key].max() <= hi, key
    assert algo.batch_problem(cfg, batch) is None
    assert (batch["mask"][:, 0] == 0).any() and (batch["mask"][:, -1] == 0).any()  # both kinds of padding
    assert algorithm("dqn").batch_problem(cfg, batch) is None  # the seam's default


def broken(batch: Mapping[str, np.ndarray], key: str, item: int, fix: object) -> dict[str, np.ndarray]:
    out = {k: v.copy() for k, v in batch.items()}
    out[key][item] = fix
    return out


def test_batch_problem_names_what_is_wrong() -> None:
    cfg = small_cfg()
    algo = algorithm("r2d2")
    batch = make_items(algo.make_policy(cfg, OBS, ACT, seed=0), 0.9, seed=2)
    padded_start = int(np.flatnonzero(batch["mask"][:, 0] == 0)[0])
    full = int(np.flatnonzero(batch["mask"].all(axis=1))[0])
    b = LAYOUT.burn_in
    cases = {
        "other than 0 and 1": broken(batch, "mask", full, np.full(LAYOUT.steps, 0.5, np.float32)),
        "not one run": broken(batch, "mask", full, np.array([1, 1, 0, 1, 1, 1, 1, 1, 1], np.float32)),
        "first trained step": broken(batch, "mask", full, np.array([1, 1, 1, 0, 0, 0, 0, 0, 0], np.float32)),
        "zero state": broken(batch, "state_c", padded_start, np.full(8, 0.3, np.float32)),
        "discount of 0": broken(batch, "discount", full, np.where(np.arange(LAYOUT.steps) == 5, 0, 0.9)),
        "no trained step has a target": broken(batch, "mask", full, (np.arange(LAYOUT.steps) <= b).astype(np.float32)),
        "state_h": broken(batch, "state_h", full, np.full(8, np.nan, np.float32)),
        "state_c": broken(batch, "state_c", full, np.full(8, 2 * STATE_C_LIMIT, np.float32)),
    }
    for words, bad in cases.items():
        problem = algo.batch_problem(cfg, bad)
        assert problem is not None and words in problem, (words, problem)
        item = padded_start if words == "zero state" else full
        assert problem.startswith(f"item {item}:"), problem


# --- value rescaling -----------------------------------------------------------------------------


def test_value_rescaling_and_its_inverse_are_exact_inverses() -> None:
    x = np.concatenate([[0.0, 1e-6, -1e-6, 1.0, -1.0, 1e6, -1e6], np.random.default_rng(0).normal(0, 300, 1000)])
    for eps in (1e-3, 1e-2):
        np.testing.assert_allclose(np_inverse_rescale(np_rescale(x, eps), eps), x, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(np_rescale(np_inverse_rescale(x, eps), eps), x, rtol=1e-9, atol=1e-9)
        t = torch.from_numpy(x)
        np.testing.assert_allclose(inverse_rescale(rescale(t, eps), eps).numpy(), x, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(rescale(t, eps).numpy(), np_rescale(x, eps), rtol=1e-12, atol=1e-15)
    assert np_rescale(np.array([3.0]), 1e-3)[0] == pytest.approx(1.0 + 3e-3)  # sqrt(4) - 1 + eps * 3


# --- network and policies ------------------------------------------------------------------------


def test_network_unrolls_like_single_steps_and_padding_holds_the_state() -> None:
    torch.manual_seed(0)
    policy = R2D2Policy(agent_cfg(), LAYOUT, OBS, ACT, seed=0)
    obs = torch.randn(4, 6, 3)
    h0, c0 = torch.randn(4, 8) * 0.5, torch.randn(4, 8)
    with torch.no_grad():
        q_all, (h_all, c_all) = policy.q(obs, (h0, c0))
        h, c, qs = h0, c0, []
        for t in range(6):
            q, (h, c) = policy.q(obs[:, t:t + 1], (h, c))
            qs.append(q[:, 0])
        np.testing.assert_allclose(torch.stack(qs, 1).numpy(), q_all.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(h.numpy(), h_all.numpy(), rtol=1e-5, atol=1e-6)
        hold = torch.zeros(4, 6, dtype=torch.bool)
        hold[:, :2] = True  # two padding steps first: as if the sequence started at step 2
        q_held, _ = policy.q(obs, (h0, c0), hold)
        q_late, _ = policy.q(obs[:, 2:], (h0, c0))
        np.testing.assert_allclose(q_held[:, 2:].numpy(), q_late.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("head_hidden", [0, 6])
@pytest.mark.parametrize("dueling", [True, False])
def test_numpy_policy_matches_the_torch_policy(head_hidden: int, dueling: bool) -> None:
    cfg = agent_cfg(head_hidden=head_hidden, dueling=dueling, hidden=[16, 12])
    reference = R2D2Policy(cfg, LAYOUT, OBS, ACT, seed=3)
    policy = NumpyR2D2Policy(cfg, LAYOUT, OBS, ACT, seed=0)
    policy.load_params(reference.params())
    rng = np.random.default_rng(1)
    obs = rng.uniform(-2, 2, (64, 3)).astype(np.float32)
    state = np.stack([np.tanh(rng.normal(size=(64, 8))), rng.normal(0, 2, (64, 8))], axis=1).astype(np.float32)
    q_np, state_np = policy.step(obs, state)
    q_t, state_t = reference.step(obs, state)
    np.testing.assert_allclose(q_np, q_t, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state_np, state_t, rtol=1e-5, atol=1e-5)
    assert np.array_equal(policy.greedy_recurrent(obs, state)[0], reference.greedy_recurrent(obs, state)[0])
    batch = make_items(policy, 0.9, seed=4)
    q_seq = policy.sequence_q(batch["obs"], batch["state_h"], batch["state_c"], batch["mask"])
    np.testing.assert_allclose(q_seq, reference.sequence_q(batch["obs"], batch["state_h"], batch["state_c"],
                                                           batch["mask"]), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(policy.priorities(batch), reference.priorities(batch), rtol=1e-4, atol=1e-5)


def test_policies_are_recurrent_and_refuse_to_act_without_a_state() -> None:
    cfg = agent_cfg()
    for policy in (NumpyR2D2Policy(cfg, LAYOUT, OBS, ACT), R2D2Policy(cfg, LAYOUT, OBS, ACT)):
        assert isinstance(policy, RecurrentPolicy)
        state = policy.initial_state(5)
        assert state.shape == (5, 2, 8) and state.dtype == np.float32 and not state.any()
        with pytest.raises(TypeError, match="act_recurrent"):
            policy.act(np.zeros((1, 3), np.float32), 0.1)
        with pytest.raises(TypeError, match="greedy_recurrent"):
            policy.greedy(np.zeros((1, 3), np.float32))


def test_epsilon_per_env_slot_explores_and_zero_is_greedy() -> None:
    cfg = small_cfg("actor.num_actors=2", "actor.eps_per_env=true", "env.num_envs=4")
    eps = algorithm("r2d2").exploration(cfg, actor_index=1)(0)
    assert np.shape(eps) == (4,) and np.all(np.diff(eps) < 0)  # Ape-X's ladder over the slots, as for DQN
    policy = NumpyR2D2Policy(agent_cfg(), LAYOUT, OBS, ACT, seed=5)
    obs = np.zeros((3000, 3), np.float32)
    state = policy.initial_state(3000)
    counts = np.bincount(policy.act_recurrent(obs, 1.0, state)[0], minlength=3)
    assert counts.min() > 900
    greedy, after = policy.greedy_recurrent(obs, state)
    explored, after_explored = policy.act_recurrent(obs, 0.0, state)
    assert np.array_equal(explored, greedy) and np.array_equal(after, after_explored)


def test_initial_params_are_torch_shaped_and_a_torch_agent_adopts_them_exactly() -> None:
    cfg = small_cfg("agent.head_hidden=4")
    algo = algorithm("r2d2")
    params = algo.initial_params(cfg, OBS, ACT, seed=7)
    assert params is not None
    agent = algo.make_agent(cfg, OBS, ACT, seed=1)
    assert isinstance(agent, R2D2Agent)
    own = agent.params()
    assert {k: v.shape for k, v in params.items()} == {k: v.shape for k, v in own.items()}
    agent.adopt_initial(params)
    for name, value in agent.params().items():
        np.testing.assert_array_equal(value, params[name], err_msg=name)
    for name, value in agent.target.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), params[name], err_msg=name)
    lstm_bound = 1 / np.sqrt(8)
    assert np.abs(params["lstm.weight_hh_l0"]).max() <= lstm_bound and params["lstm.weight_hh_l0"].std() > 0.1
    assert np.abs(params["torso.0.weight"]).max() <= 1 / np.sqrt(3)
    again = initial_mlp_params(cfg.agent, 3, 3, seed=7)  # type: ignore[arg-type]
    assert all(np.array_equal(again[k], params[k]) for k in params)
    assert algorithm("r2d2").initial_params(small_cfg("agent.network=nature_cnn"), OBS, ACT, 0) is None


def test_actor_priorities_match_the_learners_for_identical_weights() -> None:
    cfg = small_cfg()
    algo = algorithm("r2d2")
    agent = algo.make_agent(cfg, OBS, ACT, seed=2)
    numpy_policy = algo.make_policy(cfg, OBS, ACT, backend="numpy")
    torch_policy = algo.make_policy(cfg, OBS, ACT, backend="torch")
    for policy in (numpy_policy, torch_policy):
        policy.load_params(agent.params())
    batch = make_items(numpy_policy, 0.9, seed=3)
    _, learner = agent.update(batch)  # the step's priorities come from the weights before it
    assert learner is not None
    for policy in (numpy_policy, torch_policy):
        local = policy.priorities(batch)
        assert local is not None
        np.testing.assert_allclose(local, learner, rtol=1e-4, atol=1e-5)


# --- the update against a reference --------------------------------------------------------------


def run_item(net: R2D2Network, grad: bool, batch: Mapping[str, np.ndarray], i: int, burn_in: int
             ) -> dict[int, torch.Tensor]:
    """Q of each real step of item ``i``, the network stepped one step at a time from the stored state;
    gradient only from the first trained step on (``grad``)."""
    h = torch.from_numpy(batch["state_h"][i][None].copy())
    c = torch.from_numpy(batch["state_c"][i][None].copy())
    qs = {}
    for row in np.flatnonzero(batch["mask"][i] == 1):
        with torch.set_grad_enabled(grad and bool(row >= burn_in)):
            x = net.torso(torch.from_numpy(batch["obs"][i, row][None]))
            out, (h1, c1) = net.lstm(x[:, None], (h[None], c[None]))
            h, c = h1[0], c1[0]
            qs[int(row)] = net.head(out[:, 0])[0]
    return qs


def reference_loss(agent: R2D2Agent, batch: Mapping[str, np.ndarray]) -> tuple[torch.Tensor, np.ndarray]:
    """The loss and priorities computed item by item and step by step from the definitions: the networks
    run one step at a time from the stored state over real steps only, burn-in under no_grad; each trained
    step's target sums rewards up to min(j + n, last real step) (one past it where the episode
    terminated), bootstraps with the target network's value of the online argmax through h^-1."""
    cfg, b, length = agent.cfg, agent.layout.burn_in, agent.layout.length
    eps, n = cfg.rescale_eps, cfg.n_step
    losses, priorities = [], []
    for i in range(len(batch["mask"])):
        mask, discount, reward, action = (batch[k][i] for k in ("mask", "discount", "reward", "action"))
        real = np.flatnonzero(mask == 1)
        last = int(real[-1])
        terminated = discount[last] == 0

        online, target = (run_item(net, grad, batch, i, b) for net, grad in ((agent.q, True), (agent.target, False)))
        tds = []
        for j in range(b, b + length):
            boot = min(j + n, last + 1 if terminated else last)
            if mask[j] != 1 or boot <= j:
                continue
            ret, scale = 0.0, 1.0
            for k in range(j, boot):
                ret += scale * float(reward[k])
                scale *= float(discount[k])
            value = 0.0
            if boot <= last:
                best = int(online[boot].argmax()) if cfg.double else int(target[boot].argmax())
                value = float(np_inverse_rescale(np.array(target[boot][best].item()), eps))
            y = float(np_rescale(np.array(ret + scale * value), eps))
            tds.append(y - online[j][int(action[j])])
        td = torch.stack(tds)
        losses.append(float(batch["weights"][i]) * 0.5 * (td ** 2).sum())
        a = td.detach().abs().numpy()
        priorities.append(cfg.priority_eta * a.max() + (1 - cfg.priority_eta) * a.mean())
    return torch.stack(losses).mean(), np.array(priorities, np.float32)


@pytest.mark.parametrize("double", [True, False])
def test_update_matches_the_per_step_reference_and_burn_in_takes_no_gradient(double: bool) -> None:
    torch.manual_seed(0)
    agent = R2D2Agent(agent_cfg(double=double), LAYOUT, OBS, ACT, seed=4)
    with torch.no_grad():  # a target unlike the online network, so double Q's choice matters
        for p in agent.target.parameters():
            p.add_(0.3 * torch.randn_like(p))
    batch = make_items(agent, 0.9, seed=5)
    assert (batch["mask"][:, 0] == 0).any() and (batch["discount"][batch["mask"] == 1] == 0).any()
    want_loss, want_priorities = reference_loss(agent, batch)
    agent.optimizer.zero_grad()
    want_loss.backward()
    want_grads = [p.grad.clone() for p in agent.q.parameters()]  # type: ignore[union-attr]
    agent.optimizer.zero_grad()
    out = agent.sequence_loss(agent.staged(batch))
    assert out.loss.item() == pytest.approx(want_loss.item(), rel=1e-4)
    out.loss.backward()
    for got, want in zip((p.grad for p in agent.q.parameters()), want_grads, strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-3, atol=1e-6)  # type: ignore[union-attr]
    metrics, priorities = agent.update(batch)
    np.testing.assert_allclose(priorities, want_priorities, rtol=1e-4, atol=1e-6)
    assert metrics["loss"] == pytest.approx(want_loss.item(), rel=1e-4) and metrics["skipped"] == 0.0


def test_burn_in_steps_change_the_loss_through_the_state_alone() -> None:
    agent = R2D2Agent(agent_cfg(), LAYOUT, OBS, ACT, seed=6)
    batch = make_items(agent, 0.9, seed=6)
    full = batch["mask"][:, 0] == 1  # items whose burn-in is real
    other = {k: v.copy() for k, v in batch.items()}
    other["obs"][:, : LAYOUT.burn_in] += 1.0
    with torch.no_grad():
        losses = [agent.sequence_loss(agent.staged(x)).loss.item() for x in (batch, other)]
        only_padded = {k: v[~full] for k, v in batch.items()}
        moved = {k: v[~full] for k, v in other.items()}
        moved["obs"][:, : LAYOUT.burn_in] = np.where(only_padded["mask"][:, : LAYOUT.burn_in, None] == 0, 5.0,
                                                     only_padded["obs"][:, : LAYOUT.burn_in])
        padded = [agent.sequence_loss(agent.staged(x)).loss.item() for x in (only_padded, moved)]
    assert losses[0] != pytest.approx(losses[1], rel=1e-6)  # real burn-in steps move the state
    assert padded[0] == pytest.approx(padded[1], rel=1e-6)  # padding before the episode does not


def test_sequence_targets_by_hand() -> None:
    """B = 1, L = 3, n = 2: an episode that terminates at the item's step 3, one truncated at step 3."""
    reward = np.array([[0, 1, 2, 4, 0], [0, 1, 2, 4, 0]], np.float32)
    discount = np.array([[0.5, 0.5, 0.5, 0, 0], [0.5, 0.5, 0.5, 0.5, 0]], np.float32)
    mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 0]], np.float32)
    t = sequence_targets(reward, discount, mask, burn_in=1, n=2)
    np.testing.assert_allclose(t.returns, np.array([[1 + 0.5 * 2, 2 + 0.5 * 4, 4], [2, 2, 0]]))
    np.testing.assert_allclose(t.boot_discount, [[0.25, 0, 0], [0.25, 0.5, 0]])
    np.testing.assert_array_equal(t.boot_index, [[2, 3, 3], [2, 2, 2]])  # the truncated one bootstraps from step 3
    np.testing.assert_array_equal(t.trainable, [[1, 1, 1], [1, 1, 0]])


def test_deferred_update_is_the_update_and_a_non_finite_step_is_skipped() -> None:
    one, two = (R2D2Agent(agent_cfg(), LAYOUT, OBS, ACT, seed=8) for _ in range(2))
    assert isinstance(one, DefersUpdates)
    batch = make_items(one, 0.9, seed=8)

    def target_is_online() -> bool:
        online = one.q.state_dict()
        return all(torch.equal(value, online[name]) for name, value in one.target.state_dict().items())

    for step in range(1, 5):  # the target is copied every 3 steps
        got = one.update_deferred(batch).result()
        want = two.update(batch)
        assert got[0] == want[0]
        np.testing.assert_array_equal(got[1], want[1])
        assert target_is_online() == (step == 3), step
    before = {k: v.clone() for k, v in one.q.state_dict().items()}
    bad = {k: v.copy() for k, v in batch.items()}
    bad["reward"][0, LAYOUT.burn_in] = np.nan
    metrics, _ = one.update(bad)
    assert metrics["skipped"] == 1.0
    for name, value in one.q.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_state_dict_resumes_the_same_updates() -> None:
    one = R2D2Agent(agent_cfg(), LAYOUT, OBS, ACT, seed=9)
    batch = make_items(one, 0.9, seed=9)
    one.update(batch)
    two = R2D2Agent(agent_cfg(), LAYOUT, OBS, ACT, seed=10)
    two.load_state_dict(one.state_dict())
    for _ in range(3):
        got, want = one.update(batch), two.update(batch)
        assert got[0] == want[0]
        np.testing.assert_array_equal(got[1], want[1])


def test_nature_cnn_network_over_frames() -> None:
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    cfg = small_cfg("agent.network=nature_cnn", "agent.hidden=[32]", "agent.head_hidden=16")
    algo = algorithm("r2d2")
    algo.check_spaces(cfg, frames, ACT)
    policy = algo.make_policy(cfg, frames, ACT, backend="auto")
    agent = algo.make_agent(cfg, frames, ACT)
    assert isinstance(policy, R2D2Policy) and isinstance(agent, R2D2Agent)
    assert "torso.7.weight" in agent.params()  # the conv stack's layers, then the linear layer before the LSTM
    rng = np.random.default_rng(0)
    adder = SequenceAdder(2, 3, 5, 2, 0.9)
    state = policy.initial_state(2)
    parts = []
    for t in range(12):
        obs = rng.integers(0, 255, (2, 4, 84, 84), dtype=np.uint8)
        action, after = policy.act_recurrent(obs, 0.3, state)
        out = adder.push(obs, action.astype(np.int64), np.ones(2, np.float32), np.array([t == 11, False]),
                         np.zeros(2, bool), state)
        state = after
        if out is not None:
            parts.append(out)
    batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    assert algo.batch_problem(cfg, batch) is None
    metrics, priorities = agent.update(batch)
    assert priorities.shape == (len(batch["mask"]),) and np.isfinite(priorities).all() and metrics["skipped"] == 0
    with pytest.raises(ConfigError, match="nature_cnn"):
        algo.check_spaces(cfg, OBS, ACT)


@pytest.mark.parametrize("prioritized", [False, True])
def test_uniform_and_prioritized_replay_hold_sequence_items_through_one_interface(prioritized: bool) -> None:
    """The replay the learner builds from the run's batch spec stores items as sent, samples whole items
    with weights, and takes the update's per-item priorities back."""
    from zmqrl.replay import make_replay

    cfg = small_cfg(f"replay.prioritized={str(prioritized).lower()}", "replay.capacity=500")
    agent = R2D2Agent(cfg.agent, LAYOUT, OBS, ACT, seed=3)  # type: ignore[arg-type]
    items = make_items(agent, 0.9, seed=3)
    items.pop("weights")
    spec = algorithm("r2d2").batch_spec(cfg, OBS, ACT)
    replay = make_replay(500, prioritized, seed=0, schema=spec)
    replay.add(items, priorities=np.linspace(0.1, 2.0, len(items["mask"])))
    for key, value in replay.get(np.arange(len(items["mask"]))).items():
        np.testing.assert_array_equal(value, items[key], err_msg=key)
    batch = replay.sample(8)
    assert batch["obs"].shape == (8, LAYOUT.steps, 3) and batch["weights"].shape == (8,)
    _, priorities = agent.update(batch)
    assert priorities is not None and priorities.shape == (8,)
    replay.update_priorities(batch["indices"], priorities)
    if prioritized:  # each sampled item's leaf is its new priority (the last one written where drawn twice)
        last = {int(i): float(p) for i, p in zip(batch["indices"], priorities, strict=True)}
        leaves = replay.tree.get(np.array(list(last)))  # type: ignore[attr-defined]
        want = (np.array(list(last.values())) + cfg.replay.priority_eps) ** cfg.replay.alpha
        np.testing.assert_allclose(leaves, want, rtol=1e-5)
