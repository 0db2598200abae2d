"""Updates as static programs and CUDA graphs (``agent.compile``, :mod:`zmqrl.agents.graphs`).

On the CPU the static path (the code a graph captures, run uncaptured: static buffers, gradients
zeroed in place, capturable Adam with its learning rate in a tensor) is held equal to the eager
update, bit for bit, over consecutive updates of DQN (MLP and CNN), IQN and SAC; and each known trap
has its check: outputs overwritten by the next step, tensors re-allocated behind the program, silent
fallbacks. The tests named ``test_cuda_*`` capture real graphs and skip without a GPU; the GPU
sprint runs them (``pytest tests/agents/test_graphs.py -k test_cuda_``).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from zmqrl import config as config_mod
from zmqrl.agents.dqn.agent import DQNAgent
from zmqrl.agents.dqn.config import DQNConfig
from zmqrl.agents.graphs import WARMUP, CaptureError, StaticProgram, resolve_compile
from zmqrl.agents.iqn.agent import IQNAgent
from zmqrl.agents.iqn.config import IQNConfig
from zmqrl.agents.sac.agent import SACAgent
from zmqrl.agents.sac.config import SACConfig
from zmqrl.config import ConfigError

VECTOR = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
FRAMES = gym.spaces.Box(0, 255, shape=(4, 84, 84), dtype=np.uint8)
DISCRETE = gym.spaces.Discrete(3)
BOX = gym.spaces.Box(low=np.array([0.0, -2.0], np.float32), high=np.array([1.0, 2.0], np.float32))

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def dqn(device: str, compile: str = "none", **kw: Any) -> DQNAgent:
    cfg = DQNConfig(**{"hidden": [16, 16], "lr": 1e-2, "target_update_interval": 3, "compile": compile, **kw})
    return DQNAgent(cfg, VECTOR, DISCRETE, device, seed=3)


def dqn_autograd(device: str, compile: str = "none") -> DQNAgent:
    agent = dqn(device, compile)
    agent._explicit = None  # the MLP's loss through autograd, as the CNN's goes
    return agent


def dqn_cnn(device: str, compile: str = "none") -> DQNAgent:
    cfg = DQNConfig(network="nature_cnn", lr=1e-3, target_update_interval=2, compile=compile)
    return DQNAgent(cfg, FRAMES, DISCRETE, device, seed=3)


def iqn(device: str, compile: str = "none") -> IQNAgent:
    cfg = IQNConfig(hidden=[16, 16], head_hidden=[16], embed_dim=8, n_quantiles=6, n_target_quantiles=5,
                    n_act_quantiles=4, lr=1e-2, target_update_interval=3, compile=compile)
    return IQNAgent(cfg, VECTOR, DISCRETE, device, seed=3)


def sac(device: str, compile: str = "none", **kw: Any) -> SACAgent:
    cfg = SACConfig(**{"hidden": [32, 32], "actor_lr": 1e-3, "critic_lr": 1e-3, "alpha_lr": 1e-3,
                       "compile": compile, **kw})
    return SACAgent(cfg, gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32), BOX, device, seed=3)


AGENTS: dict[str, Callable[..., Any]] = {
    "dqn": dqn,  # the written-out MLP loss, a hard target copy every 3 updates (a program of its own)
    "dqn-soft-every-step": lambda device, compile="none": dqn(device, compile, tau=0.5, target_update_interval=1),
    "dqn-autograd": dqn_autograd,
    "dqn-cnn": dqn_cnn,
    "iqn": iqn,  # draws its fractions inside the update
    "sac": sac,  # draws its actions inside the update; Polyak every step, inside the update
    "sac-every-2": lambda device, compile="none": sac(device, compile, target_update_interval=2, loss="huber"),
}


def batch_for(agent: Any, n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if isinstance(agent, SACAgent):
        obs_shape: tuple[int, ...] = (3,)
        action = rng.uniform(BOX.low, BOX.high, size=(n, 2)).astype(np.float32)
    else:
        obs_shape = FRAMES.shape if agent.cfg.network == "nature_cnn" else VECTOR.shape
        action = rng.integers(3, size=n).astype(np.int64)
    obs, next_obs = ((rng.integers(0, 256, size=(n, *obs_shape), dtype=np.uint8) if len(obs_shape) == 3
                      else rng.normal(size=(n, *obs_shape)).astype(np.float32)) for _ in range(2))
    return {"obs": obs, "action": action, "reward": (2.0 * rng.normal(size=n)).astype(np.float32),
            "next_obs": next_obs, "discount": np.where(np.arange(n) % 3 == 0, 0.0, 0.97).astype(np.float32),
            "weights": rng.uniform(0.1, 1.0, size=n).astype(np.float32)}


def rows(name: str) -> int:
    return 4 if name == "dqn-cnn" else 32


def state(agent: Any) -> dict[str, Any]:
    """Every value of the agent's state dict (networks, targets, optimiser state and groups, counters,
    generators), flattened, tensors on the host."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            out[prefix] = value.detach().cpu().numpy().copy()
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}/{k}", v)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(f"{prefix}/{i}", v)
        else:
            out[prefix] = value

    walk("", agent.state_dict())
    return out


