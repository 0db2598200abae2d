"""The learner's fast start and its ingest path, in-process with real sockets on 127.0.0.1.

- Startup: model version 0 goes out and batches go into replay before the agent (torch) is built;
  ``RUN_DIR/first_batch.json`` appears right after the first insert; the agent then adopts the
  very parameters actors were given.
- Ingest: batches that arrived together go into replay in one ``add``, and a batch that does not
  fit is rejected on its own.
- No role but the learner's agent builder imports torch, and the learner's replay is the one
  ``zmqrl train`` builds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from batches import batch_frames, cartpole_batch
from zmqrl.config import Config
from zmqrl.roles.addresses import free_port
from zmqrl.roles.learner import FIRST_BATCH_FILE, Learner
from zmqrl.run.acting import make_task
from zmqrl.run.lifecycle import StopFlag
from zmqrl.run.rundir import read_json
from zmqrl.wire import CONTROL, CONTROL_TOPIC, MODEL, MODEL_TOPIC, Limits, decode

pytestmark = pytest.mark.timeout(120)


def tcp() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def make_learner(cfg: Config, run_dir: Path) -> Learner:
    return Learner(cfg, run_dir, tcp(), tcp(), tcp())


def hold_the_agent_build(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """The learner's agent (torch) takes as long as the test says: until the event returned is set."""
    release = threading.Event()
    build = Learner._build_agent

    def held_build(self: Learner) -> Any:
        assert release.wait(60), "the test never released the agent build"
        return build(self)

    monkeypatch.setattr(Learner, "_build_agent", held_build)
    return release


def subscriber(zctx: zmq.Context, learner: Learner, topic: bytes) -> zmq.Socket:
    """A SUB on one topic of the learner's stream (every message kept, in order)."""
    sub = zctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.connect(learner.endpoints["model"])
    return sub


def models_and_data(zctx: zmq.Context, learner: Learner) -> tuple[zmq.Socket, zmq.Socket]:
    """A SUB on the learner's models and a PUSH to its data socket, as an actor has."""
    sub = subscriber(zctx, learner, MODEL_TOPIC)
    push = zctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(learner.endpoints["data"])
    return sub, push


