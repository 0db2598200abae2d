"""Local launcher: learner, proxy, N actors and the evaluator on this machine, as fresh processes.

Each role runs as ``python -m zmqrl.cli ROLE ...`` in its own process session, with its log in
``RUN_DIR/logs/ROLE.log``. The launcher shows one progress view (read from the learner's
``summary.json``), stops every role with one SIGTERM on Ctrl-C or SIGTERM (SIGKILL for any
still alive after a grace period), reports a role that dies with the tail of its log, and asks
the kernel to SIGTERM every child should the launcher itself be killed, so none is orphaned.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from zmqrl.checkpoint import write_json_atomic
from zmqrl.config import Config
from zmqrl.lifecycle import StopFlag
from zmqrl.record import Progress
from zmqrl.roles.common import EXIT_ADDRESS_IN_USE, free_port, read_json

log = logging.getLogger("zmqrl")

GRACE_S = 4.5
BIND_ATTEMPTS = 3  # launches on fresh ports when a role finds its port taken


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class Role:
    name: str
    argv: list[str]
    proc: subprocess.Popen | None = None
    log_file: IO[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return Path(self.log_file.name) if self.log_file else Path()

    def start(self, log_dir: Path) -> None:
        self.log_file = open(log_dir / f"{self.name}.log", "wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(self.argv, stdout=self.log_file, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, preexec_fn=_die_with_parent)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(f"    {line}" for line in text[-lines:])


def _stop_all(roles: list[Role], grace_s: float = GRACE_S) -> None:
    """Stop producers before consumers (actors, then proxy, then the rest) so queued batches land."""
    deadline = time.monotonic() + grace_s
    stages = [[r for r in roles if r.name.startswith("actor-")], [r for r in roles if r.name == "proxy"]]
    stages.append([r for r in roles if all(r not in s for s in stages)])
    for stage in stages:
        for role in stage:
            if role.alive():
                role.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        stage_deadline = min(deadline, time.monotonic() + grace_s / 3)
        for role in stage:
            try:
                role.proc.wait(timeout=max(0.0, stage_deadline - time.monotonic()))  # type: ignore[union-attr]
            except subprocess.TimeoutExpired:
                pass  # killed below if it is still running at the overall deadline
    for role in roles:
        if role.proc is None:
            continue
        try:
            role.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("local: %s did not stop within %.0fs; killing it", role.name, grace_s)
            role.proc.kill()
            role.proc.wait()
    for role in roles:
        if role.log_file:
            role.log_file.close()


def plan_roles(config_path: str | None, overrides: list[str], actors: int, run_dir: Path,
               evaluator: bool, host: str = "127.0.0.1") -> tuple[list[Role], dict[str, Any]]:
    """The command line of every role, with free loopback ports."""
    ports = {k: free_port(host) for k in ("data", "model", "eval", "proxy")}
    addr = {k: f"tcp://{host}:{p}" for k, p in ports.items()}
    base = [sys.executable, "-m", "zmqrl.cli"]
    cfg_args = ([config_path] if config_path else []) + [a for o in overrides for a in ("--set", o)] + \
        ["--set", f"actor.num_actors={actors}"]
    rd = ["--run-dir", str(run_dir)]
    roles = [Role("learner", base + ["learner", *cfg_args, *rd, "--bind-data", addr["data"],
                                     "--bind-model", addr["model"], "--bind-eval", addr["eval"]]),
             Role("proxy", base + ["proxy", *cfg_args, *rd, "--bind", addr["proxy"], "--learner", addr["data"],
                                   "--models", addr["model"]])]
    roles += [Role(f"actor-{i}", base + ["actor", *cfg_args, *rd, "--id", str(i), "--proxy", addr["proxy"],
                                         "--learner", addr["model"]]) for i in range(actors)]
    if evaluator:
        roles.append(Role("evaluator", base + ["evaluator", *cfg_args, *rd, "--learner", addr["model"],
                                               "--report", addr["eval"]]))
    endpoints = {"learner": {"data": addr["data"], "model": addr["model"], "eval": addr["eval"]},
                 "proxy": {"bind": addr["proxy"]}, "roles": {r.name: r.argv[3:] for r in roles}}
    return roles, endpoints


def run_local(cfg: Config, config_path: str | None, overrides: list[str], actors: int, run_dir: str | None,
              evaluator: bool = True) -> int:
    """The ``zmqrl local`` entry point; returns the exit code.

    Ports are picked free here and bound by the children a moment later; should another process
    take one in between (a role exits with :data:`EXIT_ADDRESS_IN_USE`, which only a failed bind
    at its start does), every role is stopped and the run starts over on new ports, up to
    :data:`BIND_ATTEMPTS` times.
    """
    path = Path(run_dir or cfg.run.run_dir or f"runs/{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    (path / "logs").mkdir(parents=True, exist_ok=True)
    summary_path = path / "summary.json"
    log.info("local: starting learner, proxy, %d actor(s)%s; logs in %s", actors,
             " and evaluator" if evaluator else "", path / "logs")
    started = time.monotonic()
    with StopFlag() as stop:
        for attempt in range(1, BIND_ATTEMPTS + 1):
            if summary_path.exists():
                summary_path.unlink()  # a fresh run; the learner writes a new one
            roles, endpoints = plan_roles(config_path, overrides, actors, path, evaluator)
            write_json_atomic(path / "endpoints.json", endpoints)
            code, taken = _supervise(cfg, roles, summary_path, stop)
            if taken is None or attempt == BIND_ATTEMPTS or stop.set:
                break
            log.warning("local: %s found its port taken by another process (attempt %d of %d); "
                        "starting every role again on new ports", taken, attempt, BIND_ATTEMPTS)
    summary = read_json(summary_path) or {}
    log.info("local: finished in %.1fs (%s); best eval %s; run directory %s", time.monotonic() - started,
             summary.get("stop_reason") or ("interrupted" if stop.set else "stopped"),
             summary.get("best_eval_return"), path)
    return code


def _supervise(cfg: Config, roles: list[Role], summary_path: Path, stop: StopFlag) -> tuple[int, str | None]:
    """Start ``roles``, show progress until the learner ends, a role dies or ``stop``; stop them all.

    Returns the exit code, and the name of a role that could not bind its port (None otherwise):
    the caller may then start over on other ports.
    """
    progress = Progress(cfg.trainer.max_opts)
    code, taken, running = 0, None, False
    for role in roles:
        role.start(summary_path.parent / "logs")
    learner = roles[0]
    while not stop.set:
        dead = [r for r in roles if not r.alive()]
        unbound = next((r for r in dead if r.proc.returncode == EXIT_ADDRESS_IN_USE), None)  # type: ignore[union-attr]
        if unbound is not None:
            log.info("local: %s could not bind:\n%s", unbound.name, unbound.tail(3))
            code, taken = EXIT_ADDRESS_IN_USE, unbound.name
            break
        if learner in dead:
            code = learner.proc.returncode  # type: ignore[union-attr]
            if code != 0:
                log.error("local: the learner exited with code %s; last lines of %s:\n%s", code,
                          learner.log_path, learner.tail())
            break
        dead = [r for r in dead if r.proc.returncode != 0]  # type: ignore[union-attr]  # 0: the learner said done
        if dead:
            for r in dead:
                log.error("local: %s exited with code %s; last lines of %s:\n%s", r.name,
                          r.proc.returncode, r.log_path, r.tail())  # type: ignore[union-attr]
            code = 1
            break
        summary = read_json(summary_path)
        if summary:
            running = True
            progress.update(int(summary.get("opt_steps", 0)), {
                "env": summary.get("env_steps"), "ret": summary.get("train_return_recent"),
                "eval": summary.get("last_eval_return"), "best": summary.get("best_eval_return"),
                "env/s": round(summary.get("env_steps_per_s", 0)),
                "opt/s": round(summary.get("opt_steps_per_s", 0))})
        try:
            learner.proc.wait(timeout=0.5 if running else 0.05)  # type: ignore[union-attr]
        except subprocess.TimeoutExpired:
            pass
    progress.close()
    _stop_all(roles)
    return code, taken