def assert_same_state(a: Any, b: Any, rtol: float = 0.0, atol: float = 0.0) -> None:
    sa, sb = state(a), state(b)
    assert sa.keys() == sb.keys()
    for key, value in sa.items():
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            np.testing.assert_allclose(sb[key], value, rtol=rtol, atol=atol, err_msg=key)
        elif isinstance(value, np.ndarray):
            np.testing.assert_array_equal(sb[key], value, err_msg=key)
        else:
            assert sb[key] == value, key


def assert_same_results(want: tuple[dict[str, float], np.ndarray], got: tuple[dict[str, float], np.ndarray],
                        rtol: float = 0.0, atol: float = 0.0) -> None:
    (wm, wp), (gm, gp) = want, got
    assert gm.keys() == wm.keys()
    for key in wm:
        assert gm[key] == pytest.approx(wm[key], rel=rtol, abs=atol), key
    np.testing.assert_allclose(gp, wp, rtol=rtol, atol=atol)


# --- the static path equals the eager one ----------------------------------------------------------


@pytest.mark.parametrize("name", list(AGENTS))
def test_static_updates_equal_eager_ones_bit_for_bit(name: str) -> None:
    """Six consecutive updates (target updates among them): the same metrics and priorities, and in the
    end the same networks, targets, Adam moments, step counts, learning rates and generators."""
    eager, static = AGENTS[name]("cpu"), AGENTS[name]("cpu")
    static.set_update_mode("static")
    assert static.update_mode == "static" and eager.update_mode == "eager"
    for seed in range(6):
        batch = batch_for(eager, rows(name), seed)
        assert_same_results(eager.update(batch), static.update(batch))
    assert static.opt_steps == eager.opt_steps == 6
    assert_same_state(eager, static)
    assert static.update_program is not None and static.update_program.captures == 1
    assert (static.target_program is None) == (static.cfg.target_update_interval == 1)


def test_results_of_a_step_survive_the_steps_queued_after_it() -> None:
    """The program's output buffer is written again by the next step, yet each step reads its own results,
    however many steps were queued before reading (the learner reads one step late)."""
    eager, static = dqn("cpu"), dqn("cpu")
    static.set_update_mode("static")
    batches = [batch_for(eager, 32, seed) for seed in range(5)]
    want = [eager.update(b) for b in batches]
    pending = [static.update_deferred(b) for b in batches]
    assert static.update_program is not None and static.update_program._out is not None
    last = static.update_program._out.numpy()
    assert not np.array_equal(last[5:], want[0][1]), "the buffer was not reused: the test shows nothing"
    for w, p in zip(want, pending, strict=True):
        assert_same_results(w, p.read())


# --- re-allocated tensors are noticed --------------------------------------------------------------


def _new_memory(agent: DQNAgent) -> None:
    """What ``.to(another device)`` does to every parameter: the same Parameter, its data elsewhere."""
    for p in agent.q.parameters():
        p.data = p.data.clone()


def _assigned(agent: DQNAgent) -> None:
    agent.target.load_state_dict(copy.deepcopy(agent.target.state_dict()), assign=True)


def _grads_dropped(agent: DQNAgent) -> None:
    agent.optimizer.zero_grad(set_to_none=True)


def _reloaded(agent: DQNAgent) -> None:
    agent.load_state_dict(copy.deepcopy(agent.state_dict()))


@pytest.mark.parametrize(("change", "said"), [
    (_reloaded, "an optimizer's state was replaced"),
    (_new_memory, "a tensor's memory moved"),
    (_assigned, "a module holds a new parameter"),
    (_grads_dropped, "a gradient was replaced or set to None"),
])
def test_reallocated_tensors_are_noticed_and_the_program_bound_again(
        change: Callable[[DQNAgent], None], said: str, caplog: pytest.LogCaptureFixture) -> None:
    """Each way a tensor the program holds can be re-allocated is seen before the next step (a warning
    saying which, a second capture), and training goes on as the eager agent's does after the same change."""
    eager, static = dqn_autograd("cpu"), dqn_autograd("cpu")  # autograd: gradients owned by torch, not a flat buffer
    static.set_update_mode("static")
    for seed in range(3):
        static.update(batch_for(static, 32, seed))
        eager.update(batch_for(eager, 32, seed))
    change(static)
    change(eager)
    with caplog.at_level(logging.WARNING, logger="zmqrl"):
        for seed in range(3, 6):
            assert_same_results(eager.update(batch_for(eager, 32, seed)), static.update(batch_for(static, 32, seed)))
    assert static.update_program is not None and static.update_program.captures == 2
    assert any(said in r.getMessage() and "the dqn update" in r.getMessage() for r in caplog.records), caplog.text
    assert_same_state(eager, static)