def test_first_batch_lands_in_replay_before_the_agent_is_built(tmp_path: Path, cartpole_cfg: Any,
                                                                zctx: zmq.Context,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = cartpole_cfg("run.seed=3", "trainer.warmup=64", "trainer.stop_return=null", "trainer.max_opts=20",
                       "agent.target_update_interval=500",
                       "run.log_level=warning")
    release = hold_the_agent_build(monkeypatch)
    learner = make_learner(cfg, tmp_path / "run")
    sub, push = models_and_data(zctx, learner)
    stop = StopFlag()
    from zmqrl.agents import torch_util

    flushes: list[bool] = []
    real_flush = torch_util.flush_denormals
    monkeypatch.setattr(torch_util, "flush_denormals", lambda on=True: flushes.append(on) or real_flush(on))
    normal_after: list[bool] = []

    def run_then_probe() -> None:  # the training thread flushes denormals only while it trains
        learner.run(stop)
        import torch

        normal_after.append((torch.tensor([1e-39]) * 1.0).item() > 0)

    runner = threading.Thread(target=run_then_probe, daemon=True)
    runner.start()
    try:
        # (a bound well inside the build's 60 s hold: alone this takes ~1 s, but under a loaded suite the
        # learner's threads can take over 10 s to start publishing)
        assert sub.poll(45_000), "no model version 0 while the agent was still being built"
        model = decode(sub.recv_multipart(), Limits.only([MODEL]))
        expected = make_task(cfg).initial_params()
        assert model.version == 0 and expected is not None and set(model.arrays) == set(expected)
        for name, value in expected.items():
            np.testing.assert_array_equal(model.arrays[name], value)

        marker = tmp_path / "run" / FIRST_BATCH_FILE
        assert not marker.exists(), "first_batch.json before any batch"
        push.send_multipart(batch_frames("actor-0", 0, cartpole_batch(64, 0)))
        wait_for(marker.exists, 10, "first_batch.json")
        first = read_json(marker)
        assert first is not None and first["transitions"] == 64 and first["replay_size"] == 64, first
        assert first["agent_ready"] is False and first["sender"] == "actor-0" and first["first_batch_s"] > 0
        assert learner._agent is None and len(learner.replay) == 64

        release.set()
        runner.join(60)  # trains its 20 steps and stops
        assert not runner.is_alive() and learner.book.opt_steps == 20
        assert flushes == [True, False] and normal_after == [True], (flushes, normal_after)
        agent: Any = learner._agent
        target = {k: v.detach().numpy() for k, v in agent.target.state_dict().items()}
        for name, value in expected.items():  # the agent started from the very model actors were given
            np.testing.assert_array_equal(target[name], value)  # (target_update_interval 500: no copy yet)
    finally:
        release.set()
        stop.set = True
        runner.join(30)
    assert not runner.is_alive()
    summary = read_json(tmp_path / "run" / "summary.json")
    assert summary is not None and summary["first_batch_s"] == first["first_batch_s"]
    assert (tmp_path / "run" / "checkpoints" / "latest").is_dir()


def test_control_carries_the_start_up_quota_while_torch_loads_and_an_allowance_once_it_trains(
        tmp_path: Path, cartpole_cfg: Any, zctx: zmq.Context, monkeypatch: pytest.MonkeyPatch) -> None:
    """What bounds each actor: ``quota`` (absolute: trainer.warmup) before the agent is built,
    ``allow`` (per grant: twice a sync's worth of data at min_samples_per_insert, a new grant with each
    model version) once it trains; all of it in control messages, none in models."""
    cfg = cartpole_cfg("run.seed=3", "trainer.warmup=64", "trainer.stop_return=null", "trainer.max_opts=60",
                       "trainer.sync_interval=10", "trainer.min_samples_per_insert=8", "run.log_level=warning")
    release = hold_the_agent_build(monkeypatch)
    learner = make_learner(cfg, tmp_path / "run")
    models, push = models_and_data(zctx, learner)
    control = subscriber(zctx, learner, CONTROL_TOPIC)
    stop = StopFlag()
    runner = threading.Thread(target=learner.run, args=(stop,), daemon=True)
    runner.start()
    try:
        assert control.poll(45_000), "no control while the agent was still being built"  # (as above)
        loading = decode(control.recv_multipart(), Limits.only([CONTROL]))
        assert loading.meta.get("quota") == 64 and "allow" not in loading.meta, loading.meta
        push.send_multipart(batch_frames("actor-0", 0, cartpole_batch(64, 0)))
        wait_for(lambda: len(learner.replay) == 64, 10, "the batch in replay")
        release.set()
        trained, versions, deadline = [], [], time.monotonic() + 60
        while runner.is_alive() or control.poll(0) or models.poll(0):
            assert time.monotonic() < deadline, f"the learner did not finish its 60 updates: {learner.book.opt_steps}"
            if control.poll(50):
                msg = decode(control.recv_multipart(), Limits.only([CONTROL]))
                if "allow" in msg.meta:
                    trained.append(msg.meta)
            if models.poll(0):
                model = decode(models.recv_multipart(), Limits.only([MODEL]))
                assert not {"pause", "allow", "grant", "quota", "done"} & set(model.meta), model.meta
                versions.append(model.version)
        assert trained, "no allowance after updates"
        assert all(m["allow"] == 2 * 10 * 64 // 8 and "quota" not in m for m in trained), trained
        grants = [m["grant"] for m in trained]
        assert grants == sorted(set(grants)) and len(grants) >= 60 // 10, grants  # a new grant with each version
        assert versions and max(versions) == 60 // 10, versions
    finally:
        release.set()
        stop.set = True
        runner.join(30)
    assert not runner.is_alive() and learner.book.opt_steps == 60


def test_batches_that_arrive_together_share_one_add_and_a_bad_one_is_refused_alone(
        tmp_path: Path, cartpole_cfg: Any, zctx: zmq.Context, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = cartpole_cfg("run.log_level=warning")
    learner = make_learner(cfg, tmp_path / "run")
    learner.agent_ready(block=True)
    adds: list[int] = []
    real_add = learner.replay.add

    def counting_add(batch: Any, priorities: Any = None, max_new_frames: Any = None) -> Any:
        adds.append(len(batch["reward"]))
        return real_add(batch, priorities=priorities, max_new_frames=max_new_frames)

    monkeypatch.setattr(learner.replay, "add", counting_add)
    push = zctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(learner.endpoints["data"])
    good = [cartpole_batch(64, i) for i in range(4)]
    nan = cartpole_batch(64, 9)
    nan["priority"][5] = np.nan  # same fields as the good ones: the value check refuses it, the others go on
    wide = {**cartpole_batch(64, 10), "obs": np.zeros((64, 5), np.float32),
            "next_obs": np.zeros((64, 5), np.float32)}  # does not fit the replay's schema
    try:
        for seq, arrays in enumerate([good[0], good[1], good[2], nan, good[3], wide]):
            push.send_multipart(batch_frames("actor-0", seq, arrays))
            if seq == 2:
                wait_for(lambda: learner.data.poll(0, zmq.POLLIN) != 0, 10, "the batches to arrive")
                time.sleep(0.3)  # all three queued
                assert learner.ingest(timeout=1.0) == 3 * 64
                assert adds == [3 * 64], f"three batches that arrived together were not one add: {adds}"
        time.sleep(0.3)
        assert learner.ingest(timeout=1.0) == 64
        assert adds[1:] == [64], adds  # nan never reaches replay: good[3] goes in
        # nor does the wide batch: the batch spec refuses it first
        assert learner.intake.receiver.rejected["schema"] == 1 and learner.intake.receiver.rejected["values"] == 1
        assert learner.writer.rejected == 0
        assert learner.batches == 4 and len(learner.replay) == 4 * 64
        stored = learner.replay.get(np.arange(4 * 64))
        np.testing.assert_array_equal(stored["obs"], np.concatenate([g["obs"] for g in good]))  # order kept
        actor = learner.peers.actors.get("actor-0")
        assert actor is not None and actor.transitions == 4 * 64
        assert learner.book.env_steps == 64 * 5  # from the stats of the newest batch that went in
    finally:
        learner.close()


@pytest.mark.slow
def test_roles_and_the_launcher_do_not_import_torch() -> None:
    code = ("import sys, zmqrl.cli.app; zmqrl.cli.app.build_parser(); "
            "import zmqrl.roles.learner, zmqrl.roles.proxy, zmqrl.roles.actor, zmqrl.roles.evaluator, "
            "zmqrl.roles.launch.local, zmqrl.run.bookkeeping; "
            "sys.exit('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"torch imported at startup of a role or the launcher\n{done.stderr}"


_ADAM_SCRIPT = r'''
import sys
import torch
from zmqrl.agents.torch_util import Adam

def train(cls):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    opt = cls(net.parameters(), lr=1e-2, eps=1e-5)
    x = torch.randn(16, 4)
    for _ in range(20):
        opt.zero_grad()
        net(x).pow(2).mean().backward()
        opt.step()
    opt.load_state_dict(opt.state_dict())
    return [p.detach().clone() for p in net.parameters()], opt.state_dict()

ours, state = train(Adam)
compiler = "torch._dynamo" in sys.modules
stock, stock_state = train(lambda params, **kw: torch.optim.Adam(params, fused=True, **kw))
same = all(torch.equal(a, b) for a, b in zip(ours, stock))
same_state = all(torch.equal(state["state"][k]["exp_avg_sq"], stock_state["state"][k]["exp_avg_sq"])
                 for k in stock_state["state"]) and state["param_groups"][0]["fused"] is True
print(compiler, same, same_state, "torch._dynamo" in sys.modules)
'''


_FLUSH_SCRIPT = r'''
import sys
import torch
torch.set_num_threads(2)
from zmqrl.agents.torch_util import flush_denormals
probe = torch.full((1_000_000,), 1e-39)  # float32 denormals, split between the two threads of an op
def kept():
    return int((probe * 1.0).count_nonzero())  # a thread that flushes makes its half zero
assert kept() == 1_000_000
torch.set_flush_denormal(True)
main_only = kept()  # the control: torch's own switch reaches the calling thread alone
torch.set_flush_denormal(False)
print(main_only, flush_denormals(True), kept(), flush_denormals(False), kept())
'''


@pytest.mark.slow
def test_flushing_denormals_reaches_every_torch_thread_and_is_undone() -> None:
    """With two torch threads, ``flush_denormals`` flushes in both (torch's switch alone: one)."""
    done = subprocess.run([sys.executable, "-c", _FLUSH_SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    main_only, before, on, was, off = done.stdout.split()
    assert int(main_only) == 500_000, "the probe does not split an op between two threads"
    assert (before, int(on), was, int(off)) == ("False", 0, "True", 1_000_000), done.stdout


@pytest.mark.slow
def test_the_learners_adam_matches_torch_and_skips_the_compiler() -> None:
    """The agents' Adam makes the same updates (and state) as ``torch.optim.Adam`` with torch's fused
    kernel (its default on CPU), bit for bit, without
    importing ``torch._dynamo`` (about 1.1 s of CPU before a learner's first update); the stock
    class, run afterwards in the same process, does import it (the positive control)."""
    done = subprocess.run([sys.executable, "-c", _ADAM_SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    compiler_before, same, same_state, compiler_after = done.stdout.split()
    assert (compiler_before, same, same_state) == ("False", "True", "True"), done.stdout
    assert compiler_after == "True", "the control did not import the compiler: the check above proves nothing"


_EARLY_SIGNAL_SCRIPT = r'''
import os, signal, sys
from zmqrl.run.lifecycle import StopFlag, catch_stop_signals_early, ignore_stop_signals
catch_stop_signals_early()
os.kill(os.getpid(), signal.SIGTERM)  # while "starting": remembered, not fatal
with StopFlag() as stop:
    print(stop.set, stop.signal_name)
os.kill(os.getpid(), signal.SIGTERM)  # after the loop, while closing: remembered again
print("closed")
ignore_stop_signals()  # the role's work is done: through the interpreter's shutdown
os.kill(os.getpid(), signal.SIGTERM)
sys.exit(0)
'''


@pytest.mark.slow
def test_a_role_signalled_while_starting_or_closing_exits_with_its_own_code() -> None:
    """A launcher may TERM a role that is still importing (the evaluator starts late) or already
    closing (the learner finished): it must stop at its first step and exit 0, not die by the signal."""
    done = subprocess.run([sys.executable, "-c", _EARLY_SIGNAL_SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout.split() == ["True", "SIGTERM", "closed"], done.stdout
    control = subprocess.run([sys.executable, "-c", _EARLY_SIGNAL_SCRIPT.replace("catch_stop_signals_early()", "")],
                             capture_output=True, text=True, timeout=60)
    assert control.returncode == -signal.SIGTERM, "without it the signal kills the process (the positive control)"


_TERM_WHILE_IMPORTING = r'''
import importlib.abc, os, runpy, signal, sys

class TermOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "zmqrl.config":  # one of the role entry point's own imports
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGTERM)
        return None

sys.meta_path.insert(0, TermOnImport())
sys.argv = ["zmqrl", *sys.argv[1:]]
runpy.run_module("zmqrl.cli", run_name="__main__")
'''


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_role_signalled_while_importing_its_entry_point_exits_with_its_own_code(tmp_path: Path) -> None:
    """A launcher's stop signal can come while ``python -m zmqrl.cli ROLE`` still imports its modules
    (Slurm cancelling a job just after a restart): the role stops at its first step and exits 0."""
    args = ["evaluator", "--set", "net.peer_wait_s=5", "--learner", "127.0.0.1:1", "--run-dir", str(tmp_path)]
    done = subprocess.run([sys.executable, "-c", _TERM_WHILE_IMPORTING, *args], capture_output=True, text=True,
                          timeout=90)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "received SIGTERM while starting" in done.stderr, done.stderr[-2000:]
    control = subprocess.run([sys.executable, "-c", _TERM_WHILE_IMPORTING, "config"], capture_output=True,
                             text=True, timeout=90)
    assert control.returncode == -signal.SIGTERM, "a command that is not a role dies by it (the positive control)"


_LAUNCHER_SIGNALLED_AT_BOTH_ENDS = r'''
import os, signal, sys
from zmqrl import cli
from zmqrl.run import lifecycle

sys.argv = ["zmqrl", *sys.argv[1:]]
control = bool(os.environ.get("ZMQRL_TEST_CONTROL"))
if control:  # the launcher as any other command: only its handler while it supervises
    cli.LAUNCHER_COMMANDS = ()
enter, leave = lifecycle.StopFlag.__enter__, lifecycle.StopFlag.__exit__

def enter_signalled(self):
    if control:
        entered = enter(self)
        os.kill(os.getpid(), signal.SIGTERM)  # to its handler: it stops its roles
        return entered
    os.kill(os.getpid(), signal.SIGTERM)  # while the launcher starts, before its handler is in place
    return enter(self)

def leave_signalled(self, *exc):
    leave(self, *exc)
    os.kill(os.getpid(), signal.SIGTERM)  # its roles are stopped; it has not returned yet

lifecycle.StopFlag.__enter__, lifecycle.StopFlag.__exit__ = enter_signalled, leave_signalled
sys.exit(cli.main())
'''


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_a_launcher_signalled_while_starting_or_returning_exits_with_its_own_code(tmp_path: Path) -> None:
    """``zmqrl host`` TERMed as it starts stops every role it started and exits 0; TERMed again in
    the moment between its roles' end and its return (a job runner stopping it as the head finishes)
    it still exits 0, not -15."""
    args = ["host", "--learner", "127.0.0.1", "--actors", "1", "--run-dir", str(tmp_path / "run"),
            "--set", "net.peer_wait_s=5"]
    done = subprocess.run([sys.executable, "-c", _LAUNCHER_SIGNALLED_AT_BOTH_ENDS, *args], capture_output=True,
                          text=True, timeout=150)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "received SIGTERM while starting: stopping every role" in done.stderr, done.stderr[-2000:]
    assert "stopped by SIGTERM" in done.stderr, done.stderr[-2000:]
    control = subprocess.run([sys.executable, "-c", _LAUNCHER_SIGNALLED_AT_BOTH_ENDS, *args], capture_output=True,
                             text=True, timeout=150, env={**os.environ, "ZMQRL_TEST_CONTROL": "1"})
    assert "received SIGTERM: stopping every role" in control.stderr, control.stderr[-2000:]
    assert control.returncode == -signal.SIGTERM, "the signal after its roles' end kills it (the positive control)"


_TRAIN_SIGNALLED_AFTER_ITS_LOOP = r'''
import os, signal, sys
from zmqrl import cli
from zmqrl.run.lifecycle import StopFlag

sys.argv = ["zmqrl", *sys.argv[1:]]
if os.environ.get("ZMQRL_TEST_CONTROL"):  # train as any other command: only its handler while it trains
    cli.RUN_COMMANDS = ()
leave = StopFlag.__exit__

def leave_signalled(self, *exc):
    leave(self, *exc)
    os.kill(os.getpid(), signal.SIGTERM)  # the loop is over; the final checkpoint and summary are not written yet

StopFlag.__exit__ = leave_signalled
sys.exit(cli.main())
'''


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_train_signalled_after_its_loop_still_writes_its_final_checkpoint(tmp_path: Path) -> None:
    """``zmqrl train`` TERMed between the end of its loop and its final save (a job runner stopping it
    as it finishes) writes the final checkpoint and summary and exits 0, not -15."""
    def run(run_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
        args = ["train", str(Path(__file__).parents[2] / "configs" / "cartpole_dqn.yaml"), "--run-dir",
                str(run_dir), "--set", "trainer.warmup=64", "--set", "trainer.max_opts=20",
                "--set", "trainer.eval_interval=1000", "--set", "trainer.stop_return=null"]
        return subprocess.run([sys.executable, "-c", _TRAIN_SIGNALLED_AFTER_ITS_LOOP, *args], capture_output=True,
                              text=True, timeout=110, env={**os.environ, **env})

    done = run(tmp_path / "run")
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    summary = read_json(tmp_path / "run" / "summary.json")
    assert summary is not None and summary["opt_steps"] == 20, summary
    assert (tmp_path / "run" / "checkpoints" / "latest").exists(), sorted((tmp_path / "run").rglob("*"))
    control = run(tmp_path / "control", ZMQRL_TEST_CONTROL="1")
    assert control.returncode == -signal.SIGTERM, "the signal after its loop kills it (the positive control)"
