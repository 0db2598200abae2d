"""Role processes as launchers run them: each ``python -m zmqrl.cli ROLE ...`` in its own process
session with its output in a log file, killed with its launcher; and the one staged shutdown
every launcher (and the bench's process groups) stops roles with."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("zmqrl")

PACKAGE_ROOT = Path(__file__).resolve().parents[3]  # the directory this zmqrl package is in
STAGES = ("actor", "proxy")  # stopped first, in this order; every other kind after them


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def signals_reach_roles() -> bool:
    """True where the scheduler signals every process of the launcher's job step itself.

    That is a Slurm step started by ``srun`` (``scancel`` and ``scancel --signal`` reach every
    process of the step, the roles included). ``ZMQRL_SIGNALS_REACH_ROLES=1`` (or ``0``) says so
    explicitly, e.g. under systemd's ``KillMode=control-group``.
    """
    explicit = os.environ.get("ZMQRL_SIGNALS_REACH_ROLES")
    if explicit in ("0", "1"):
        return explicit == "1"
    return bool(os.environ.get("SLURM_STEP_ID"))


def role_env() -> dict[str, str]:
    """Every role's environment: the launcher's, unbuffered, one math thread.

    ``python -m`` puts the working directory first on ``sys.path``, so a ``zmqrl/`` there (another
    checkout, an older version) would be what the roles import while the launcher runs its own.
    Unless the launcher's package is the one in the working directory, roles start with
    ``PYTHONSAFEPATH`` (Python 3.11+), which leaves the working directory off the path.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if PACKAGE_ROOT != Path.cwd().resolve():
        env["PYTHONSAFEPATH"] = "1"
    return env


def zmqrl_command(role: str, config_args: list[str], *args: str) -> list[str]:
    """``python -m zmqrl.cli ROLE CONFIG --set ... ARGS``: a role run with this launcher's Python."""
    return [sys.executable, "-m", "zmqrl.cli", role, *config_args, *args]


@dataclass
class RoleSpec:
    """What to run for one role: its unique name (``actor-3``), kind and command line."""

    name: str
    kind: str  # learner, proxy, actor or evaluator
    argv: list[str]
    start_after: str = ""  # a file in the run directory: start once this launch has written it (or after
    # START_AFTER_MAX_S), so the role does not compete with the others' start; "" = at once


@dataclass
class Role:
    """One supervised role: its current process, its log and its history."""

    spec: RoleSpec
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    state: str = "pending"  # pending, running, waiting (to restart), finished, failed, stopped
    starts: int = 0
    restarts: int = 0
    in_a_row: int = 0  # restarts since the role last ran BACKOFF_RESET_S
    started_at: float = 0.0  # monotonic
    restart_at: float = 0.0  # monotonic, while waiting
    finished_at: float = 0.0  # monotonic, after an exit 0
    last_exit: int | None = None
    history: list[dict[str, Any]] = field(default_factory=list)  # one entry per exit
    _log: IO[bytes] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> str:
        return self.spec.kind

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, argv: list[str], append: bool) -> None:
        self.close_log()
        self._log = open(self.log_path, "ab" if append else "wb")
        if append and self.log_path.stat().st_size:
            self._log.write(f"--- {time.strftime('%H:%M:%S')} start {self.starts + 1}: "
                            f"{' '.join(argv[3:])}\n".encode())
            self._log.flush()
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=role_env(), start_new_session=True, preexec_fn=_die_with_parent)
        self.starts += 1
        self.state = "running"
        self.started_at = time.monotonic()

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def signal(self, sig: int) -> None:
        if self.alive():
            try:
                self.proc.send_signal(sig)  # type: ignore[union-attr]
            except ProcessLookupError:
                pass

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "    (no log)"
        return "\n".join(f"    {line}" for line in text[-lines:]) or "    (empty log)"


def stop_in_stages(roles: Iterable[Role], grace_s: float, *, send: bool = True,
                   signals: Callable[[], int] = lambda: 0, name: str = "zmqrl") -> None:
    """Stop ``roles``: actors first, then proxies, then the rest, so queued batches land. Each stage is
    sent SIGTERM (unless ``send`` is False: the scheduler signalled them already) and given up to a
    third of ``grace_s``; whatever still runs when ``grace_s`` is over is killed. When ``signals()`` (the
    stop signals the launcher got) rises, every role is sent SIGTERM at once, then SIGKILL."""
    live = [r for r in roles if r.alive()]
    deadline = time.monotonic() + grace_s
    escalated = signals()

    def wait(stage: list[Role], until: float) -> None:
        nonlocal escalated
        for role in stage:
            while role.alive() and time.monotonic() < until:
                if signals() > escalated:
                    escalated = signals()
                    for other in live:
                        other.signal(signal.SIGTERM if escalated == 2 else signal.SIGKILL)
                try:
                    role.proc.wait(timeout=min(0.1, max(0.0, until - time.monotonic())))  # type: ignore[union-attr]
                except subprocess.TimeoutExpired:
                    pass

    stages = [[r for r in live if r.kind == kind] for kind in STAGES] + [[r for r in live if r.kind not in STAGES]]
    for stage in stages:
        if send:
            for role in stage:
                role.signal(signal.SIGTERM)
        wait(stage, min(deadline, time.monotonic() + grace_s / 3))
    wait(live, deadline)
    for role in live:
        if role.alive():
            log.warning("%s: %s did not stop within %.0fs; killing it", name, role.name, grace_s)
            role.proc.kill()  # type: ignore[union-attr]
        role.proc.wait()  # type: ignore[union-attr]


def stop_roles(roles: Iterable[Role], grace_s: float) -> None:
    """Stop processes outside a supervisor (the bench, tools), in stages (:func:`stop_in_stages`), and
    close their logs."""
    roles = list(roles)
    stop_in_stages(roles, grace_s)
    for role in roles:
        role.close_log()
