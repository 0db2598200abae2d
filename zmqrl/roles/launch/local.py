"""Local launcher: learner, proxy, N actors and the evaluator on this machine, as supervised processes.

Each role runs as ``python -m zmqrl.cli ROLE ...`` with its log in ``RUN_DIR/logs/ROLE.log``,
under a :class:`~zmqrl.roles.launch.supervisor.Supervisor`: a role that dies is started again (the
learner with ``--resume`` once the run has a checkpoint), a role that exits 2 stops the run, and
Ctrl-C or SIGTERM stops every role. The launcher shows one progress view (read from the learner's
``summary.json``) and counts restarts in ``RUN_DIR/supervisor/local.json``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from zmqrl.config import Config, ConfigError
from zmqrl.roles.addresses import free_port
from zmqrl.roles.launch.processes import RoleSpec, zmqrl_command
from zmqrl.roles.launch.supervisor import MAX_RESTARTS, Supervisor
from zmqrl.run import checkpoint, user_callables
from zmqrl.run.lifecycle import StopFlag
from zmqrl.run.record import print_run_table
from zmqrl.run.rundir import FIRST_UPDATE_FILE, read_json, write_json_atomic

log = logging.getLogger("zmqrl")

GRACE_S = 4.5  # how long roles may take to stop before they are killed


def config_args(config_path: str | None, overrides: list[str], *extra: str) -> list[str]:
    """The config file and ``--set`` overrides as every role's command line takes them."""
    return ([config_path] if config_path else []) + [a for o in [*overrides, *extra] for a in ("--set", o)]


def plan_roles(config_path: str | None, overrides: list[str], actors: int, run_dir: Path,
               evaluator: bool, host: str = "127.0.0.1", relay: bool = True) -> tuple[list[RoleSpec], dict[str, Any]]:
    """The command line of every role, with free loopback ports, and the endpoints they use. With ``relay``
    the proxy relays the learner's stream and the actors subscribe to it (``net.relay``)."""
    names = ("data", "model", "eval", "snapshot", "proxy") + (("relay", "relay_snapshot") if relay else ())
    addr = {k: f"tcp://{host}:{free_port(host)}" for k in names}
    cfg_args = config_args(config_path, overrides, f"actor.num_actors={actors}")
    rd = ["--run-dir", str(run_dir)]
    relay_args = ["--relay", addr["relay"], "--relay-snapshot", addr["relay_snapshot"]] if relay else []
    stream = (addr["relay"], addr["relay_snapshot"]) if relay else (addr["model"], addr["snapshot"])
    roles = [RoleSpec("learner", "learner", zmqrl_command("learner", cfg_args, *rd, "--bind-data", addr["data"],
                                                         "--bind-model", addr["model"], "--bind-eval", addr["eval"],
                                                         "--bind-snapshot", addr["snapshot"])),
             RoleSpec("proxy", "proxy", zmqrl_command("proxy", cfg_args, *rd, "--bind", addr["proxy"],
                                                     "--learner", addr["data"], "--models", addr["model"],
                                                     "--snapshot", addr["snapshot"], *relay_args))]
    roles += [RoleSpec(f"actor-{i}", "actor", zmqrl_command("actor", cfg_args, *rd, "--id", str(i), "--proxy",
                                                            addr["proxy"], "--learner", stream[0],
                                                            "--snapshot", stream[1]))
              for i in range(actors)]
    if evaluator:
        roles.append(RoleSpec("evaluator", "evaluator", zmqrl_command("evaluator", cfg_args, *rd, "--learner",
                                                                     addr["model"], "--snapshot", addr["snapshot"],
                                                                     "--report", addr["eval"]),
                              start_after=FIRST_UPDATE_FILE))  # not competing with the learner's start
    endpoints = {"learner": {"data": addr["data"], "model": addr["model"], "eval": addr["eval"],
                             "snapshot": addr["snapshot"]},
                 "proxy": {"bind": addr["proxy"],
                           **({"relay": addr["relay"], "relay_snapshot": addr["relay_snapshot"]} if relay else {})},
                 "roles": {r.name: r.argv[3:] for r in roles}}
    return roles, endpoints


def require_resumable(run_dir: str | Path | None, flag: str = "--resume") -> Path:
    """The run directory ``--resume`` continues, which must hold ``checkpoints/latest`` (ConfigError if not)."""
    if not run_dir:
        raise ConfigError(f"{flag} needs --run-dir (the run directory to continue)")
    path = Path(run_dir)
    try:
        checkpoint.resolve(path / "checkpoints" / "latest")
    except checkpoint.CheckpointError as exc:
        raise ConfigError(f"{flag}: {exc}; nothing to resume in {path}") from None
    return path


def run_local(cfg: Config, config_path: str | None, overrides: list[str], actors: int, run_dir: str | None,
              evaluator: bool = True, *, resume: bool = False, max_restarts: int = MAX_RESTARTS,
              fail_fast: bool = False) -> int:
    """The ``zmqrl local`` entry point; returns the exit code (0 finished or stopped, 1 a role failed for
    good, 2 a role found its config or input bad, 98 no free ports after every attempt).

    Ports are picked free here and bound by the children a moment later; should another process
    take one in between (a role exits 98), every role is started again on new ports.
    """
    if resume:
        require_resumable(run_dir)
    user_callables.announce(cfg, "local")  # the callables files load here before any role starts
    path = Path(run_dir or cfg.run.run_dir or f"runs/{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    (path / "logs").mkdir(parents=True, exist_ok=True)
    summary_path = path / "summary.json"
    if not resume and summary_path.exists():
        summary_path.unlink()  # a fresh run; the learner writes a new one

    def plan(attempt: int) -> list[RoleSpec]:
        roles, endpoints = plan_roles(config_path, overrides, actors, path, evaluator, relay=cfg.net.relay)
        write_json_atomic(path / "endpoints.json", endpoints)
        return roles

    log.info("local: %s learner, proxy, %d actor(s)%s; logs in %s", "resuming" if resume else "starting", actors,
             " and evaluator" if evaluator else "", path / "logs")
    started = time.monotonic()
    supervisor = Supervisor("local", "local", path, plan, anchor="learner", max_restarts=max_restarts,
                            fail_fast=fail_fast, resume=resume, grace_s=GRACE_S, progress_total=cfg.trainer.max_opts)
    with StopFlag.launcher() as stop:
        outcome = supervisor.run(stop)
    summary = read_json(summary_path) or {}
    restarts = {n: r.restarts for n, r in supervisor.roles.items() if r.restarts}
    log.info("local: finished in %.1fs (%s; %s); restarts %s; best eval %s; run directory %s",
             time.monotonic() - started, outcome.reason, summary.get("stop_reason") or "no summary",
             restarts or "none", summary.get("best_eval_return"), path)
    if summary:
        print_run_table(summary, path)
    return outcome.code
