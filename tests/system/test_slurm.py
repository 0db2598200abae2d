"""Slurm: launch/slurm/zmqrl.sbatch for real, on a one-node Slurm set up on this machine.

``launch/slurm/single_node_setup.sh`` brings Slurm up from Debian's packages (munged, slurmctld,
slurmd; root and apt-get needed): the tests skip, saying why, where that cannot be done. One job
is submitted and followed through what a cluster does to it: every role runs as a Slurm step
(``zmqrl head`` and ``zmqrl host``), it trains, the signal Slurm sends before the time limit stops
it cleanly and requeues it, it resumes from its checkpoint when it runs again, and ``scancel``
stops it cleanly. The heterogeneous-job script is checked with ``sbatch --test-only`` (its
components cannot run together on one node).

    sudo .venv/bin/pytest -m slurm tests/system/test_slurm.py -s
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from procs import REPO, log_tail, wait_for
from zmqrl.bench.procfs import pids_with_arg
from zmqrl.roles.addresses import free_port
from zmqrl.run import checkpoint
from zmqrl.run.rundir import read_json

pytestmark = pytest.mark.slurm

SLURM = REPO / "launch" / "slurm"
CONFIG = REPO / "configs" / "cartpole_dqn.yaml"
SETUP_TIMEOUT_S = 600
RESUMED = re.compile(r"learner: resumed from \S+ at opt step (\d+)")


def run(*argv: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {done.returncode}: {done.stdout}{done.stderr}")
    return done


def slurm_works() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        done = run("sinfo", "-h", "-o", "%T", check=False, timeout=15)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and any(s.startswith(("idle", "mixed", "allocated")) for s in done.stdout.split())


@pytest.fixture(scope="module")
def slurm() -> Iterator[None]:
    """A working Slurm: the one that is there, or one set up here by single_node_setup.sh (whose daemons are
    stopped again at the end); else skip, saying why."""
    if slurm_works():
        yield
        return
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("Slurm is not running here, and setting it up (launch/slurm/single_node_setup.sh) needs root")
    started = time.monotonic()
    done = subprocess.run(["bash", str(SLURM / "single_node_setup.sh")], capture_output=True, text=True,
                          timeout=SETUP_TIMEOUT_S)
    if done.returncode in (3, 4):
        pytest.skip(f"Slurm cannot be set up here: {done.stderr.strip()}")
    try:
        assert done.returncode == 0, f"single_node_setup.sh exited {done.returncode}:\n{done.stdout}{done.stderr}"
        print(f"\nSlurm set up in {time.monotonic() - started:.1f}s: {done.stderr.strip()}")
        wait_for(slurm_works, 60, "sinfo to show the node ready")
        yield
    finally:
        subprocess.run(["bash", str(SLURM / "single_node_setup.sh"), "--stop"], capture_output=True, timeout=60)


def job_state(job: str) -> str:
    done = run("squeue", "-h", "-j", job, "-o", "%T", check=False)
    return done.stdout.strip() or "GONE"


def node_state() -> str:
    node = socket.gethostname().split(".")[0]
    return run("sinfo", "-h", "-n", node, "-o", "%T", check=False).stdout.strip()


def steps(job: str) -> dict[str, str]:
    """``{step id: step name}`` of a running job (``squeue -s``)."""
    done = run("squeue", "-h", "-s", "-j", job, "-o", "%i %j", check=False)
    return dict(line.split(maxsplit=1) for line in done.stdout.splitlines() if len(line.split()) == 2)


def summary(run_dir: Path) -> dict[str, Any]:
    return read_json(run_dir / "summary.json") or {}


def latest_opt_steps(run_dir: Path) -> int:
    return int((read_json(run_dir / "checkpoints" / "latest" / checkpoint.STATE_FILE) or {}).get("opt_steps", 0))


def actors_sending(run_dir: Path) -> bool:
    actors = summary(run_dir).get("actors") or {}
    return all(actors.get(f"actor-{i}", {}).get("batches") for i in (0, 1))


def evaluator_running(run_dir: Path) -> bool:
    """The head launcher (this run of it, not a finished one's file) has started its evaluator, which
    it does only after the learner's first update."""
    head = read_json(run_dir / "supervisor" / "head.json") or {}
    return head.get("state") == "running" and (head.get("roles") or {}).get("evaluator", {}).get("state") == "running"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_job_trains_requeues_resumes_and_cancels(slurm: None, tmp_path: Path) -> None:
    run_dir, out = tmp_path / "run", tmp_path / "job.out"
    zmqrl = Path(sys.executable).with_name("zmqrl")
    env = {**os.environ, "ZMQRL_RUN_DIR": str(run_dir), "ZMQRL_ACTORS_PER_HOST": "2",
           **({"ZMQRL": str(zmqrl)} if zmqrl.exists() else {})}
    overrides = ["run.seed=11", "trainer.warmup=300", "trainer.stop_return=null", "trainer.max_opts=100000000",
                 "trainer.eval_interval=100000", "trainer.latest_interval_s=1", "net.stats_interval_s=0.5",
                 f"net.data_port={free_port()}", f"net.model_port={free_port()}", f"net.eval_port={free_port()}",
                 f"net.snapshot_port={free_port()}"]
    submit = subprocess.run(["sbatch", "--parsable", "--nodes=1", "--time=30", f"--output={out}",
                             str(SLURM / "zmqrl.sbatch"), str(CONFIG), *(a for o in overrides for a in ("--set", o))],
                            capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert submit.returncode == 0, submit.stderr
    job = submit.stdout.strip().split(";")[0]
    started = time.monotonic()

    def diag() -> str:
        logs = "\n".join(f"--- {p.name}\n{log_tail(p, 10)}" for p in sorted((run_dir / "logs").glob("*.log")))
        return f"job {job} {job_state(job)} steps {steps(job)}\n--- job output\n{log_tail(out, 40)}\n{logs}"

    try:
        # Every role a step: zmqrl head on the node, zmqrl host beside it (a one-node allocation).
        names = wait_for(lambda: (s := steps(job)) and {"zmqrl-head", "zmqrl-host-0"} <= set(s.values()) and s,
                         120, "the job's head and host steps", diag)
        assert {f"{job}.0", f"{job}.1", f"{job}.batch"} <= set(names), names
        wait_for(lambda: actors_sending(run_dir) and latest_opt_steps(run_dir) >= 100, 180,
                 "batches from both actors and checkpoints/latest at 100+ opt steps", diag)
        at = latest_opt_steps(run_dir)
        print(f"\ntraining as Slurm steps {names} after {time.monotonic() - started:.1f}s")

        # What --signal=B:USR1@120 sends before the time limit: the job stops cleanly and requeues itself.
        run("scancel", "--batch", "--signal=USR1", job)
        wait_for(lambda: job_state(job) == "PENDING", 90, "the job requeued (PENDING)", diag)
        first_log = (run_dir / "logs" / "learner.log").read_text()
        stopped = re.search(r"^stop reason +stopped by SIGTERM$", first_log, re.M)
        assert stopped, f"the learner did not stop cleanly\n{diag()}"
        assert "did not stop within" not in out.read_text(), diag()
        # Shorten the scheduler's requeue delay to a few seconds, once the node is done with the job's first
        # run: started sooner, slurmd refuses it ("already killed", or its credential counted as revoked
        # when issued within the second of the kill).
        wait_for(lambda: node_state().startswith("idle"), 60, "the node to finish the job's first run", diag)
        run("scontrol", "update", f"JobId={job}", "StartTime=now+3")
        wait_for(lambda: RESUMED.search((run_dir / "logs" / "learner.log").read_text()), 180,
                 "the requeued job's learner to resume", diag)
        resumed = [int(n) for n in RESUMED.findall((run_dir / "logs" / "learner.log").read_text())]
        assert len(resumed) == 1 and resumed[0] >= at, resumed
        wait_for(lambda: summary(run_dir).get("opt_steps", 0) > resumed[0] + 50 and actors_sending(run_dir)
                 and evaluator_running(run_dir), 120, "training to go on after the requeue, evaluator included", diag)
        text = out.read_text()
        assert "received SIGTERM again" not in text, f"a step was signalled twice\n{text}"
        assert "time limit near" in text and "requeueing" in text and "holds a checkpoint; resuming" in text, text
        assert "(restart 1)" in text, text

        # scancel: every step stops cleanly (the roles exit 0, the learner saves), nothing is left.
        run("scancel", job)
        wait_for(lambda: job_state(job) == "GONE", 90, "the cancelled job to end", diag)
    finally:
        run("scancel", job, check=False)
    print(f"job {job}: trained, requeued, resumed and cancelled in {time.monotonic() - started:.1f}s")
    final = summary(run_dir)
    assert final.get("stop_reason") == "stopped by SIGTERM", final.get("stop_reason")
    launchers = {p.stem: read_json(p) or {} for p in (run_dir / "supervisor").glob("*.json")}
    node = socket.gethostname().split(".")[0]
    assert set(launchers) == {"head", f"host-{node}-0"}, launchers  # job.sh names each host NODE-INDEX
    for name, launcher in launchers.items():
        assert launcher["reason"] == "stopped by SIGTERM" and launcher["state"] == "finished", (name, launcher)
        for role, entry in launcher["roles"].items():
            assert entry["state"] == "stopped" and entry["last_exit"] == 0, (name, role, entry)
    assert (read_json(run_dir / "supervisor" / "head.json") or {})["roles"]["learner"]["restarts"] == 0
    state = run("scontrol", "show", "job", job, check=False).stdout
    assert "JobState=CANCELLED" in state or not state, state
    wait_for(lambda: not pids_with_arg(str(run_dir)), 30, "every process of the job to be gone",
             lambda: str(pids_with_arg(str(run_dir))))


@pytest.mark.slow
def test_heterogeneous_job_script(slurm: None) -> None:
    """The heterogeneous variant: two components (a GPU node for the head, actor nodes); Slurm accepts it.

    Its components cannot run together on a one-node cluster, so ``sbatch --test-only`` checks it with
    each component's size brought down to this node on the command line.
    """
    script = SLURM / "zmqrl_het.sbatch"
    assert run("bash", "-n", str(script)).returncode == 0
    text = script.read_text()
    assert re.search(r"^#SBATCH hetjob$", text, re.M) and "--gres=gpu:1" in text, text
    fitted = run("sbatch", "--test-only", "--nodes=1", "--cpus-per-task=1", "--gres=none", ":", "--nodes=1",
                 str(script), str(CONFIG), check=False)
    assert fitted.returncode == 0 and "to start at" in fitted.stderr, fitted
    as_shipped = run("sbatch", "--test-only", str(script), str(CONFIG), check=False)
    assert as_shipped.returncode != 0, as_shipped
    assert re.search(r"gres|node configuration is not available", as_shipped.stderr + as_shipped.stdout), as_shipped
