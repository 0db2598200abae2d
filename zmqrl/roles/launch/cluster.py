"""Per-machine launchers for a cluster: ``zmqrl head`` (learner and evaluator) and ``zmqrl host``
(one proxy and N actors), each supervising its roles as ``zmqrl local`` does.

A cluster runs one ``zmqrl head`` on the learner's machine and one ``zmqrl host`` per actor
machine; Slurm (``launch/slurm/``) and Kubernetes (``launch/k8s/``) do exactly that. Hosts find
the learner by its machine's name or address and the config's ``net.data_port`` and
``net.model_port`` (and ``net.snapshot_port``); each host's proxy listens on loopback only, for that
host's actors, and (``net.relay``) relays the learner's models and control to them. Actor ids
are unique across hosts (``--first-id``) and below ``actor.num_actors``, the total over all hosts.
"""

from __future__ import annotations

import logging
import re
import socket
import time
from pathlib import Path

from zmqrl.config import Config, ConfigError
from zmqrl.roles.addresses import free_port
from zmqrl.roles.launch.local import config_args, require_resumable
from zmqrl.roles.launch.processes import RoleSpec, zmqrl_command
from zmqrl.roles.launch.supervisor import MAX_RESTARTS, Supervisor
from zmqrl.run import user_callables
from zmqrl.run.lifecycle import StopFlag
from zmqrl.run.rundir import FIRST_UPDATE_FILE

log = logging.getLogger("zmqrl")

GRACE_S = 20.0  # roles' time to stop (the learner's final checkpoint); below Slurm's and Kubernetes' defaults
_HOST = re.compile(r"^[A-Za-z0-9_.\-]+$|^\[[0-9A-Fa-f:.]+\]$")


def _has_checkpoint(run_dir: Path) -> bool:
    try:
        require_resumable(run_dir)
    except ConfigError:
        return False
    return True


def learner_host(addr: str) -> str:
    """The learner machine's host name or address from ``--learner`` (``HOST`` or ``tcp://HOST``)."""
    host = addr[len("tcp://"):] if addr.startswith("tcp://") else addr
    if not host or not _HOST.match(host):
        raise ConfigError(f"--learner: {addr!r} is not a host name or address; give the learner machine's name or "
                          "address only (the ports come from net.data_port and net.model_port)")
    return host


def run_head(cfg: Config, config_path: str | None, overrides: list[str], run_dir: str | None, *,
             bind: str | None = None, evaluator: bool = True, resume: bool = False, auto_resume: bool = False,
             max_restarts: int = MAX_RESTARTS, fail_fast: bool = False, grace_s: float = GRACE_S) -> int:
    """The ``zmqrl head`` entry point: the learner (binding ``net.data_port``, ``net.model_port`` and
    ``net.eval_port`` on ``bind`` or ``net.bind_host``) and the evaluator, supervised; returns the exit code.

    ``auto_resume`` resumes when the run directory holds a checkpoint and starts fresh otherwise
    (for a scheduler that restarts or requeues the head).
    """
    if not run_dir:
        raise ConfigError("zmqrl head needs --run-dir (on a cluster: a directory every restart of the head finds)")
    path = Path(run_dir)
    if resume:
        require_resumable(path)
    elif auto_resume and _has_checkpoint(path):
        resume = True
        log.info("head: %s holds a checkpoint; resuming from it", path)
    user_callables.announce(cfg, "head")  # the callables files load here before any role starts
    net = cfg.net
    bind_host = bind or net.bind_host
    local = "127.0.0.1" if bind_host in ("0.0.0.0", "*") else bind_host  # where the evaluator reaches the learner
    ports = {"data": net.data_port, "model": net.model_port, "eval": net.eval_port, "snapshot": net.snapshot_port}
    for key, port in ports.items():
        if port == 0:  # "pick a free one": picked once here, so a restarted learner binds the same
            ports[key] = free_port("127.0.0.1" if bind_host in ("0.0.0.0", "*") else bind_host)
    cfg_args = config_args(config_path, overrides)
    rd = ["--run-dir", str(path)]

    def plan(attempt: int) -> list[RoleSpec]:
        roles = [RoleSpec("learner", "learner", zmqrl_command(
            "learner", cfg_args, *rd, "--bind-data", f"tcp://{bind_host}:{ports['data']}",
            "--bind-model", f"tcp://{bind_host}:{ports['model']}", "--bind-eval", f"tcp://{bind_host}:{ports['eval']}",
            "--bind-snapshot", f"tcp://{bind_host}:{ports['snapshot']}"))]
        if evaluator:
            roles.append(RoleSpec("evaluator", "evaluator", zmqrl_command(
                "evaluator", cfg_args, *rd, "--learner", f"tcp://{local}:{ports['model']}",
                "--snapshot", f"tcp://{local}:{ports['snapshot']}",
                "--report", f"tcp://{local}:{ports['eval']}"), start_after=FIRST_UPDATE_FILE))
        return roles

    path.mkdir(parents=True, exist_ok=True)
    if bind_host.startswith("127.") or bind_host in ("localhost", "::1"):
        log.info("head: the learner binds %s, so only this machine reaches it; --bind 0.0.0.0 (or this machine's "
                 "address) lets hosts on other machines in", bind_host)
    log.info("head: %s the learner on %s (data %d, models %d, evaluations %d, snapshots %d)%s; logs in %s",
             "resuming" if resume else "starting", bind_host, ports["data"], ports["model"], ports["eval"],
             ports["snapshot"],
             " and the evaluator" if evaluator else "", path / "logs")
    supervisor = Supervisor("head", "head", path, plan, anchor="learner", max_restarts=max_restarts,
                            fail_fast=fail_fast, resume=resume, grace_s=grace_s, progress_total=cfg.trainer.max_opts)
    with StopFlag.launcher() as stop:
        outcome = supervisor.run(stop)
    log.info("head: %s; restarts %s", outcome.reason,
             {n: r.restarts for n, r in supervisor.roles.items() if r.restarts} or "none")
    return outcome.code


