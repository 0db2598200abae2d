"""The scripts in ``launch/``, run as a user runs them: real roles, real sockets, real CartPole.

- the per-role scripts (``learner.sh``, ``proxy.sh``, ``actor.sh``, ``evaluator.sh``) train together
  on 127.0.0.1, configured only by their environment variables (plus ``--set`` for free ports);
- ``multihost_example.sh``: its ``head`` part on one host and its ``host`` part on another, in two
  network namespaces joined by a bridge (tests/netns.py) where this runs as root, else on loopback.

``local.sh`` runs in tests/roles/test_supervision.py, the Slurm scripts in tests/system/test_slurm.py, the
Kubernetes entrypoint in tests/system/test_k8s.py; ``setup.sh`` is what CI runs first.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from netns import Lan, unavailable_reason
from procs import REPO, Proc, Procs, log_tail, wait_for
from zmqrl.bench.procfs import pids_with_arg
from zmqrl.roles.addresses import free_port
from zmqrl.run.rundir import read_json

CONFIG = REPO / "configs" / "cartpole_dqn.yaml"
LAUNCH = REPO / "launch"


def script_env(**env: str) -> list[str]:
    """``env K=V ...`` in front of a script: the test's own zmqrl command, the shipped config."""
    zmqrl = Path(sys.executable).with_name("zmqrl")
    base = {"ZMQRL_CONFIG": str(CONFIG), **({"ZMQRL": str(zmqrl)} if zmqrl.exists() else {}), **env}
    return ["env", *(f"{k}={v}" for k, v in base.items())]


def sets(*overrides: str) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def summary(run_dir: Path) -> dict[str, Any]:
    return read_json(run_dir / "summary.json") or {}


def diag(procs: Procs, run_dir: Path) -> str:
    logs = "\n".join(f"--- {p.name}\n{log_tail(p, 12)}" for p in sorted((run_dir / "logs").glob("*.log")))
    return f"{procs.describe(25)}\n{logs}"


def both_actors_wait_for_a_model(log: Callable[[int], str]) -> bool:
    """Whether actors 0 and 1 have logged that they wait for the first model (``log(i)``: actor i's log).

    The learner starts only then, so one actor starting late on a busy machine cannot find the
    run already over (600 updates need only ~1,500 env steps).
    """
    return all("waiting for the first model" in log(i) for i in (0, 1))


