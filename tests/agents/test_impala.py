"""IMPALA and APPO: V-trace against the paper, segments, the policies, the update, the seam's store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from zmqrl import config
from zmqrl.agents.impala.numpy_policy import LOGP_MIN, NumpyActorCriticPolicy, logp_bound
from zmqrl.agents.impala.segments import segment_problem, trained_steps
from zmqrl.agents.impala.vtrace import vtrace
from zmqrl.bench.data import acted_items
from zmqrl.config import ConfigError
from zmqrl.replay.onpolicy import SegmentQueue
from zmqrl.replay.uniform import UniformReplay
from zmqrl.run.acting import ActingLoop, make_task
from zmqrl.run.startup import make_replay_from

REPO = Path(__file__).resolve().parents[2]
CARTPOLE_APPO = REPO / "configs" / "cartpole_appo.yaml"


def appo(*sets: str) -> config.Config:
    return config.load(CARTPOLE_APPO, ["run.log_level=warning", *sets])


# --------------------------------------------------------------------------------------------- V-trace

def vtrace_reference(log_rho: np.ndarray, reward: np.ndarray, discount: np.ndarray, values: np.ndarray,
                     trained: np.ndarray, rho_bar: float, c_bar: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """V-trace transcribed from the paper's definition (Espeholt et al. 2018, eq. 1), one segment and step at a
    time: ``v_s = V(x_s) + sum_{t=s}^{end} (prod_{i=s}^{t-1} d_i c_i) delta_t V``, where a segment's sum stops
    before the first step that is not trained (the step after it bootstraps from its own value), and the
    policy-gradient advantage ``r_s + d_s v_{s+1} - V(x_s)``."""
    log_rho, reward, discount, values = (np.asarray(x, np.float64) for x in (log_rho, reward, discount, values))
    n, length = reward.shape
    vs = np.zeros((n, length))
    adv = np.zeros((n, length))
    rho = np.exp(log_rho)
    def v_target(b: int, s: int) -> float:
        if s == length or not trained[b, s]:
            return float(values[b, s])
        total, weight = float(values[b, s]), 1.0
        for t in range(s, length):
            if not trained[b, t]:
                break
            delta = min(rho_bar, rho[b, t]) * (reward[b, t] + discount[b, t] * values[b, t + 1] - values[b, t])
            total += weight * delta
            weight *= discount[b, t] * lam * min(c_bar, rho[b, t])
        return total

    for b in range(n):
        for s in range(length):
            if trained[b, s]:
                vs[b, s] = v_target(b, s)
                adv[b, s] = reward[b, s] + discount[b, s] * v_target(b, s + 1) - values[b, s]
            else:
                vs[b, s] = values[b, s]
    return vs, adv


def random_segments(rng: np.random.Generator, n: int, length: int) -> dict[str, np.ndarray]:
    """Segments of ``length`` steps and a bootstrap step with random ends: running on, terminated, truncated."""
    mask = np.ones((n, length + 1), np.float32)
    discount = np.full((n, length + 1), 0.97, np.float32)
    for b in range(n):
        kind = b % 3
        end = int(rng.integers(1, length + 1))
        if kind == 1:  # terminated with step end - 1
            mask[b, end:] = 0
            discount[b, end - 1:] = 0
        elif kind == 2 and end < length:  # truncated: step end - 1 is the last real step
            mask[b, end:] = 0
            discount[b, end:] = 0
    return {"mask": mask, "discount": discount,
            "reward": rng.normal(size=(n, length + 1)).astype(np.float32) * mask,
            "values": rng.normal(size=(n, length + 1)), "log_rho": rng.normal(scale=0.7, size=(n, length))}


@pytest.mark.parametrize("rho_bar,c_bar,lam", [(1.0, 1.0, 1.0), (1.5, 0.8, 0.9), (0.5, 2.0, 0.6)])
def test_vtrace_equals_a_direct_transcription_of_the_paper_on_random_data(rho_bar: float, c_bar: float,
                                                                            lam: float) -> None:
    rng = np.random.default_rng(3)
    length = 7
    seg = random_segments(rng, 30, length)
    trained = trained_steps(seg["mask"], seg["discount"])
    discount, reward = seg["discount"][:, :length], seg["reward"][:, :length]
    want_vs, want_adv = vtrace_reference(seg["log_rho"], reward, discount, seg["values"], trained, rho_bar, c_bar, lam)
    t = {k: torch.as_tensor(np.asarray(v, np.float64)) for k, v in
         {"log_rho": seg["log_rho"], "reward": reward, "discount": discount, "values": seg["values"],
          "trained": trained}.items()}
    got = vtrace(t["log_rho"], t["reward"], t["discount"], t["values"], t["trained"], rho_bar, c_bar, lam)
    np.testing.assert_allclose(got.vs.numpy(), want_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.advantages.numpy(), want_adv * trained, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.clipped_rho.numpy(), np.minimum(rho_bar, np.exp(seg["log_rho"])))


def test_vtrace_on_policy_is_the_n_step_return_to_the_segments_end() -> None:
    """With pi = mu (rho = 1) and lambda = 1, v_s is the discounted rewards to the segment's end (or its
    episode's) plus the discounted bootstrap value there: the n-step return, n shrinking along the segment."""
    rng = np.random.default_rng(7)
    length = 9
    seg = random_segments(rng, 24, length)
    trained = trained_steps(seg["mask"], seg["discount"])
    reward, discount, values = (np.asarray(x, np.float64) for x in
                                (seg["reward"][:, :length], seg["discount"][:, :length], seg["values"]))
    got = vtrace(*(torch.as_tensor(np.asarray(x, np.float64)) for x in
                   (np.zeros((24, length)), reward, discount, values, trained)))
    for b in range(24):
        steps = np.flatnonzero(trained[b])
        if not steps.size:
            continue  # (a truncated episode's last step alone: nothing trained)
        boot = steps.max() + 1  # the step whose value bootstraps the last trained one
        for s in steps:
            ret, scale = 0.0, 1.0
            for t in range(s, boot):
                ret += scale * reward[b, t]
                scale *= discount[b, t]
            np.testing.assert_allclose(got.vs[b, s].item(), ret + scale * values[b, boot], rtol=1e-10)


