"""Progress of ``zmqrl train``: a bar on a terminal, plain lines otherwise, and the end-of-run table."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from zmqrl.run.record import Progress, format_duration, run_table

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
SHORT = ["trainer.max_opts=400", "trainer.warmup=100", "trainer.eval_interval=200", "trainer.save_interval=0",
         "trainer.eval_episodes=2", "trainer.record_interval=20", "trainer.stop_return=null",
         "env.max_episode_steps=100"]


def train_argv(run_dir: Path) -> list[str]:
    sets = [a for s in SHORT for a in ("--set", s)]
    return [sys.executable, "-m", "zmqrl.cli", "train", str(REPO / "configs" / "cartpole_dqn.yaml"),
            "--run-dir", str(run_dir), *sets]


def end_table_rows(text: str) -> dict[str, str]:
    rows = {}
    for line in text.splitlines():
        for name in ("stop reason", "wall time", "env steps", "opt steps", "best eval return", "last eval return",
                     "run directory", "inserted", "replay samples", "time spent"):
            if line.startswith(name):
                rows[name] = line[len(name):].strip()
    return rows


def check_end_table(text: str, run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = end_table_rows(text)
    assert rows["stop reason"] == "reached max_opts=400"
    assert rows["opt steps"].startswith("400 (")
    assert rows["env steps"].startswith(f"{summary['env_steps']} (")
    assert rows["best eval return"].startswith(f"{summary['best_eval_return']:.1f} ± ")
    assert rows["run directory"] == str(run_dir)


@pytest.mark.slow
def test_plain_lines_when_not_a_terminal(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.run(train_argv(run_dir), capture_output=True, text=True, timeout=150, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "\r" not in err and "%|" not in err  # no bar drawn into a pipe
    lines = [line for line in err.splitlines() if "INFO opt " in line]
    assert lines, err
    assert "INFO opt 20/400 (5%)  env=" in lines[0]  # the first record interval is shown at once
    assert all("/400 (" in line and " eta " in line and "env/s=" in line and "opt/s=" in line for line in lines)
    check_end_table(err, run_dir)


@pytest.mark.slow
def test_bar_on_a_terminal(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 140, 0, 0))
    proc = subprocess.Popen(train_argv(run_dir), stdin=slave, stdout=slave, stderr=slave, cwd=tmp_path)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 150
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    text = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    frames = [f for part in text.split("\n") for f in part.split("\r") if "opt steps [" in f]
    assert frames, text
    assert any(f.lstrip().startswith("100%|") and "400/400 opt steps" in f for f in frames), frames[-3:]
    assert any("env/s=" in f and "opt/s=" in f and "best=" in f for f in frames), frames[-3:]
    assert all(len(f) <= 140 for f in frames)  # fits the terminal's width
    assert "INFO opt " not in text  # the plain lines are for pipes and files
    assert "eval at opt 200" in text  # log lines still get through, above the bar
    check_end_table(text.replace("\r", ""), run_dir)


def test_progress_on_a_pty_starts_a_resumed_run_where_it_was() -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    with os.fdopen(slave, "w") as stream:
        progress = Progress(1000, stream=stream)
        assert progress.bar is not None
        progress.update(600, {"env": 2400})
        progress.update(650, {"env": 2600})
        assert progress.bar.n == 650 and progress.bar.initial == 600  # the rate counts this run's 50 steps only
        progress.close()
        assert progress.bar is None
    os.close(master)


def test_plain_progress_lines(caplog: pytest.LogCaptureFixture) -> None:
    class Pipe:  # a stream that is not a terminal
        def isatty(self) -> bool:
            return False

    progress = Progress(1000, interval_s=3600, stream=Pipe())
    assert progress.bar is None
    with caplog.at_level(logging.INFO, logger="zmqrl"):
        progress.update(100, {"env": 400, "best": None, "env/s": 120})
        progress.update(200, {"env": 800, "best": 9.5, "env/s": 120})  # within interval_s: no line
    assert [r.getMessage() for r in caplog.records] == ["opt 100/1000 (10%)  env=400 best=- env/s=120  eta -"]
    t0 = time.monotonic()
    progress._first = (t0 - 10.0, 100)
    assert progress.eta(200, now=t0) == "1m20s"  # 800 steps left at 10 steps/s


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0, 12.4, 65, 3599, 3600, 7322)] == ["0s", "12s", "1m05s", "59m59s",
                                                                             "1h00m", "2h02m"]


def test_run_table_of_a_learner_has_the_distributed_rows() -> None:
    summary = {"stop_reason": "reached max_opts=100", "wall_s": 12.5, "env_steps": 5000, "env_steps_per_s": 400.0,
               "opt_steps": 100, "opt_steps_per_s": 8.0, "replay_samples_per_s": 512.0, "samples_per_insert": 1.28,
               "transitions_inserted": 5000, "transitions_inserted_per_s": 400.0,
               "compute_cost": {"sample": 0.1, "update": 0.55, "ingest": 0.2, "publish": 0.01, "other": 0.14},
               "model_version": 2, "best_eval_return": 20.0, "last_eval_return": 15.0,
               "evals": [{"opt_steps": 50, "env_steps": 2000, "wall_s": 6.0, "return_mean": 20.0,
                          "return_std": 1.0, "episodes": 10},
                         {"opt_steps": 100, "env_steps": 5000, "wall_s": 12.0, "return_mean": 15.0,
                          "return_std": 2.0, "episodes": 10}],
               "policy_lag": {"mean": 1.5, "p90": 3, "max": 4, "updates_per_version": 50},
               "messages": {"batches_received": 80, "batches_lost": 0, "rejected_total": 1},
               "actors": {"actor-0": {"env_steps": 2500, "env_steps_per_s": 200.0, "batches": 40, "lost": 0,
                                      "lag_mean": 1.5, "blocked_s": 0.25}}}
    table = run_table(summary, "runs/x")
    rows = end_table_rows(table)
    assert rows["wall time"] == "12s (12.5 s)"
    assert rows["best eval return"] == "20.0 ± 1.0 over 10 episodes (opt 50, env 2000, 6.0 s)"
    assert rows["last eval return"] == "15.0 ± 2.0 over 10 episodes (opt 100, env 5000, 12.0 s)"
    assert rows["run directory"] == "runs/x"
    assert "policy lag        mean 1.5, p90 3, max 4 model versions (50 updates each)" in table
    assert "batches           received 80, lost 0, rejected 1" in table
    assert rows["inserted"] == "5000 transitions (400/s)"
    assert rows["replay samples"] == "512/s (1.28 per transition inserted)"
    assert rows["time spent"] == "update 55%, ingest 20%, sample 10%, publish 1%, other 14%"
    assert table.splitlines()[-1].split() == ["actor-0", "2500", "200", "40", "0", "1.5", "0.2"]


def test_run_table_without_evaluations() -> None:
    table = run_table({"stop_reason": "interrupted", "wall_s": 1.0, "env_steps": 10, "opt_steps": 0,
                       "best_eval_return": None, "last_eval_return": None})
    assert "best eval return  -  (no evaluation)" in table and "run directory" not in table
