"""The learner reads each optimisation step's results one step late (it samples batch k+1 while the
device may still run step k): every step's priorities still reach the sum tree exactly once, in order,
for that step's own batch (items that took the place of its batch's since it was sampled keep their
own: ``sampled_at``); models go out and checkpoints are written only once the pending step is
settled; the last one is settled when the learner stops.

A real learner in this process (CartPole DQN, prioritized replay) against a reference loop, with the
same seeds, the plain ``agent.update`` and the same one-step-late order."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

import zmqrl.roles.learner as learner_mod
from batches import batch_frames, cartpole_batch
from rigs import in_process_learner, ingest_until
from zmqrl.agents.torch_util import flush_denormals
from zmqrl.roles.learner import Learner
from zmqrl.run.checkpoint import STATE_FILE
from zmqrl.run.lifecycle import StopFlag
from zmqrl.run.rundir import read_json

pytestmark = pytest.mark.timeout(120)

MAX_OPTS, SAVE_INTERVAL, SYNC_INTERVAL, BATCH = 23, 10, 4, 32
SETTINGS = ("run.seed=7", "run.log_level=warning", "env.reward_scale=1",  # (auto levels warm-up priorities once)
            "trainer.warmup=256", f"trainer.max_opts={MAX_OPTS}",
            f"trainer.save_interval={SAVE_INTERVAL}", "trainer.latest_interval_s=0",
            f"trainer.sync_interval={SYNC_INTERVAL}", "trainer.record_interval=5", "trainer.stop_return=null",
            "trainer.min_samples_per_insert=0", "trainer.checkpoint_replay=false", f"agent.batch_size={BATCH}",
            "net.stats_interval_s=1000", "net.republish_s=1000")


def fed_learner(cfg: Any, run_dir: Path, zctx: zmq.Context, batches: int = 8) -> tuple[Learner, zmq.Socket]:
    """An in-process learner whose replay holds ``batches`` CartPole batches of 64 (the same for a seed)."""
    learner = in_process_learner(cfg, run_dir)
    push = zctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(learner.endpoints["data"])
    for seq in range(batches):
        push.send_multipart(batch_frames("actor-0", seq, cartpole_batch(64, seed=seq, priority=None)))
    ingest_until(learner, lambda: len(learner.replay) == 64 * batches)
    return learner, push


class Spy:
    """What the learner samples, writes back and publishes, in order."""

    def __init__(self, learner: Learner, monkeypatch: pytest.MonkeyPatch) -> None:
        self.samples: list[np.ndarray] = []
        self.sampled_at: list[int] = []  # replay's num_added at each sample
        self.writes: list[tuple[np.ndarray, np.ndarray]] = []
        self.written_at: list[int | None] = []  # the sampled_at each write came with
        self.models: list[dict[str, Any]] = []
        replay = learner.replay
        sample, update_priorities = replay.sample, replay.update_priorities

        def spy_sample(batch_size: int) -> dict[str, np.ndarray]:
            self.sampled_at.append(replay.num_added)
            out = sample(batch_size)
            self.samples.append(out["indices"].copy())
            return out

        def spy_update_priorities(indices: np.ndarray, priorities: np.ndarray, sampled_at: int | None = None) -> None:
            self.writes.append((np.array(indices, copy=True), np.array(priorities, copy=True)))
            self.written_at.append(sampled_at)
            update_priorities(indices, priorities, sampled_at=sampled_at)

        monkeypatch.setattr(replay, "sample", spy_sample)
        monkeypatch.setattr(replay, "update_priorities", spy_update_priorities)
        encode_model = learner_mod.encode_model

        def spy_encode_model(sender: str, inc: str, version: int, params: Any, meta: dict[str, Any]) -> Any:
            agent: Any = learner.agent
            self.models.append({"version": version, "opt_steps": meta["opt_steps"], "agent_steps": agent.opt_steps,
                                "written": len(self.writes), "pending": learner._pending is not None})
            return encode_model(sender, inc, version, params, meta=meta)

        monkeypatch.setattr(learner_mod, "encode_model", spy_encode_model)


def reference_run(learner: Learner) -> list[tuple[np.ndarray, np.ndarray]]:
    """The learner's order with the plain ``update``: sample k+1, write k's priorities, update k+1; the
    pending step written before the sample instead where its count brings a checkpoint or max_opts."""
    agent: Any = learner.agent
    replay = learner.replay
    writes: list[tuple[np.ndarray, np.ndarray]] = []
    pending: tuple[np.ndarray, np.ndarray] | None = None
    before = None

    def write(step: tuple[np.ndarray, np.ndarray]) -> None:
        nonlocal before
        replay.update_priorities(*step)
        writes.append(step)
        if before is None:
            before = flush_denormals()  # as the learner's thread does from its first counted step

    try:
        while len(writes) < MAX_OPTS:
            count = len(writes) + 1
            if pending is not None and (count % SAVE_INTERVAL == 0 or count >= MAX_OPTS):
                write(pending)
                pending = None
                continue
            batch = replay.sample(BATCH)
            if pending is not None:
                write(pending)
            _, priorities = agent.update(batch)
            pending = (batch["indices"].copy(), priorities.copy())
    finally:
        if before is False:
            flush_denormals(False)
    return writes


def test_every_steps_priorities_reach_the_sum_tree_once_in_order_and_the_last_at_the_stop(
        tmp_path: Path, cartpole_cfg: Any, zctx: zmq.Context, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = cartpole_cfg(*SETTINGS)
    learner, push = fed_learner(cfg, tmp_path / "run", zctx)
    reference, ref_push = fed_learner(cfg, tmp_path / "reference", zctx)
    try:
        assert learner.replay.state_dict() == reference.replay.state_dict()
        spy = Spy(learner, monkeypatch)
        learner.run(StopFlag())
        agent: Any = learner.agent

        # one sample, one update and one write per step, each write for its own batch, the last one at the stop
        assert learner.book.opt_steps == agent.opt_steps == MAX_OPTS
        assert len(spy.samples) == len(spy.writes) == MAX_OPTS
        for k, (sampled, (written, priorities)) in enumerate(zip(spy.samples, spy.writes, strict=True)):
            np.testing.assert_array_equal(written, sampled, err_msg=f"step {k + 1}")
            assert priorities.shape == (BATCH,) and np.isfinite(priorities).all()

        # the same priorities, in the same order, and the same final parameters as update() gives
        want = reference_run(reference)
        assert len(want) == MAX_OPTS
        for k, ((indices, priorities), (want_indices, want_priorities)) in enumerate(
                zip(spy.writes, want, strict=True)):
            np.testing.assert_array_equal(indices, want_indices, err_msg=f"step {k + 1}")
            np.testing.assert_array_equal(priorities, want_priorities, err_msg=f"step {k + 1}")
        ref_params = reference.agent.params()
        for name, value in agent.params().items():
            np.testing.assert_array_equal(value, ref_params[name], err_msg=name)

        # every model out carries the params and count of all steps taken, none pending; the end goes out as control
        versions = [m for m in spy.models if m["version"] > 0]
        assert [m["opt_steps"] for m in versions] == list(range(SYNC_INTERVAL, MAX_OPTS + 1, SYNC_INTERVAL))
        for m in spy.models:
            assert not m["pending"] and m["opt_steps"] == m["agent_steps"] == m["written"], m
        assert learner.publisher.state.done == f"reached max_opts={MAX_OPTS}", learner.publisher.state
        assert spy.written_at == spy.sampled_at  # each write says when its batch was drawn

        # a numbered checkpoint's replay has drawn exactly the batches its agent trained on
        for steps in (SAVE_INTERVAL, 2 * SAVE_INTERVAL):
            state = read_json(tmp_path / "run" / "checkpoints" / str(steps) / STATE_FILE)
            assert state is not None and state["opt_steps"] == steps
            assert state["replay"]["sample_calls"] == steps, state["replay"]
        summary = read_json(tmp_path / "run" / "summary.json")
        assert summary is not None and summary["opt_steps"] == MAX_OPTS
    finally:
        push.close()
        ref_push.close()
        reference.close()


def test_a_learner_fed_while_training_inserts_between_steps_and_settles_each_step_once(
        tmp_path: Path, cartpole_cfg: Any, zctx: zmq.Context, monkeypatch: pytest.MonkeyPatch) -> None:
    # the rate limiter's pauses come and go (1 sample per insert), each told to actors in a model at once
    cfg = cartpole_cfg(*SETTINGS, "trainer.max_opts=1000000", "trainer.save_interval=0",
                       "trainer.min_samples_per_insert=1")
    learner, push = fed_learner(cfg, tmp_path / "run", zctx)
    spy = Spy(learner, monkeypatch)
    stop = StopFlag()
    runner = threading.Thread(target=learner.run, args=(stop,), daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 60
        seq = 8
        while learner.book.opt_steps < 40 or seq < 14:  # more data while it trains
            assert time.monotonic() < deadline and runner.is_alive()
            if seq < 14:
                push.send_multipart(batch_frames("actor-0", seq, cartpole_batch(64, seed=seq, priority=None)))
                seq += 1
            time.sleep(0.02)
    finally:
        stop.set = True
        runner.join(60)
        push.close()
    assert not runner.is_alive()
    agent: Any = learner.agent
    assert len(learner.replay) == 64 * 14
    assert learner.book.opt_steps == agent.opt_steps == len(spy.samples) == len(spy.writes) >= 40
    for sampled, (written, _) in zip(spy.samples, spy.writes, strict=True):
        np.testing.assert_array_equal(written, sampled)
    assert spy.written_at == spy.sampled_at  # inserts may land with a step pending: its write knows when it drew
    assert learner._pending is None and learner.limiter.pauses >= 1
    assert len(spy.models) >= 3
    for m in spy.models:  # every model out carries the params and count of all steps taken, none pending
        assert not m["pending"] and m["opt_steps"] == m["agent_steps"] == m["written"], m
    latest = read_json(tmp_path / "run" / "checkpoints" / "latest" / STATE_FILE)
    assert latest is not None and latest["opt_steps"] == learner.book.opt_steps
    assert latest["replay"]["sample_calls"] == learner.book.opt_steps


def test_a_learner_with_replay_on_a_torch_device_trains_as_with_host_replay(
        tmp_path: Path, cartpole_cfg: Any, zctx: zmq.Context, monkeypatch: pytest.MonkeyPatch) -> None:
    """The torch replay on the CPU (what ``replay.device: cuda`` runs on a GPU) against the numpy replay: the same
    batches, priorities and parameters, and the same replay file in the checkpoint (written from its snapshot)."""
    import zmqrl.run.startup as startup
    from zmqrl.replay.device import PrioritizedDeviceReplay
    from zmqrl.replay.files import read_npz
    from zmqrl.run.checkpoint import REPLAY_FILE

    cfg = cartpole_cfg(*SETTINGS, "trainer.checkpoint_replay=true")
    host, host_push = fed_learner(cfg, tmp_path / "host", zctx)
    monkeypatch.setattr(startup, "replay_device", lambda cfg: "cpu")
    device, device_push = fed_learner(cfg, tmp_path / "device", zctx)
    try:
        assert isinstance(device.replay, PrioritizedDeviceReplay) and type(host.replay).__name__ == "PrioritizedReplay"
        for learner in (host, device):
            learner.run(StopFlag())
        assert device.book.opt_steps == host.book.opt_steps == MAX_OPTS
        want = host.agent.params()
        for name, value in device.agent.params().items():
            np.testing.assert_array_equal(value, want[name], err_msg=name)
        assert device.replay.state_dict() == host.replay.state_dict()
        np.testing.assert_array_equal(device.replay.tree.leaves, host.replay.tree.leaves)
        files = [read_npz(str(tmp_path / run / "checkpoints" / "latest" / REPLAY_FILE)) for run in ("host", "device")]
        assert sorted(files[0]) == sorted(files[1])
        for name, array in files[0].items():
            np.testing.assert_array_equal(files[1][name], array, err_msg=name)
        summaries = [read_json(tmp_path / run / "summary.json") or {} for run in ("host", "device")]
        assert [s.get("replay_device") for s in summaries] == ["host", "cpu"]
    finally:
        host_push.close()
        device_push.close()
