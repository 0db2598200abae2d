"""Updates whose results are read later (``update_deferred``, :class:`PendingStep`): the same step as
``update``, read when asked, on the CPU and (where there is one) on CUDA."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from zmqrl.agents.dqn.agent import DQNAgent
from zmqrl.agents.dqn.config import DQNConfig
from zmqrl.agents.iqn.agent import IQNAgent
from zmqrl.agents.iqn.config import IQNConfig
from zmqrl.agents.sac.agent import SACAgent
from zmqrl.agents.sac.config import SACConfig
from zmqrl.agents.torch_util import PendingStep
from zmqrl.core import DefersUpdates
from zmqrl.roles.learner import deferred_update

DISCRETE_OBS = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
CONTINUOUS_OBS = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
DISCRETE_ACT = gym.spaces.Discrete(3)
CONTINUOUS_ACT = gym.spaces.Box(low=np.array([0.0, -2.0], np.float32), high=np.array([1.0, 2.0], np.float32))


def dqn(device: str, seed: int, autograd: bool = False) -> DQNAgent:
    agent = DQNAgent(DQNConfig(hidden=[16, 16], lr=1e-2, target_update_interval=3), DISCRETE_OBS, DISCRETE_ACT,
                     device, seed=seed)
    if autograd:
        agent._explicit = None  # the network's loss through autograd (the CNN's path)
    return agent


def iqn(device: str, seed: int) -> IQNAgent:
    cfg = IQNConfig(hidden=[16, 16], head_hidden=[16], embed_dim=8, n_quantiles=6, n_target_quantiles=5,
                    n_act_quantiles=4, lr=1e-2, target_update_interval=3)
    return IQNAgent(cfg, DISCRETE_OBS, DISCRETE_ACT, device, seed=seed)


def sac(device: str, seed: int) -> SACAgent:
    cfg = SACConfig(hidden=[32, 32], actor_lr=1e-3, critic_lr=1e-3, alpha_lr=1e-3)
    return SACAgent(cfg, CONTINUOUS_OBS, CONTINUOUS_ACT, device, seed=seed)


def batch_for(agent: Any, n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    continuous = isinstance(agent, SACAgent)
    dim = 3 if continuous else 4
    action = (rng.uniform(CONTINUOUS_ACT.low, CONTINUOUS_ACT.high, size=(n, 2)).astype(np.float32) if continuous
              else rng.integers(3, size=n).astype(np.int64))
    return {"obs": rng.normal(size=(n, dim)).astype(np.float32), "action": action,
            "reward": (2.0 * rng.normal(size=n)).astype(np.float32),
            "next_obs": rng.normal(size=(n, dim)).astype(np.float32),
            "discount": np.where(np.arange(n) % 3 == 0, 0.0, 0.97).astype(np.float32),
            "weights": rng.uniform(0.1, 1.0, size=n).astype(np.float32)}


AGENTS: dict[str, Callable[[str, int], Any]] = {
    "dqn": dqn, "dqn-autograd": lambda device, seed: dqn(device, seed, autograd=True), "iqn": iqn, "sac": sac}


def state(agent: Any) -> dict[str, np.ndarray]:
    """Every tensor an update moves (networks, targets, optimiser moments), flattened, on the host."""
    out: dict[str, np.ndarray] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            out[prefix] = value.detach().cpu().numpy().copy()
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}/{k}", v)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(f"{prefix}/{i}", v)

    walk("", agent.state_dict())
    return out


def assert_same_state(a: Any, b: Any) -> None:
    sa, sb = state(a), state(b)
    assert sa.keys() == sb.keys()
    for key in sa:
        np.testing.assert_array_equal(sa[key], sb[key], err_msg=key)


@pytest.mark.parametrize("name", list(AGENTS))
def test_update_is_update_deferred_read_at_once_even_with_steps_queued_behind(name: str) -> None:
    """``update(batch) == update_deferred(batch).result()``, bit for bit, for every step of a run, also
    when later steps were queued before an earlier one's results are read (the learner's order); the
    agents end in the same state."""
    plain, deferred = AGENTS[name]("cpu", 5), AGENTS[name]("cpu", 5)
    assert isinstance(deferred, DefersUpdates)
    batches = [batch_for(plain, 32, seed) for seed in range(7)]
    want = [plain.update(b) for b in batches]
    pending = [deferred.update_deferred(b) for b in batches[:3]]  # three steps before any result is read
    got = [p.result() for p in pending]
    for b in batches[3:]:
        step = deferred.update_deferred(b)
        got.append(step.result())
        assert step.result() is got[-1]  # read once, the same results on every call
    for (wm, wp), (gm, gp) in zip(want, got, strict=True):
        assert gm == wm
        assert gp is not None and gp.dtype == np.float32 and gp.shape == (32,)
        np.testing.assert_array_equal(gp, wp)
    assert deferred.opt_steps == plain.opt_steps == len(batches)
    assert_same_state(plain, deferred)


def test_a_pending_step_reads_its_own_results_not_a_later_steps() -> None:
    """Results are the step's own: a step queued after it (other batch, other priorities) leaves them be."""
    agent = dqn("cpu", 1)
    first = agent.update_deferred(batch_for(agent, 16, 0))
    second = agent.update_deferred(batch_for(agent, 16, 1))
    reference = dqn("cpu", 1)
    _, want_first = reference.update(batch_for(reference, 16, 0))
    _, want_second = reference.update(batch_for(reference, 16, 1))
    np.testing.assert_array_equal(second.read()[1], want_second)
    np.testing.assert_array_equal(first.read()[1], want_first)
    assert not np.array_equal(want_first, want_second)