def test_in_place_changes_keep_the_capture(caplog: pytest.LogCaptureFixture) -> None:
    """``adopt_initial``, the networks' ``load_state_dict`` and ``.to()`` the same device copy into the tensors
    the program holds: no new capture, and the program trains on what they wrote."""
    eager, static = dqn("cpu"), dqn("cpu")
    static.set_update_mode("static")
    for agent in (eager, static):
        agent.update(batch_for(agent, 32, 0))
    fresh = dqn("cpu", hidden=[16, 16]).params()
    fresh = {k: v + 0.01 for k, v in fresh.items()}
    with caplog.at_level(logging.WARNING, logger="zmqrl"):
        for agent in (eager, static):
            agent.adopt_initial(fresh)
            agent.q.to("cpu")
            agent.target.load_state_dict(agent.q.state_dict())
        for seed in range(1, 4):
            assert_same_results(eager.update(batch_for(eager, 32, seed)), static.update(batch_for(static, 32, seed)))
    assert static.update_program is not None and static.update_program.captures == 1
    assert not caplog.records, caplog.text
    assert_same_state(eager, static)


def test_a_new_batch_shape_binds_new_buffers(caplog: pytest.LogCaptureFixture) -> None:
    eager, static = sac("cpu"), sac("cpu")
    static.set_update_mode("static")
    with caplog.at_level(logging.WARNING, logger="zmqrl"):
        for seed, n in enumerate((32, 32, 16, 16)):
            assert_same_results(eager.update(batch_for(eager, n, seed)), static.update(batch_for(static, n, seed)))
    assert static.update_program is not None and static.update_program.captures == 2
    assert "its batch changed" in caplog.text


# --- checkpoints -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dqn", "iqn", "sac"])
def test_checkpoints_move_between_eager_and_static_agents(name: str) -> None:
    """A static agent's state dict is an eager one's, format included (learning rates as numbers, not
    capturable), and loads into either kind; both then train on identically."""
    eager, static = AGENTS[name]("cpu"), AGENTS[name]("cpu")
    static.set_update_mode("static")
    for seed in range(3):
        eager.update(batch_for(eager, 32, seed))
        static.update(batch_for(static, 32, seed))
    saved = static.state_dict()
    for key, value in saved.items():
        if "optimizer" in key and value is not None:
            assert all(type(g["lr"]) is float and g["capturable"] is False for g in value["param_groups"]), key
    assert_same_state(eager, static)

    into_eager, into_static = AGENTS[name]("cpu"), AGENTS[name]("cpu")
    into_static.set_update_mode("static")
    into_eager.load_state_dict(copy.deepcopy(static.state_dict()))
    into_static.load_state_dict(copy.deepcopy(eager.state_dict()))
    assert_same_state(eager, into_eager)
    assert_same_state(eager, into_static)
    for seed in range(3, 5):
        want = eager.update(batch_for(eager, 32, seed))
        for agent in (static, into_eager, into_static):
            assert_same_results(want, agent.update(batch_for(agent, 32, seed)))
    for agent in (static, into_eager, into_static):
        assert_same_state(eager, agent)


# --- the setting, and no silent fallbacks ----------------------------------------------------------


def test_compile_setting_resolves_by_device_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    assert resolve_compile("auto", torch.device("cpu"))[0] == "eager"
    assert resolve_compile("none", torch.device("cuda"))[0] == "eager"
    assert resolve_compile("auto", torch.device("cuda"))[0] == "graph"
    assert resolve_compile("graph", torch.device("cuda"))[0] == "graph"
    with pytest.raises(ConfigError, match="agent.compile"):
        resolve_compile("graph", torch.device("cpu"))
    with caplog.at_level(logging.INFO, logger="zmqrl"):
        agent = dqn("cpu", compile="auto")
    assert agent.update_mode == "eager" and agent.update_program is None
    said = agent.describe_update()
    assert "eager" in said and "agent.compile=auto" in said and "CUDA" in said
    assert said in caplog.text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no CUDA")
def test_graph_on_a_cpu_only_host_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="agent.compile"):
        dqn("cpu", compile="graph")
    with pytest.raises(ConfigError, match="agent.compile"):
        config_mod.from_dict({"agent": {"compile": "graph"}, "run": {"device": "cpu"}})
    with pytest.raises(ConfigError, match="agent.compile must be one of auto, none, graph"):
        config_mod.from_dict({"agent": {"algo": "sac", "compile": "jit"}})
    for algo in ("dqn", "iqn", "sac"):
        assert config_mod.from_dict({"agent": {"algo": algo}}).agent.compile == "auto"


