"""Process helpers for the multi-process integration tests (tests/system/test_distributed.py).

Every role runs as ``python -m zmqrl.cli ROLE ...`` in a fresh process session, its stdout and
stderr in one log file. Everything here is bounded in time: waits take a deadline, stops escalate
from SIGTERM to SIGKILL, and :class:`Procs` cleans up whatever a test started, even when it fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from zmqrl.bench.procfs import kill_pids, pids_with_arg

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "cartpole_dqn.yaml"

T = TypeVar("T")


def role_env() -> dict[str, str]:
    """The environment every test process gets: one thread, unbuffered output."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def zmqrl_argv(role: str, *args: str, overrides: Iterable[str] = (), config: str | Path = CONFIG) -> list[str]:
    """``python -m zmqrl.cli ROLE CONFIG ARGS --set K=V ...`` (CONFIG: the shipped CartPole config unless given)."""
    sets = [a for o in overrides for a in ("--set", o)]
    return [sys.executable, "-m", "zmqrl.cli", role, str(config), *args, *sets]


def wait_for(predicate: Callable[[], T], timeout: float, what: str, diag: Callable[[], str] | None = None,
             interval: float = 0.1) -> T:
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout`` passes (AssertionError)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{diag() if diag else ''}")
        time.sleep(interval)


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "    (no log)"
    return "\n".join(f"    {line}" for line in text[-lines:]) or "    (empty log)"


# --- processes this test started -------------------------------------------------------------------

class Proc:
    """One started process, with its log file."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name, self.argv, self.log_path = name, argv, log_path
        self.started = time.monotonic()
        with open(log_path, "wb") as log:
            self.popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=role_env(), cwd=REPO, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 30) -> str:
        head = f"--- {self.name} (pid {self.pid}, rc {self.returncode}) {self.log_path}"
        return f"{head}\n{log_tail(self.log_path, lines)}"

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.alive():
            self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if still running after ``timeout`` seconds."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait up to ``timeout``, then SIGKILL its process group; returns the exit code."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            rc = self.wait(timeout)
            if rc is not None:
                return rc
            self.kill()
        rc = self.wait(10.0)
        return -9 if rc is None else rc

    def kill(self) -> None:
        """SIGKILL the process group this process leads (start_new_session made it its own)."""
        if self.alive():
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.popen.kill()


class Procs:
    """The processes of one test: start them, describe them for failure messages, stop them all."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.log_dir = root / "proc-logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, Proc] = {}
        self.sweep_args: list[str] = []  # stop leftovers whose command line holds one of these exactly

    def start(self, name: str, argv: list[str]) -> Proc:
        assert name not in self.procs, name
        proc = Proc(name, argv, self.log_dir / f"{name}.log")
        self.procs[name] = proc
        return proc

    def role(self, name: str, role: str, *args: str, overrides: Iterable[str] = ()) -> Proc:
        return self.start(name, zmqrl_argv(role, *args, overrides=overrides))

    def __getitem__(self, name: str) -> Proc:
        return self.procs[name]

    def describe(self, lines: int = 30, names: Iterable[str] | None = None) -> str:
        chosen = [self.procs[n] for n in names] if names is not None else list(self.procs.values())
        return "\n".join(p.tail(lines) for p in chosen)

    def stop_all(self, timeout: float = 10.0) -> dict[str, int]:
        """Stop every process still running (SIGTERM to all at once, then SIGKILL), then sweep leftovers."""
        for proc in self.procs.values():
            proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes = {}
        for name, proc in self.procs.items():
            rc = proc.wait(max(0.0, deadline - time.monotonic()))
            if rc is None:
                proc.kill()
                rc = proc.wait(10.0)
            codes[name] = -9 if rc is None else rc
        for arg in self.sweep_args:
            kill_pids(pids_with_arg(arg))
        return codes
