"""Exact resumes of ``zmqrl train``, and checkpoints refused before anything in the run directory is written.

A run stopped by SIGTERM at opt step k and resumed to 2k must end with the parameters, optimiser
state, RNGs, counters, evaluations and replay contents of a run of 2k steps never stopped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from procs import role_env, wait_for
from zmqrl import config
from zmqrl.config import Config
from zmqrl.run import checkpoint
from zmqrl.run.acting import STATE_FILE as ENV_STATE_FILE
from zmqrl.run.checkpoint import REPLAY_FILE, CheckpointError
from zmqrl.run.train import train

REPO = Path(__file__).resolve().parents[2]
SHORT = ["trainer.warmup=100", "trainer.eval_interval=50", "trainer.eval_episodes=2", "trainer.record_interval=50",
         "trainer.stop_return=null", "trainer.save_interval=50", "trainer.checkpoint_replay=true",
         "replay.capacity=5000"]
ALGOS = {  # config file and overrides that keep each run to seconds
    "dqn": ("cartpole_dqn.yaml", ["env.max_episode_steps=200"]),
    "sac": ("pendulum_sac.yaml", ["agent.hidden=[64,64]", "agent.batch_size=64", "agent.random_steps=100",
                                  "run.torch_threads=1"]),
    # a recurrent policy: its states per env and the sequence adder's pending steps are saved too
    "r2d2": ("cartpole_pomdp_r2d2.yaml",
             ["env.max_episode_steps=200", "agent.batch_size=16", "trainer.opt_interval=2"]),
    # on-policy: segments with their behaviour log-probabilities, the FIFO with the batch in training, the
    # observation statistics and the batch they last took in (the learning rate constant: a linear one runs
    # to trainer.max_opts, which the resumed run changes)
    "appo": ("cartpole_appo.yaml", ["env.max_episode_steps=200", "trainer.warmup=8", "agent.epochs=4",
                                    "agent.lr_schedule=constant", "agent.normalize_observations=true"]),
}


def load_cfg(algo: str, *overrides: str) -> Config:
    name, own = ALGOS[algo]
    return config.load(REPO / "configs" / name, [*SHORT, *own, *overrides])


def write_cfg(algo: str, path: Path, *overrides: str) -> Path:
    config.dump(load_cfg(algo, *overrides), path)
    return path


def start_train(cfg_path: Path, run_dir: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "zmqrl.cli", "train", str(cfg_path), "--run-dir", str(run_dir),
                                 *args], cwd=REPO, env=role_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def finish(proc: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> str:
    """Wait for ``proc`` (killed if it overruns); its exit must be 0. Returns its log."""
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"zmqrl train ran past {timeout}s:\n{log.read_text()[-3000:]}") from None
    text = log.read_text(errors="replace")
    assert rc == 0, text[-3000:]
    return text


def assert_same(a: Any, b: Any, where: str = "agent.pt") -> None:
    """Equal, tensor by tensor and value by value."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=where)
        assert a.dtype == b.dtype, where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, sorted(set(a) ^ set(b)))
        for key in a:
            assert_same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def tree_digest(root: Path) -> dict[str, Any]:
    """Every path under ``root`` with its bytes' hash and modification time (a rewrite with the
    same bytes shows too)."""
    out: dict[str, Any] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
    return out


# ---------------------------------------------------------------- the exact resume