def host_name(first_id: int) -> str:
    """This host's default name in the run: ``SHORTHOSTNAME-FIRSTID`` (unique while actor ids are)."""
    return f"{socket.gethostname().split('.')[0]}-{first_id}"


def run_host(cfg: Config, config_path: str | None, overrides: list[str], learner: str, actors: int,
             first_id: int = 0, run_dir: str | None = None, *, name: str | None = None,
             max_restarts: int = MAX_RESTARTS, fail_fast: bool = False, grace_s: float = GRACE_S) -> int:
    """The ``zmqrl host`` entry point: one proxy (on a free loopback port) and actors ``first_id ..
    first_id + actors - 1``, supervised; returns the exit code. Ends when every actor has finished."""
    total = cfg.actor.num_actors
    if actors < 1:
        raise ConfigError(f"--actors must be >= 1, got {actors}")
    if first_id < 0:
        raise ConfigError(f"--first-id must be >= 0, got {first_id}")
    if first_id + actors > total:
        raise ConfigError(f"--first-id {first_id} --actors {actors}: actor ids {first_id}..{first_id + actors - 1} "
                          f"must be below actor.num_actors={total}, the number of actors over all hosts (set it with "
                          f"--set actor.num_actors=TOTAL)")
    host = learner_host(learner)
    user_callables.announce(cfg, "host", user_callables.HOST_HINT)
    name = name or host_name(first_id)
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise ConfigError(f"--name: {name!r} may hold only letters, digits, '_', '.', '-'")
    path = Path(run_dir or cfg.run.run_dir or f"runs/{cfg.run.name}-host-{name}")
    data, model = f"tcp://{host}:{cfg.net.data_port}", f"tcp://{host}:{cfg.net.model_port}"
    # net.snapshot_port 0 (the head picked one): roles take the port the learner's control names
    snapshot_args = ["--snapshot", f"tcp://{host}:{cfg.net.snapshot_port}"] if cfg.net.snapshot_port else []
    cfg_args = config_args(config_path, overrides)
    rd = ["--run-dir", str(path)]
    proxy_name = f"proxy-{name}"

    def plan(attempt: int) -> list[RoleSpec]:
        proxy = f"tcp://127.0.0.1:{free_port()}"
        relay_args: list[str] = []
        stream = ["--learner", model, *snapshot_args]
        if cfg.net.relay:  # the host's relay, in its proxy: the learner sends each model once to this host
            relay = (f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}")
            relay_args = ["--relay", relay[0], "--relay-snapshot", relay[1]]
            stream = ["--learner", relay[0], "--snapshot", relay[1]]
        roles = [RoleSpec(proxy_name, "proxy", zmqrl_command("proxy", cfg_args, *rd, "--bind", proxy, "--learner",
                                                            data, "--models", model, *snapshot_args,
                                                            "--name", proxy_name, *relay_args))]
        roles += [RoleSpec(f"actor-{i}", "actor", zmqrl_command("actor", cfg_args, *rd, "--id", str(i), "--proxy",
                                                                proxy, *stream))
                  for i in range(first_id, first_id + actors)]
        return roles

    path.mkdir(parents=True, exist_ok=True)
    log.info("host %s: starting %s and actors %d..%d of %d; learner at %s (data %d, models %d); logs in %s", name,
             proxy_name, first_id, first_id + actors - 1, total, host, cfg.net.data_port, cfg.net.model_port,
             path / "logs")
    started = time.monotonic()
    supervisor = Supervisor(f"host-{name}", "host", path, plan, anchor="actors", max_restarts=max_restarts,
                            fail_fast=fail_fast, grace_s=grace_s)
    with StopFlag.launcher() as stop:
        outcome = supervisor.run(stop)
    log.info("host %s: %s after %.1fs; restarts %s", name, outcome.reason, time.monotonic() - started,
             {n: r.restarts for n, r in supervisor.roles.items() if r.restarts} or "none")
    return outcome.code