def test_a_capturable_adam_never_reads_the_skip_flag_on_the_host() -> None:
    """A step hook sends Adam to torch's stock step, which would read the skip flag on the host (a sync a
    graph cannot hold): the static update refuses, naming the reason, instead of quietly syncing."""
    agent = dqn("cpu")
    agent.set_update_mode("static")
    agent.optimizer.register_step_pre_hook(lambda *_: None)
    with pytest.raises(RuntimeError, match="fused kernel only"):
        agent.update(batch_for(agent, 32, 0))


def test_a_failed_capture_raises_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever makes a capture fail is raised as a CaptureError that names agent.compile, never an update
    that quietly runs eagerly."""
    class Graph:
        def register_generator_state(self, generator: torch.Generator) -> None:
            pass

    def refuse(*_args: Any, **_kw: Any) -> Any:
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", refuse)
    agent = dqn("cpu")
    program = StaticProgram(agent.update_step, "graph", torch.device("cpu"), agent.graph_bindings, "the dqn update")
    program._warm = WARMUP
    with pytest.raises(CaptureError, match=r"agent.compile: capturing the dqn update .*not permitted"):
        program()


# --- CUDA: captured graphs -------------------------------------------------------------------------

CUDA_ROWS = {"dqn-cnn": 32}


@needs_cuda
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(AGENTS))
def test_cuda_graph_updates_equal_eager_ones(name: str) -> None:
    """``agent.compile=auto`` on CUDA captures the update after its warm-up and replays it: eight updates
    queued before any result is read give what the eager agent gives, within float tolerance, and so do
    the networks, targets and Adam's state in the end. The graph was captured once."""
    eager, graph = AGENTS[name]("cuda", "none"), AGENTS[name]("cuda", "auto")
    assert graph.update_mode == "graph" and eager.update_mode == "eager"
    n = CUDA_ROWS.get(name, 256)
    batches = [batch_for(eager, n, seed) for seed in range(WARMUP + 6)]
    want = [eager.update(b) for b in batches]
    pending = [graph.update_deferred(b) for b in batches]
    for w, p in zip(want, pending, strict=True):
        assert_same_results(w, p.read(), rtol=1e-4, atol=1e-5)
    assert graph.update_program is not None and graph.update_program.captures == 1
    assert graph.update_program._graph is not None
    assert_same_state(eager, graph, rtol=1e-4, atol=1e-5)


@needs_cuda
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["dqn-autograd", "sac"])
def test_cuda_graph_is_captured_again_after_a_load_and_trains_on(name: str) -> None:
    """A checkpoint loaded into a graph agent mid-run (Adam's moments become new tensors) is noticed and
    the update captured again; an eager agent loaded with the graph agent's checkpoint, and a graph agent
    loaded with an eager one's, continue as the eager original does."""
    eager, graph = AGENTS[name]("cuda", "none"), AGENTS[name]("cuda", "graph")
    for seed in range(WARMUP + 2):
        eager.update(batch_for(eager, 256, seed))
        graph.update(batch_for(graph, 256, seed))
    graph.load_state_dict(copy.deepcopy(eager.state_dict()))
    into_eager = AGENTS[name]("cuda", "none")
    into_eager.load_state_dict(copy.deepcopy(graph.state_dict()))
    for seed in range(WARMUP + 2, 2 * WARMUP + 5):
        want = eager.update(batch_for(eager, 256, seed))
        for agent in (graph, into_eager):
            assert_same_results(want, agent.update(batch_for(agent, 256, seed)), rtol=1e-4, atol=1e-5)
    assert graph.update_program is not None and graph.update_program.captures == 2
    assert_same_state(eager, graph, rtol=1e-4, atol=1e-5)
    assert_same_state(eager, into_eager, rtol=1e-4, atol=1e-5)


@needs_cuda
@pytest.mark.timeout(60)
def test_cuda_a_host_sync_inside_the_update_fails_the_capture_loudly() -> None:
    agent = dqn("cuda", "graph")
    step = agent.update_step

    def syncing(t: dict[str, torch.Tensor]) -> torch.Tensor:
        values = step(t)
        if values[0].item() > 1e30:  # a host sync: not allowed while capturing
            values = values * 1
        return values

    agent.update_step = syncing  # type: ignore[method-assign]
    agent.set_update_mode("graph", "a test")
    for seed in range(WARMUP):
        agent.update(batch_for(agent, 64, seed))
    with pytest.raises(CaptureError, match="agent.compile"):
        agent.update(batch_for(agent, 64, WARMUP))