@pytest.mark.slow
@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_sigterm_then_resume_ends_like_a_run_never_stopped(algo: str, tmp_path: Path) -> None:
    cfg_path = write_cfg(algo, tmp_path / "cfg.yaml", "trainer.max_opts=100000")
    stopped, whole = tmp_path / "stopped", tmp_path / "whole"
    proc = start_train(cfg_path, stopped, tmp_path / "first.log")
    try:
        wait_for(lambda: (stopped / "checkpoints" / "150" / checkpoint.STATE_FILE).is_file() or proc.poll() is not None,
                 timeout=120, what="checkpoint 150", diag=lambda: (tmp_path / "first.log").read_text()[-2000:])
        proc.send_signal(signal.SIGTERM)
    finally:
        first_log = finish(proc, tmp_path / "first.log")
    first = json.loads((stopped / "summary.json").read_text())
    assert first["stop_reason"] == "interrupted"
    _, latest = checkpoint.load(stopped / "checkpoints" / "latest")
    k = latest["opt_steps"]
    assert k == first["opt_steps"] and 150 <= k < 100000, first_log[-2000:]

    # the rest of the stopped run, and a run of the same length never stopped, side by side
    resumed = start_train(cfg_path, stopped, tmp_path / "resumed.log", "--resume", "--set", f"trainer.max_opts={2 * k}")
    uninterrupted = start_train(cfg_path, whole, tmp_path / "whole.log", "--set", f"trainer.max_opts={2 * k}")
    resumed_log = finish(resumed, tmp_path / "resumed.log")
    finish(uninterrupted, tmp_path / "whole.log")
    assert "the resume is exact" in resumed_log, resumed_log[-2000:]

    a_dir, b_dir = stopped / "checkpoints" / "latest", whole / "checkpoints" / "latest"
    agent_a, state_a = checkpoint.load(a_dir)
    agent_b, state_b = checkpoint.load(b_dir)
    assert state_a["opt_steps"] == state_b["opt_steps"] == 2 * k
    assert_same(agent_a, agent_b)  # networks, targets, optimisers, exploration and torch RNGs
    for key in ("env_steps", "opt_steps", "episodes", "replay", "trainer", "recent_returns"):
        assert state_a[key] == state_b[key], key
    assert [(e["opt_steps"], e["return_mean"]) for e in state_a["evals"]] == \
        [(e["opt_steps"], e["return_mean"]) for e in state_b["evals"]]
    summary_a = json.loads((stopped / "summary.json").read_text())
    summary_b = json.loads((whole / "summary.json").read_text())
    assert summary_a["replay_size"] == summary_b["replay_size"] == state_a["replay"]["size"]
    assert state_a["replay"]["size"] > 0 or algo == "appo"  # (a FIFO is empty between batches when none is queued)
    assert_same(npz(a_dir / REPLAY_FILE), npz(b_dir / REPLAY_FILE), REPLAY_FILE)
    assert_same(checkpoint.read_tree(a_dir / ENV_STATE_FILE), checkpoint.read_tree(b_dir / ENV_STATE_FILE),
                ENV_STATE_FILE)


@pytest.mark.slow
def test_sigkill_during_background_saves_leaves_a_matching_pair(tmp_path: Path) -> None:
    """``latest`` is refreshed at every opt step (most refreshes find the previous write still
    running); killed at any moment, what is on disk is one checkpoint with its own replay."""
    cfg_path = write_cfg("dqn", tmp_path / "cfg.yaml", "trainer.max_opts=100000", "trainer.latest_interval_s=0.001",
                         "trainer.save_interval=0", "replay.capacity=200000")
    run_dir = tmp_path / "run"
    proc = start_train(cfg_path, run_dir, tmp_path / "first.log")
    latest = run_dir / "checkpoints" / "latest"

    def refreshed_three_times() -> bool:
        try:  # (between the two renames of a refresh there is no latest)
            seen.add(json.loads((latest / checkpoint.STATE_FILE).read_text())["opt_steps"])
        except (OSError, ValueError):
            pass
        return len(seen) >= 3 or proc.poll() is not None

    seen: set[int] = set()
    try:
        wait_for(refreshed_three_times, timeout=120, what="three refreshes of latest", interval=0.01,
                 diag=lambda: (tmp_path / "first.log").read_text()[-2000:])
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    k = checkpoint.load(latest)[1]["opt_steps"]
    resumed = start_train(cfg_path, run_dir, tmp_path / "resumed.log", "--resume", "--set",
                          f"trainer.max_opts={k + 20}")
    text = finish(resumed, tmp_path / "resumed.log")
    assert "the resume is exact" in text and f"{latest}/{REPLAY_FILE}" in text, text[-2000:]
    assert json.loads((run_dir / "summary.json").read_text())["opt_steps"] == k + 20