def test_resolved_steps_and_agents_with_a_blocking_update_only() -> None:
    metrics, priorities = {"loss": 1.5}, np.arange(4, dtype=np.float32)
    step = PendingStep.resolved(metrics, priorities)
    assert step.done() and step.result() == (metrics, priorities) and step.read()[1] is priorities
    with pytest.raises(ValueError, match="no priorities"):
        PendingStep.resolved({"loss": 1.0}, None).read()

    class BlockingOnly:  # an agent of the Agent protocol without update_deferred
        calls = 0

        def update(self, batch: Any) -> tuple[dict[str, float], np.ndarray | None]:
            self.calls += 1
            return {"loss": float(self.calls)}, None

    blocking = BlockingOnly()
    assert not isinstance(blocking, DefersUpdates)
    update = deferred_update(blocking)  # type: ignore[arg-type]
    pending = update({})
    assert blocking.calls == 1 and pending.done() and pending.result() == ({"loss": 1.0}, None)
    agent = dqn("cpu", 0)
    assert deferred_update(agent) == agent.update_deferred


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
@pytest.mark.parametrize("name", list(AGENTS))
def test_update_deferred_on_cuda_gives_what_update_gives(name: str) -> None:
    """On CUDA the results come back in a non-blocking copy to page-locked memory, read after an event;
    several steps in flight at once each read their own, as ``update`` on a twin agent gives them."""
    plain, deferred = AGENTS[name]("cuda", 2), AGENTS[name]("cuda", 2)
    deferred.load_state_dict(plain.state_dict())
    batches = [batch_for(plain, 256, seed) for seed in range(6)]
    want = [plain.update(b) for b in batches]
    pending = [deferred.update_deferred(b) for b in batches]  # all six queued before any is read
    assert all(p._values is not None and p._values.is_pinned() for p in pending)
    got = [p.result() for p in reversed(pending)][::-1]
    for (wm, wp), (gm, gp) in zip(want, got, strict=True):
        assert gp is not None and gp.shape == wp.shape
        np.testing.assert_allclose(gp, wp, rtol=1e-5, atol=1e-6)
        assert gm.keys() == wm.keys()
        for key in wm:
            assert gm[key] == pytest.approx(wm[key], rel=1e-5, abs=1e-6), key
    assert all(p.done() for p in pending)
    torch.cuda.synchronize()
    for (_, first), second in zip(got, (p.result()[1] for p in pending), strict=True):
        assert first is second  # read once: the host buffer was not read again after the event


@pytest.mark.parametrize("mode", ["eager", "static"])
@pytest.mark.parametrize("name", list(AGENTS))
def test_a_batch_of_device_tensors_trains_as_the_same_arrays(name: str, mode: str) -> None:
    """Replay on the device hands over tensors already there (:mod:`zmqrl.replay.device`): staged as they are,
    never through the host, and the updates (eager, or the static buffers a CUDA graph captures) are the arrays'."""
    from zmqrl.agents.staging import BatchStager

    arrays_agent, tensors_agent = AGENTS[name]("cpu", 0), AGENTS[name]("cpu", 0)
    if mode == "static":
        for agent in (arrays_agent, tensors_agent):
            agent.set_update_mode("static", "the test")
    for step in range(4):
        batch = batch_for(arrays_agent, 16, seed=step)
        tensors = {k: torch.from_numpy(v.copy()) for k, v in batch.items()}
        tensors["indices"] = np.arange(16)  # (replay's indices stay on the host, beside the tensors)
        metrics, priorities = arrays_agent.update(batch)
        got_metrics, got_priorities = tensors_agent.update(tensors)
        assert got_metrics == metrics
        np.testing.assert_array_equal(got_priorities, priorities)
    want = state(arrays_agent)
    for key, value in state(tensors_agent).items():
        np.testing.assert_array_equal(value, want[key], err_msg=key)
    staged = BatchStager("cpu")({"obs": tensors["obs"], "reward": batch["reward"]})
    assert staged["obs"] is tensors["obs"] and list(staged) == ["obs", "reward"]  # the tensor as it is, in order