# --------------------------------------------------------------------------------------------- segments

def test_the_acting_loop_makes_segments_with_behaviour_log_probs_of_the_policy() -> None:
    cfg = appo("env.num_envs=2", "agent.unroll_length=5")
    items = acted_items(cfg, 40, seed=1)
    assert items["obs"].shape == (40, 6, 4) and items["logp"].shape == (40, 6)
    assert segment_problem(items) is None
    real = items["mask"] == 1
    assert real[:, 0].all() and (items["logp"][real] <= 0).all() and (items["logp"][real] > np.log(0.2)).all()
    assert (items["logp"][~real] == 0).all()
    # the log-probability each step carries is the acting policy's for the action it took (version-0 params)
    policy = make_task(cfg).policy(1, backend="numpy")  # (acted_items' policy: version 0 drawn with its seed)
    logits = policy._head(items["obs"][:, :5].reshape(-1, 4))
    logp_all = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    want = np.take_along_axis(logp_all, items["action"][:, :5].reshape(-1, 1), axis=1).reshape(40, 5)
    np.testing.assert_allclose(items["logp"][:, :5][real[:, :5]], want[real[:, :5]], atol=1e-5)


def test_segment_problems_name_the_bad_segment() -> None:
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], np.float32)
    discount = np.array([[0.9, 0.9, 0, 0], [0.9, 0.9, 0.9, 0.9]], np.float32)
    good = {"mask": mask, "discount": discount}
    assert segment_problem(good) is None
    assert trained_steps(mask, discount).tolist() == [[1, 1, 1], [1, 1, 1]]
    for key, change, words in (("mask", lambda m: m.__setitem__((1, 1), 0.5), "other than 0 and 1"),
                               ("mask", lambda m: m.__setitem__((1, 1), 0), "one run"),
                               ("mask", lambda m: m.__setitem__((0, 0), 0), "one run"),
                               ("discount", lambda d: d.__setitem__((1, 0), 0), "termination")):
        bad = {k: v.copy() for k, v in good.items()}
        change(bad[key])
        problem = segment_problem(bad)
        assert problem is not None and words in problem and problem.startswith("segment "), problem
    truncated_alone = {"mask": np.array([[1, 0, 0, 0]], np.float32), "discount": np.array([[0.9, 0, 0, 0]],
                                                                                          np.float32)}
    assert "no step is trained" in str(segment_problem(truncated_alone))