@pytest.mark.slow
def test_every_script_parses() -> None:
    """``bash -n`` on every script (the tests below run them; this names a syntax error at once)."""
    scripts = [*LAUNCH.glob("*.sh"), *LAUNCH.glob("slurm/*.sh"), *LAUNCH.glob("slurm/*.sbatch")]
    assert len(scripts) >= 10, scripts
    for script in scripts:
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"{script}: {done.stderr}"
    done = subprocess.run(["sh", "-n", str(LAUNCH / "k8s" / "entrypoint.sh")], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr


# --------------------------------------------------------------------------------------------------
# the per-role scripts


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_role_scripts_train_together(tmp_path: Path, procs: Procs) -> None:
    run_dir = tmp_path / "run"
    procs.sweep_args.append(str(run_dir))
    ports = {k: free_port() for k in ("data", "model", "eval", "proxy")}
    # No rate limiter: an actor that gets its first model late would find the others' warm-up data
    # covering all 600 updates, and stay paused to the end.
    common = sets("run.seed=5", "trainer.warmup=300", "trainer.stop_return=null", "trainer.max_opts=600",
                  "trainer.min_samples_per_insert=0",
                  "trainer.eval_interval=200", "trainer.eval_episodes=2", f"net.data_port={ports['data']}",
                  f"net.model_port={ports['model']}", f"net.eval_port={ports['eval']}",
                  f"net.snapshot_port={free_port()}")
    rd = str(run_dir)

    def start(name: str, script: str, **env: str) -> Proc:
        return procs.start(name, [*script_env(ZMQRL_RUN_DIR=rd, **env), "bash", str(LAUNCH / script), *common])

    start("evaluator", "evaluator.sh", ZMQRL_LEARNER=f"127.0.0.1:{ports['model']}")
    for i in (0, 1):
        start(f"actor-{i}", "actor.sh", ZMQRL_ACTOR_ID=str(i), ZMQRL_NUM_ACTORS="2",
              ZMQRL_PROXY=f"127.0.0.1:{ports['proxy']}", ZMQRL_LEARNER=f"127.0.0.1:{ports['model']}")
    wait_for(lambda: both_actors_wait_for_a_model(lambda i: procs[f"actor-{i}"].text()), 120,
             "both actors to wait for the first model", procs.describe)
    start("proxy", "proxy.sh", ZMQRL_LEARNER=f"127.0.0.1:{ports['data']}",
          ZMQRL_PROXY_BIND=f"tcp://127.0.0.1:{ports['proxy']}")
    learner = start("learner", "learner.sh", ZMQRL_BIND_HOST="127.0.0.1")

    rc = learner.wait(timeout=240)
    assert rc == 0, f"learner.sh exited {rc}\n{procs.describe()}"
    final = summary(run_dir)
    assert final.get("stop_reason") == "reached max_opts=600", final
    assert all(final["actors"].get(f"actor-{i}", {}).get("batches") for i in (0, 1)), final.get("actors")
    assert final["proxies"].get("proxy", {}).get("forwarded"), final.get("proxies")
    assert final["evals"], "no evaluation reached the learner from evaluator.sh"
    for name in ("evaluator", "actor-0", "actor-1", "proxy"):  # (until roles finish by themselves with the learner)
        procs[name].signal(signal.SIGTERM)
    for name in ("evaluator", "actor-0", "actor-1", "proxy"):
        assert procs[name].wait(timeout=30) == 0, procs.describe(names=[name])
    stats = read_json(run_dir / "roles" / "actor-1.json") or {}
    assert stats.get("explore", 1.0) < 0.01, f"actor.sh did not pass ZMQRL_NUM_ACTORS on: {stats}"


# --------------------------------------------------------------------------------------------------
# multihost_example.sh: head on one host, host on another


@pytest.fixture
def two_hosts() -> Iterator[Lan | None]:
    """Two network namespaces on one bridge where this runs as root; None (loopback) otherwise."""
    if unavailable_reason() is not None:
        yield None
        return
    lan = Lan.create(["learner", "actors"], suffix=f"{os.getpid()}x", subnet=f"10.232.{os.getpid() % 250 + 1}")
    try:
        yield lan
    finally:
        lan.destroy()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_multihost_example(tmp_path: Path, procs: Procs, two_hosts: Lan | None) -> None:
    run_dir = tmp_path / "run"
    procs.sweep_args.append(str(run_dir))
    train = sets("run.seed=5", "trainer.warmup=300", "trainer.stop_return=null", "trainer.max_opts=600",
                 "trainer.min_samples_per_insert=0",  # (why: test_role_scripts_train_together)
                 "trainer.eval_interval=300", "trainer.eval_episodes=2")
    script = str(LAUNCH / "multihost_example.sh")
    if two_hosts is not None:  # each host its own address and ports; the learner binds every interface
        learner_addr, ports = two_hosts.addr("learner"), []

        def on(host: str, argv: list[str]) -> list[str]:
            return two_hosts.exec_argv(host, argv)
    else:
        learner_addr = "127.0.0.1"
        ports = sets(f"net.data_port={free_port()}", f"net.model_port={free_port()}", f"net.eval_port={free_port()}",
                     f"net.snapshot_port={free_port()}")

        def on(host: str, argv: list[str]) -> list[str]:
            return argv
    print(f"multihost_example.sh on {'two network namespaces' if two_hosts else 'loopback'}")
    head_env = script_env(ZMQRL_RUN_DIR=str(run_dir), **({} if two_hosts else {"ZMQRL_BIND_HOST": "127.0.0.1"}))
    host = procs.start("host", on("actors", [*script_env(ZMQRL_RUN_DIR=str(run_dir), LEARNER=learner_addr,
                                                         ACTORS="2", FIRST_ID="0", TOTAL_ACTORS="2"),
                                             "bash", script, "host", *train, *ports]))
    wait_for(lambda: both_actors_wait_for_a_model(lambda i: log_tail(run_dir / "logs" / f"actor-{i}.log", 200)),
             120, "both actors to wait for the first model", lambda: diag(procs, run_dir))
    head = procs.start("head", on("learner", [*head_env, "bash", script, "head", *train, *ports]))
    rc = head.wait(timeout=240)
    assert rc == 0, f"the head part exited {rc}\n{diag(procs, run_dir)}"
    final = summary(run_dir)
    assert final.get("stop_reason") == "reached max_opts=600", final
    assert all(final["actors"].get(f"actor-{i}", {}).get("batches") for i in (0, 1)), final.get("actors")
    assert final["evals"], final
    host.signal(signal.SIGTERM)
    assert host.wait(timeout=60) == 0, diag(procs, run_dir)
    launchers = sorted(p.stem for p in (run_dir / "supervisor").glob("*.json"))
    assert launchers[0] == "head" and len(launchers) == 2 and launchers[1].startswith("host-"), launchers
    if two_hosts is not None:  # the batches crossed the LAN: the host's proxy forwarded to the learner's address
        proxy_log = next((run_dir / "logs").glob("proxy-*.log")).read_text()
        assert f"tcp://{learner_addr}:5555" in proxy_log, proxy_log[-1500:]
    assert not pids_with_arg(str(run_dir))


@pytest.mark.slow
def test_multihost_example_without_learner_says_so(tmp_path: Path) -> None:
    done = subprocess.run([*script_env(ZMQRL_RUN_DIR=str(tmp_path)), "bash", str(LAUNCH / "multihost_example.sh"),
                           "host"], capture_output=True, text=True, timeout=60, env={**os.environ, "LEARNER": ""})
    assert done.returncode == 2 and "set LEARNER" in done.stderr, done
    done = subprocess.run(["bash", str(LAUNCH / "multihost_example.sh")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage" in done.stderr, done
