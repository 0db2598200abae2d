"""The MLP Q-network's written-out loss and gradients against autograd, and the lean Adam step."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from zmqrl.agents.dqn.agent import DQNAgent
from zmqrl.agents.dqn.config import DQNConfig
from zmqrl.agents.torch_util import Adam

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, shape=(2, 3), dtype=np.float32)  # flattened by the network
ACT_SPACE = gym.spaces.Discrete(3)


def make_batch(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal(size=(n, 2, 3)).astype(np.float32),
        "action": rng.integers(3, size=n).astype(np.int64),
        "reward": rng.normal(scale=3.0, size=n).astype(np.float32),  # TD errors on both sides of Huber's kink
        "next_obs": rng.normal(size=(n, 2, 3)).astype(np.float32),
        "discount": np.where(np.arange(n) % 4 == 0, 0.0, 0.97).astype(np.float32),
        "weights": rng.uniform(0.1, 1.0, size=n).astype(np.float32),
    }


def agents(**kw: object) -> tuple[DQNAgent, DQNAgent]:
    """Two identical agents; the target differs from the online network so double and plain differ."""
    base: dict[str, object] = {"hidden": [16, 16], "lr": 1e-2, "target_update_interval": 7, "max_grad_norm": 0.2}
    base.update(kw)
    agent = DQNAgent(DQNConfig(**base), OBS_SPACE, ACT_SPACE, seed=3)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in agent.target.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return agent, copy.deepcopy(agent)


VARIANTS = [
    {},
    {"dueling": False},
    {"double": False},
    {"loss": "mse"},
    {"hidden": [8]},
    {"hidden": [8, 12, 6], "dueling": False, "double": False},
    {"max_grad_norm": 0.0},
    {"tau": 0.5},
]


@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "shipped")
def test_explicit_update_matches_autograd(kw: dict[str, object]) -> None:
    explicit, reference = agents(**kw)
    assert explicit._explicit is not None, "the MLP network did not take the explicit update"
    clipped = 0
    for step in range(40):
        batch = make_batch(32, seed=step)
        got, got_prio = explicit.update(batch)
        want, want_prio = reference.update_autograd(batch)
        np.testing.assert_allclose(got_prio, want_prio, rtol=1e-4, atol=1e-5)
        for key in DQNAgent.METRICS:
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), (step, key)
        for a, b in zip(explicit.q.parameters(), reference.q.parameters(), strict=True):
            assert a.grad is not None and b.grad is not None
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6)
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        clipped += float(kw.get("max_grad_norm", 0.2)) > 0 and want["grad_norm"] > 0.2
    for a, b in zip(explicit.target.parameters(), reference.target.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    if kw.get("max_grad_norm", 0.2):
        assert clipped > 0, "no step was clipped: the clipping went untested"


def test_the_explicit_update_trains_checkpoints_and_the_cnn_keeps_autograd() -> None:
    """Loss falls on a fixed batch of terminal transitions (a regression onto the rewards); a
    state_dict round trip continues identically; the CNN has no explicit update."""
    agent, _ = agents(max_grad_norm=10.0)
    batch = make_batch(64, seed=0)
    batch["discount"][:] = 0.0
    first = agent.update(batch)[0]["loss"]
    for _ in range(100):
        last = agent.update(batch)[0]["loss"]
    assert last < 0.2 * first, (first, last)
    resumed, _ = agents(max_grad_norm=10.0)
    resumed.load_state_dict(copy.deepcopy(agent.state_dict()))
    agent.update(batch)
    resumed.update(batch)
    assert all(torch.equal(a, b) for a, b in zip(agent.q.parameters(), resumed.q.parameters(), strict=True))
    frames = gym.spaces.Box(0, 255, shape=(4, 84, 84), dtype=np.uint8)
    cnn = DQNAgent(DQNConfig(network="nature_cnn"), frames, ACT_SPACE)
    assert cnn._explicit is None


def test_the_lean_adam_step_is_the_stock_fused_step_bit_for_bit() -> None:
    """After the first step (which creates the state) our ``step`` calls the fused kernel directly;
    parameters and state match ``torch.optim.Adam(fused=True)`` exactly, and a registered hook
    sends it back to the stock path, which runs the hook."""
    def run(make: type | object, steps: int = 15) -> tuple[list[torch.Tensor], dict, torch.optim.Optimizer]:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(5, 9), torch.nn.ReLU(), torch.nn.Linear(9, 2))
        opt = make(net.parameters(), lr=3e-3, eps=1e-6, weight_decay=0.01)  # type: ignore[operator]
        x = torch.randn(16, 5)
        for _ in range(steps):
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            opt.step()
        return [p.detach().clone() for p in net.parameters()], opt.state_dict(), opt

    ours, state, opt = run(Adam)
    stock, stock_state, _ = run(lambda params, **kw: torch.optim.Adam(params, fused=True, **kw))
    assert all(torch.equal(a, b) for a, b in zip(ours, stock, strict=True))
    for k, s in stock_state["state"].items():
        assert all(torch.equal(state["state"][k][name], s[name]) for name in ("step", "exp_avg", "exp_avg_sq"))
    assert state["state"][0]["step"].item() == 15
    assert isinstance(opt, Adam) and opt._fused_step(), "the lean path was not taken"

    assert not hasattr(type(opt).step, "__wrapped__"), "torch wrapped the step in its profiler range again"

    calls: list[str] = []
    pre = opt.register_step_pre_hook(lambda *_: calls.append("pre"))
    post = opt.register_step_post_hook(lambda *_: calls.append("post"))
    assert not opt._fused_step()
    opt.step()
    pre.remove()
    post.remove()
    assert calls == ["pre", "post"]
    assert opt.state_dict()["state"][0]["step"].item() == 17  # 15, the lean call above, this one


@pytest.mark.slow
def test_flush_denormals_flushes_in_the_calling_thread_and_restores() -> None:
    """Flushed while asked, restored to what it was; hypothesis and numpy see the thread's state, so
    training in a caller's thread must not leave it changed."""
    code = ("import torch\nfrom zmqrl.agents.torch_util import flush_denormals\n"
            "x = torch.tensor([1e-39])\nkept = (x * 1.0).item() > 0\nbefore = flush_denormals()\n"
            "flushed = (x * 1.0).item() == 0.0\nagain = flush_denormals()\nflush_denormals(before)\n"
            "print(kept, before, flushed, again, (x * 1.0).item() > 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False", "True", "True", "True"]