def test_behaviour_log_probs_are_bounded_by_what_the_policy_can_give() -> None:
    task = make_task(appo())
    assert task.value_limits()["logp"] == (LOGP_MIN, 0.0)
    pend = config.load(CARTPOLE_APPO, ["env.id=Pendulum-v1", "agent.log_std_min=-2"])
    bound = logp_bound(pend.agent, gym.spaces.Box(-2, 2, (1,)))  # type: ignore[arg-type]
    assert bound == pytest.approx(-0.5 * np.log(2 * np.pi) + 2.0)


def test_a_gaussian_whose_mean_left_the_box_still_sends_segments_the_learner_takes() -> None:
    """A Gaussian's action is its sample: the env gets it clipped to the Box, the segment keeps the sample and its
    log-probability. Logged clipped, a mean 30 Box widths out gave log-probabilities below -1000 and the intake
    refused every segment (HalfCheetah after ~5 minutes)."""
    cfg = config.load(REPO / "configs" / "pendulum_appo.yaml", ["env.num_envs=2", "agent.unroll_length=8"])
    task = make_task(cfg)
    params = task.initial_params()
    assert params is not None
    params = {**params, "mean.bias": np.array([120.0], np.float32), "log_std": np.array([-1.0], np.float32)}
    policy = task.policy(0, backend="numpy")
    policy.load_params(params)
    loop = ActingLoop(cfg, policy, task.exploration(0), seed=0)
    to_env: list[np.ndarray] = []
    step = loop.stepper.step
    loop.stepper.step = lambda action: (to_env.append(action.copy()), step(action))[1]  # type: ignore[method-assign]
    items: list[dict[str, np.ndarray]] = []
    try:
        while len(items) < 4:
            acted = loop.step()
            if acted.transitions is not None:
                items.append(acted.transitions)
    finally:
        loop.close()
    assert all(np.abs(a).max() <= 2.0 for a in to_env)  # the env's torque bound
    real = np.concatenate([i["mask"] for i in items]) == 1
    action = np.concatenate([i["action"] for i in items])[real]
    logp = np.concatenate([i["logp"] for i in items])[real]
    assert action.min() > 100.0  # the samples, not the clipped torque
    limits = task.value_limits()
    for key in ("action", "logp"):
        values = np.concatenate([i[key] for i in items])
        assert limits[key][0] <= values.min() and values.max() <= limits[key][1], (key, values.min(), values.max())
    assert logp.min() > -10.0  # near the policy's entropy; logged at the clipped action it was about -51,000
    agent = task.agent(seed=0)
    agent.load_params(params)
    obs = np.concatenate([i["obs"] for i in items])[real]
    torch_logp, _ = agent.log_probs(agent.policy(torch.as_tensor(obs)), torch.as_tensor(action))
    np.testing.assert_allclose(logp, torch_logp.detach().numpy(), atol=1e-3)  # the learner's arithmetic agrees


# --------------------------------------------------------------------------------------------- policies, update

@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_numpy_and_torch_policies_agree_and_the_agent_starts_from_version_0(env_id: str) -> None:
    cfg = appo(f"env.id={env_id}")
    task = make_task(cfg)
    initial = task.initial_params()
    assert initial is not None
    agent = task.agent(seed=0)
    agent.adopt_initial(initial)
    for name, value in agent.params().items():
        np.testing.assert_array_equal(value, initial[name], err_msg=name)
    numpy_policy = task.policy(0, backend="numpy")
    assert isinstance(numpy_policy, NumpyActorCriticPolicy)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(64, *task.obs_space.shape)).astype(np.float32)
    params = {k: v + rng.normal(scale=0.3, size=v.shape).astype(np.float32) for k, v in initial.items()}
    numpy_policy.load_params(params)
    agent.load_params(params)
    np.testing.assert_allclose(numpy_policy.greedy(obs), agent.greedy(obs), atol=1e-5)
    action = numpy_policy.act(obs, 1.0)
    logp = numpy_policy.acted_log_probs()
    head = agent.policy(torch.as_tensor(obs))
    torch_logp, _ = agent.log_probs(head, torch.as_tensor(action if action.ndim == 1 else action.astype(np.float32)))
    np.testing.assert_allclose(logp, torch_logp.detach().numpy(), atol=1e-4)
    assert (logp <= task.value_limits()["logp"][1]).all()