def test_resume_without_replay_contents_says_it_is_not_exact(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    # Stopped at 50 with four opt steps per env step, the checkpoint owes two more: the resumed
    # run takes them only once its (empty) replay is warm again.
    train(load_cfg("dqn", "trainer.max_opts=50", "trainer.checkpoint_replay=false"), tmp_path)
    assert not (tmp_path / "checkpoints" / "latest" / REPLAY_FILE).exists()
    _, state = checkpoint.load(tmp_path / "checkpoints" / "latest")
    assert state["trainer"]["opt_credit"] == 2.0
    with caplog.at_level(logging.INFO, logger="zmqrl"):
        summary = train(load_cfg("dqn", "trainer.max_opts=60", "trainer.checkpoint_replay=false"), tmp_path,
                        resume=True)
    assert summary["opt_steps"] == 60
    assert summary["env_steps"] - state["env_steps"] >= 100  # warm-up collected again first
    assert "the resume is not exact: replay contents are not saved (trainer.checkpoint_replay is off)" in caplog.text


# ---------------------------------------------------------------- checkpoints refused


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 100 opt steps with its replay saved, and a copy of its latest at 50."""
    run_dir = tmp_path_factory.mktemp("resume") / "run"
    train(load_cfg("dqn", "trainer.max_opts=50"), run_dir)
    shutil.copytree(run_dir / "checkpoints" / "latest", run_dir.parent / "latest-at-50")
    train(load_cfg("dqn", "trainer.max_opts=100"), run_dir, resume=True)
    return run_dir


def copy_run(stopped_run: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(stopped_run, run_dir)
    return run_dir


@pytest.mark.parametrize("where", ["latest", "legacy"])
def test_replay_snapshot_of_another_checkpoint_is_refused(stopped_run: Path, tmp_path: Path, where: str) -> None:
    """A replay.npz taken at opt step 50 next to a latest of opt step 100 (inside latest, or where
    earlier versions wrote it) is refused, naming the file, and nothing is written."""
    run_dir = copy_run(stopped_run, tmp_path)
    latest = run_dir / "checkpoints" / "latest"
    old = stopped_run.parent / "latest-at-50" / REPLAY_FILE
    wrong = latest / REPLAY_FILE if where == "latest" else run_dir / "checkpoints" / REPLAY_FILE
    if where == "legacy":
        (latest / REPLAY_FILE).unlink()
    shutil.copy(old, wrong)
    before = tree_digest(run_dir)
    with pytest.raises(CheckpointError, match=f"{wrong}: is not the replay snapshot of {latest}") as info:
        train(load_cfg("dqn", "trainer.max_opts=120"), run_dir, resume=True)
    assert "remove it to resume with an empty replay" in str(info.value)
    assert tree_digest(run_dir) == before


def test_env_state_of_another_checkpoint_is_refused(stopped_run: Path, tmp_path: Path) -> None:
    run_dir = copy_run(stopped_run, tmp_path)
    env_file = run_dir / "checkpoints" / "latest" / ENV_STATE_FILE
    shutil.copy(stopped_run.parent / "latest-at-50" / ENV_STATE_FILE, env_file)
    before = tree_digest(run_dir)
    with pytest.raises(CheckpointError, match=f"{env_file}: does not fit .* belongs to another checkpoint"):
        train(load_cfg("dqn", "trainer.max_opts=120"), run_dir, resume=True)
    assert tree_digest(run_dir) == before


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


CORRUPTIONS = {  # name: (what to do to latest, overrides of the resume, the file the error names)
    "truncated replay": (lambda d: truncate(d / REPLAY_FILE), [], REPLAY_FILE),
    "truncated env state": (lambda d: truncate(d / ENV_STATE_FILE), [], ENV_STATE_FILE),
    "agent of another config": (lambda d: None, ["agent.hidden=[32,32]"], checkpoint.AGENT_FILE),
    "env of another config": (lambda d: None, ["env.max_episode_steps=150"], ENV_STATE_FILE),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_bad_checkpoint_exits_2_and_leaves_the_run_dir_untouched(stopped_run: Path, tmp_path: Path,
                                                                 case: str) -> None:
    spoil, overrides, named = CORRUPTIONS[case]
    run_dir = copy_run(stopped_run, tmp_path)
    latest = run_dir / "checkpoints" / "latest"
    spoil(latest)
    cfg_path = write_cfg("dqn", tmp_path / "cfg.yaml", "trainer.max_opts=150", *overrides)
    before = tree_digest(run_dir)
    proc = subprocess.run([sys.executable, "-m", "zmqrl.cli", "train", str(cfg_path), "--run-dir", str(run_dir),
                           "--resume"], cwd=REPO, env=role_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("zmqrl train: checkpoint error: ") and str(latest / named) in last, last
    assert "Traceback" not in proc.stderr
    assert tree_digest(run_dir) == before  # config.yaml, tb/, checkpoints: not a byte, not a timestamp