def test_zmqrl_train_leaves_the_callers_thread_as_it_found_it(tmp_path: Path) -> None:
    """``train`` flushes denormals while it trains and not after (the failure this guards against:
    hypothesis refusing to run in a test process that had called it)."""
    from zmqrl import config as config_mod
    from zmqrl.agents import torch_util
    from zmqrl.run.train import train

    seen: list[bool] = []
    real = torch_util.flush_denormals

    def spy(on: bool = True) -> bool:
        seen.append(on)
        return real(on)

    cfg = config_mod.load(Path(__file__).parents[2] / "configs" / "cartpole_dqn.yaml",
                          ["trainer.max_opts=20", "trainer.warmup=64", "trainer.eval_interval=1000"])
    import zmqrl.run.train as train_mod

    train_mod.flush_denormals = spy  # type: ignore[assignment]
    try:
        summary = train(cfg, tmp_path / "run")
    finally:
        train_mod.flush_denormals = real  # type: ignore[assignment]
    assert summary["opt_steps"] == 20
    assert seen == [True, False]
    assert (torch.tensor([1e-39]) * 1.0).item() > 0, "denormals still flushed after train returned"


def test_the_flat_gradients_follow_a_network_moved_in_place() -> None:
    """``module.to`` swaps every parameter's and gradient's storage in place; the explicit update must
    notice and write, norm and clip the gradients the optimiser reads, not a stale buffer."""
    explicit, reference = agents()
    for step in range(3):
        explicit.update(make_batch(32, seed=step))
        reference.update_autograd(make_batch(32, seed=step))
    explicit.q.to(torch.float64).to(torch.float32)
    got, _ = explicit.update(make_batch(32, seed=9))
    want, _ = reference.update_autograd(make_batch(32, seed=9))
    assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
    for a, b in zip(explicit.q.parameters(), reference.q.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