@pytest.mark.parametrize("algo,clip", [("appo", 0.2), ("impala", 0.0)])
def test_an_update_trains_policy_and_value_on_segments(algo: str, clip: float) -> None:
    cfg = appo(f"agent.algo={algo}", f"agent.clip_ratio={clip}", "agent.unroll_length=8", "agent.optimizer=adam",
               "agent.lr=0.003", "agent.max_grad_norm=10", "agent.trace_lambda=1.0", "agent.ent_coef=0.01",
               "agent.ent_coef_end=0.0", "agent.lr_schedule=linear", "trainer.max_opts=100")
    task = make_task(cfg)
    items = acted_items(cfg, 32, seed=3)
    agent = task.agent(seed=0)
    before = {k: v.copy() for k, v in agent.params().items()}
    first, _ = agent.update(items)
    for _ in range(40):
        metrics, priorities = agent.update(items)
    assert priorities is None and metrics["skipped"] == 0.0
    assert all(np.isfinite(v) for v in metrics.values()), metrics
    assert metrics["value_loss"] < 0.9 * first["value_loss"]  # the value net fits the V-trace targets
    assert metrics["lr"] < first["lr"] and metrics["ent_coef"] < first["ent_coef"]  # the schedules move
    assert metrics["rho_mean"] != 1.0  # the policy moved away from the one that acted
    assert any(not np.array_equal(before[k], v) for k, v in agent.params().items())


def test_an_update_whose_loss_is_not_finite_is_not_applied() -> None:
    cfg = appo("agent.unroll_length=8")
    task = make_task(cfg)
    items = acted_items(cfg, 8, seed=2)
    agent = task.agent(seed=0)
    before = {k: v.copy() for k, v in agent.params().items()}
    items["reward"] = items["reward"].copy()
    items["reward"][0, 0] = np.inf  # (the intake refuses this; the agent does not trust that alone)
    metrics, _ = agent.update(items)
    assert metrics["skipped"] == 1.0
    for k, v in agent.params().items():
        np.testing.assert_array_equal(v, before[k])


def test_the_agents_state_round_trips() -> None:
    cfg = appo("agent.unroll_length=8")
    task = make_task(cfg)
    items = acted_items(cfg, 8, seed=2)
    agent = task.agent(seed=0)
    agent.update(items)
    state = agent.state_dict()
    other = task.agent(seed=5)
    other.load_state_dict(state)
    a, b = agent.update(items)[0], other.update(items)[0]
    assert a["loss"] == pytest.approx(b["loss"])
    for k, v in agent.params().items():
        np.testing.assert_array_equal(v, other.params()[k])


# ------------------------------------------------------------------------------------ observation normalisation

def test_normalisation_takes_each_batch_once_as_the_moments_of_its_real_steps_and_both_policies_apply_it() -> None:
    cfg = appo("env.id=Pendulum-v1", "agent.unroll_length=8", "agent.normalize_observations=true",
               "agent.obs_clip=3.0")
    task = make_task(cfg)
    agent = task.agent(seed=0)
    first, second = acted_items(cfg, 8, seed=2), acted_items(cfg, 8, seed=3)
    for items, start in ((first, 0), (second, 8)):  # as the FIFO hands them out: fresh indices per batch
        items["indices"] = np.arange(start, start + 8)
        items["obs"] = items["obs"] * np.float32(40.0) + np.float32(7.0)  # far from mean 0, std 1
        items["mask"] = items["mask"].copy()
        items["mask"][0, 4:] = 0.0  # a segment whose episode ended: its padding is not an observation
    for _ in range(3):  # three epochs over the first batch, then the second
        agent.update(first)
    agent.update(second)
    real = np.concatenate([b["obs"][:, :-1][b["mask"][:, :-1] > 0] for b in (first, second)]).astype(np.float64)
    params = agent.params()
    np.testing.assert_allclose(params["obs_mean"], real.mean(axis=0), rtol=1e-4)
    np.testing.assert_allclose(params["obs_var"], real.var(axis=0), rtol=1e-3)

    numpy_policy = task.policy(0, backend="numpy")
    numpy_policy.load_params(params)
    obs = real[:64].astype(np.float32)
    obs[0] = 1e4  # clipped to agent.obs_clip before the torso, in both
    np.testing.assert_allclose(numpy_policy.greedy(obs), agent.greedy(obs), atol=1e-5)
    unnormalised = task.policy(0, backend="numpy")
    plain = {**params, "obs_mean": np.zeros(3, np.float32), "obs_var": np.ones(3, np.float32)}
    unnormalised.load_params(plain)
    assert not np.allclose(unnormalised.greedy(obs), numpy_policy.greedy(obs), atol=1e-3)  # (the control)

    other = task.agent(seed=4)  # the statistics go into checkpoints and come back
    other.load_state_dict(agent.state_dict())
    np.testing.assert_array_equal(other.params()["obs_var"], params["obs_var"])
    off = make_task(appo("env.id=Pendulum-v1", "agent.unroll_length=8")).agent(seed=0)
    with pytest.raises(ValueError, match="agent.normalize_observations"):
        other.load_state_dict(off.state_dict())
    with pytest.raises(ValueError, match="agent.normalize_observations"):
        off.load_state_dict(agent.state_dict())


def test_observations_too_large_for_float32_moments_leave_the_statistics_as_they_were() -> None:
    cfg = appo("env.id=Pendulum-v1", "agent.unroll_length=8", "agent.normalize_observations=true")
    agent = make_task(cfg).agent(seed=0)
    honest, absurd = acted_items(cfg, 8, seed=2), acted_items(cfg, 8, seed=3)
    honest["indices"], absurd["indices"] = np.arange(8), np.arange(8, 16)
    absurd["obs"] = absurd["obs"].copy()
    absurd["obs"][0, 0, 0] = np.float32(3e38)  # finite (the intake takes it), its square is not in float32
    agent.update(honest)
    before = {k: agent.params()[k].copy() for k in ("obs_mean", "obs_var")}
    agent.update(absurd)
    for key, value in before.items():
        np.testing.assert_array_equal(agent.params()[key], value)
    assert np.isfinite(agent.params()["obs_var"]).all()


def test_normalisation_is_refused_for_frames_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="agent.normalize_observations"):
        make_task(appo("env.id=zmqrl/Catch-v0", "agent.network=nature_cnn", "agent.normalize_observations=true"))


# --------------------------------------------------------------------------------------------- the seam

def test_the_algorithm_chooses_the_store_and_replay_algorithms_keep_theirs() -> None:
    cfg = appo()
    store = make_replay_from(cfg, make_task(cfg).batch_spec())
    assert isinstance(store, SegmentQueue) and store.epochs == 10 and store.capacity == 16 and store.max_lag == 20
    dqn = config.load(REPO / "configs" / "cartpole_dqn.yaml", ["replay.prioritized=false"])
    assert isinstance(make_replay_from(dqn, make_task(dqn).batch_spec()), UniformReplay)
    assert make_task(cfg).replay_item == "segment"


def test_configs_the_store_cannot_serve_are_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="trainer.warmup"):
        make_task(appo("trainer.warmup=100"))
    with pytest.raises(ConfigError, match="env.id"):
        make_task(appo("env.id=CarRacing-v3"))
    with pytest.raises(ConfigError, match="agent.compile"):
        make_task(appo("agent.compile=graph", "run.device=cuda"))
    with pytest.raises(ConfigError, match="agent.lstm_size"):
        make_task(appo("env.id=zmqrl/Catch-v0", "agent.network=nature_cnn", "agent.lstm_size=8"))


@pytest.mark.slow
def test_the_algorithm_entry_and_numpy_policy_do_not_import_torch() -> None:
    code = ("import sys, numpy as np\n"
            "from zmqrl import config\n"
            "from zmqrl.run.acting import make_task\n"
            f"cfg = config.load({str(CARTPOLE_APPO)!r}, [])\n"
            "task = make_task(cfg)\n"
            "p = task.policy(0)\n"
            "p.act(np.zeros((2, 4), np.float32), 1.0)\n"
            "assert task.initial_params() is not None\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr


def test_minibatches_make_a_pass_of_several_gradient_steps_over_shuffled_segments() -> None:
    cfg = appo("agent.unroll_length=8", "agent.minibatches=4")
    task = make_task(cfg)
    items = acted_items(cfg, 16, seed=2)
    agent = task.agent(seed=0)
    metrics, _ = agent.update(items)
    adam = agent.optimizer.state[next(iter(agent.policy.parameters()))]
    assert int(adam["step"]) == 4 and agent.opt_steps == 1 and metrics["skipped"] == 0.0
    assert all(np.isfinite(v) for v in metrics.values())


def test_the_nature_cnn_acts_in_torch_and_trains_on_frames_with_a_shared_torso() -> None:
    cfg = appo("env.id=zmqrl/Catch-v0", "agent.network=nature_cnn", "agent.hidden=[32]", "env.num_envs=2",
               "agent.unroll_length=6", "actor.backend=auto")
    task = make_task(cfg)
    assert task.initial_params() is None  # (the learner builds the CNN before its first model)
    assert task.batch_spec()["obs"] == (np.dtype(np.uint8), (7, 1, 84, 84))
    items = acted_items(cfg, 8, seed=1)
    assert segment_problem(items) is None and (items["logp"] <= 0).all()
    agent = task.agent(seed=0)
    assert agent.value.torso is None  # one torso for both: the value head reads the policy's features
    assert [name for name, _ in agent.value.named_parameters()] == ["out.weight", "out.bias"]
    metrics, _ = agent.update(items)
    assert metrics["skipped"] == 0.0 and all(np.isfinite(v) for v in metrics.values())
    assert agent.greedy(items["obs"][:, 0]).shape == (8,)
    with pytest.raises(ConfigError, match="nature_cnn"):
        make_task(appo("agent.network=nature_cnn"))


def test_an_lstm_policy_acts_with_a_state_per_env_and_the_learner_unrolls_segments_from_their_states() -> None:
    """The actor's log-probability of every real step is what the learner's policy gives it when it unrolls
    the segment from its stored state with the same parameters: segments start where the actor's state was."""
    cfg = config.load(REPO / "configs" / "cartpole_pomdp_appo.yaml",
                      ["env.num_envs=3", "agent.unroll_length=6", "agent.lstm_size=8", "agent.hidden=[16]"])
    task = make_task(cfg)
    spec, limits = task.batch_spec(), task.value_limits()
    assert spec["state_h"] == spec["state_c"] == (np.dtype(np.float32), (8,))
    assert limits["state_h"] == (-1.0, 1.0)
    policy = task.policy(1, backend="numpy")
    with pytest.raises(TypeError, match="recurrent"):
        policy.act(np.zeros((1, 2), np.float32), 1.0)
    items = acted_items(cfg, 60, seed=1)  # (its policy: version 0 drawn with seed 1)
    assert segment_problem(items) is None and not (items["state_h"] == 0).all()
    agent = task.agent(seed=0)
    initial = task.initial_params()
    assert initial is not None
    params = policy_params_of(task, 1)
    assert set(params) == set(initial)
    agent.adopt_initial(params)
    with torch.no_grad():
        out, _, _ = agent.policy.unroll(torch.as_tensor(items["obs"]), torch.as_tensor(items["state_h"]),
                                        torch.as_tensor(items["state_c"]))
        head = agent.policy.head_of(out[:, :6].reshape(-1, 8))
        logp, _ = agent.log_probs(head, torch.as_tensor(items["action"][:, :6].reshape(-1)))
    real = items["mask"][:, :6] == 1
    np.testing.assert_allclose(logp.view(60, 6).numpy()[real], items["logp"][:, :6][real], atol=1e-5)
    metrics, _ = agent.update(items)
    assert metrics["skipped"] == 0.0 and metrics["rho_mean"] == pytest.approx(1.0, abs=1e-4)
    torch_policy = task.policy(0, backend="torch")
    torch_policy.load_params(agent.params())
    policy.load_params(agent.params())
    state = np.random.default_rng(2).uniform(-0.5, 0.5, (4, 2, 8)).astype(np.float32)
    obs = np.random.default_rng(3).normal(size=(4, 2)).astype(np.float32)
    a_np, s_np = policy.greedy_recurrent(obs, state)
    a_t, s_t = torch_policy.greedy_recurrent(obs, state)
    np.testing.assert_array_equal(a_np, a_t)
    np.testing.assert_allclose(s_np, s_t, atol=1e-6)


def policy_params_of(task: object, seed: int) -> dict[str, np.ndarray]:
    """Version-0 parameters as a policy built with ``seed`` draws them."""
    from zmqrl.agents.impala.numpy_policy import initial_policy_params

    cfg = task.cfg  # type: ignore[attr-defined]
    return initial_policy_params(cfg.agent, 2, task.action_space, seed)  # type: ignore[attr-defined]
