"""Supervision by the launchers: real role processes on 127.0.0.1, killed and restarted.

``zmqrl local`` (through ``launch/local.sh``, as a user starts it), ``zmqrl head`` and ``zmqrl host``
restart a role that dies: the actor as a new incarnation of the same id, the learner with
``--resume`` from ``checkpoints/latest``. A role that exits 2 stops the run; restarts are capped
by ``--max-restarts``; every restart is counted in ``RUN_DIR/supervisor/NAME.json``, which
``zmqrl status`` shows. Runs are short CartPole runs on the two shared cores of this machine.

    .venv/bin/pytest tests/roles/test_supervision.py            # everything (~3 min on 2 busy cores)
    .venv/bin/pytest -m "not slow" tests/roles/test_supervision.py
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from procs import REPO, Proc, Procs, log_tail, role_env, wait_for, zmqrl_argv
from zmqrl.bench.procfs import alive, pids_with_arg
from zmqrl.config import dump, load
from zmqrl.roles.addresses import free_port
from zmqrl.roles.launch.processes import Role, RoleSpec, zmqrl_command
from zmqrl.roles.launch.processes import role_env as launcher_role_env
from zmqrl.roles.launch.supervisor import START_AFTER_MAX_S, Supervisor
from zmqrl.run import checkpoint
from zmqrl.run.lifecycle import StopFlag
from zmqrl.run.rundir import read_json

CONFIG = REPO / "configs" / "cartpole_dqn.yaml"
FAST = ["run.seed=7", "trainer.stop_return=null", "trainer.warmup=300", "trainer.eval_interval=100000",
        "net.stats_interval_s=0.5", "trainer.latest_interval_s=1"]
RESUMED = re.compile(r"learner: resumed from \S+ at opt step (\d+)")


def cli(*args: str) -> list[str]:
    """``python -m zmqrl.cli ARGS`` (no config file: ``zmqrl_argv`` always adds one)."""
    return [sys.executable, "-m", "zmqrl.cli", *args]


def sets(overrides: list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def supervisor_file(run_dir: Path, name: str = "local") -> dict[str, Any]:
    return read_json(run_dir / "supervisor" / f"{name}.json") or {}


def role_entry(run_dir: Path, role: str, name: str = "local") -> dict[str, Any]:
    return (supervisor_file(run_dir, name).get("roles") or {}).get(role) or {}


def summary(run_dir: Path) -> dict[str, Any]:
    return read_json(run_dir / "summary.json") or {}


def actor_stats(run_dir: Path, name: str) -> dict[str, Any]:
    return (summary(run_dir).get("actors") or {}).get(name) or {}


def latest_opt_steps(run_dir: Path) -> int:
    state = read_json(run_dir / "checkpoints" / "latest" / checkpoint.STATE_FILE) or {}
    return int(state.get("opt_steps", 0))


def diag(procs: Procs, run_dir: Path) -> str:
    logs = "\n".join(f"--- {p.name}\n{log_tail(p, 12)}" for p in sorted((run_dir / "logs").glob("*.log")))
    return f"{procs.describe(30)}\n{logs}"


def running_pid(run_dir: Path, role: str, name: str = "local") -> int | None:
    entry = role_entry(run_dir, role, name)
    pid = entry.get("pid")
    return pid if entry.get("state") == "running" and isinstance(pid, int) and alive(pid) else None


def local_script(procs: Procs, run_dir: Path, *args: str, overrides: list[str], actors: int = 2) -> Proc:
    """``launch/local.sh`` with the test's run directory and overrides (the script execs ``zmqrl local``)."""
    procs.sweep_args.append(str(run_dir))
    zmqrl = Path(sys.executable).with_name("zmqrl")
    env = {"ZMQRL_ACTORS": str(actors), "ZMQRL_RUN_DIR": str(run_dir), "ZMQRL_CONFIG": str(CONFIG),
           **({"ZMQRL": str(zmqrl)} if zmqrl.exists() else {})}
    script = str(REPO / "launch" / "local.sh")
    return procs.start("local", ["env", *(f"{k}={v}" for k, v in env.items()), "bash", script, *args, *sets(overrides)])


# --------------------------------------------------------------------------------------------------
# zmqrl local: a killed actor, proxy and learner come back, and the run finishes; then --resume


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_local_restarts_killed_roles_and_resumes(tmp_path: Path, procs: Procs) -> None:
    run_dir = tmp_path / "run"
    # Long enough that the learner is still training when it is killed, after about 10 s of killing
    # and restarting the others (1,500 was reached first once, on a quieter machine).
    max_opts = 8000
    local = local_script(procs, run_dir, "--no-evaluator", overrides=[*FAST, f"trainer.max_opts={max_opts}"])

    # actor-0 acts and its batches reach the learner: note its incarnation, then kill it.
    first = wait_for(lambda: actor_stats(run_dir, "actor-0").get("incarnation")
                     if actor_stats(run_dir, "actor-0").get("batches") else None,
                     90, "batches from actor-0 at the learner", lambda: diag(procs, run_dir))
    actor_pid = running_pid(run_dir, "actor-0")
    assert actor_pid is not None, supervisor_file(run_dir)
    os.kill(actor_pid, signal.SIGKILL)
    killed_actor_at = time.monotonic()

    def actor_back() -> str | None:
        stats = actor_stats(run_dir, "actor-0")
        inc = stats.get("incarnation")
        return inc if inc and inc != first and running_pid(run_dir, "actor-0") not in (None, actor_pid) else None

    second = wait_for(actor_back, 60, "actor-0 restarted, its batches at the learner as a new incarnation",
                      lambda: diag(procs, run_dir))
    print(f"actor-0 back as incarnation {second} (was {first}) "
          f"{time.monotonic() - killed_actor_at:.1f}s after kill -9")
    assert actor_stats(run_dir, "actor-0").get("incarnations", 0) >= 2, actor_stats(run_dir, "actor-0")

    # The proxy dies: it comes back on the same port, the actors reconnect, batches flow again.
    proxy_pid = running_pid(run_dir, "proxy")
    assert proxy_pid is not None
    received = summary(run_dir).get("messages", {}).get("batches_received", 0)
    os.kill(proxy_pid, signal.SIGKILL)
    wait_for(lambda: running_pid(run_dir, "proxy") not in (None, proxy_pid)
             and summary(run_dir).get("messages", {}).get("batches_received", 0) > received + 10, 60,
             "the proxy restarted and batches flowing through it again", lambda: diag(procs, run_dir))

    # The learner has written checkpoints/latest: kill it; it must come back with --resume.
    at = wait_for(lambda: latest_opt_steps(run_dir) >= 100 and latest_opt_steps(run_dir), 120,
                  "checkpoints/latest at 100+ opt steps", lambda: diag(procs, run_dir))
    learner_pid = running_pid(run_dir, "learner")
    assert learner_pid is not None and at < max_opts, (at, supervisor_file(run_dir))
    os.kill(learner_pid, signal.SIGKILL)

    rc = local.wait(timeout=240)
    assert rc == 0, f"zmqrl local exited {rc}\n{diag(procs, run_dir)}"
    out = local.text()
    final = summary(run_dir)
    assert final.get("opt_steps") == max_opts and final.get("stop_reason") == f"reached max_opts={max_opts}", final
    learner_log = (run_dir / "logs" / "learner.log").read_text()
    resumed = [int(n) for n in RESUMED.findall(learner_log)]
    assert len(resumed) == 1 and resumed[0] >= at, f"resumed at {resumed}, latest had {at}\n{learner_log[-2000:]}"

    status = supervisor_file(run_dir)
    roles = status["roles"]
    assert status["state"] == "finished" and status["restarts_total"] == 3, status
    assert roles["actor-0"]["restarts"] == 1 and roles["actor-0"]["exits"][0]["exit"] == -9, roles["actor-0"]
    assert roles["learner"]["restarts"] == 1 and roles["learner"]["exits"][0]["exit"] == -9, roles["learner"]
    assert roles["proxy"]["restarts"] == 1 and roles["proxy"]["exits"][0]["exit"] == -9, roles["proxy"]
    assert roles["actor-1"]["restarts"] == 0, roles["actor-1"]
    restarted = {k: v for k, v in final.get("restarts", {}).items() if v}  # summary.json counts them per role
    assert restarted == {"actor-0": 1, "learner": 1, "proxy": 1}, final.get("restarts")
    assert "actor-0 exited with code -9" in out and "learner exited with code -9" in out, out
    assert "restarting it with --resume" in out and "restarted learner" in out, out
    assert "restarts=" in out, f"no progress line shows the restarts:\n{out}"
    assert not pids_with_arg(str(run_dir)), "processes of the run are still alive after zmqrl local exited"

    # The finished run continues with --resume from its run directory (CONFIG defaults to its config.yaml).
    more = procs.start("resume", cli("local", "--actors", "2", "--no-evaluator", "--run-dir", str(run_dir), "--resume",
                                     "--set", f"trainer.max_opts={max_opts + 200}"))
    rc = more.wait(timeout=180)
    assert rc == 0, f"zmqrl local --resume exited {rc}\n{diag(procs, run_dir)}"
    resumed = [int(n) for n in RESUMED.findall((run_dir / "logs" / "learner.log").read_text())]
    assert resumed[-1] == max_opts, resumed
    assert summary(run_dir).get("opt_steps") == max_opts + 200, summary(run_dir)


# --------------------------------------------------------------------------------------------------
# exit 2 (bad input) is not restarted; --resume needs a checkpoint


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_role_exit_2_stops_the_run(tmp_path: Path, procs: Procs) -> None:
    run_dir = tmp_path / "run"
    procs.sweep_args.append(str(run_dir))
    # Nothing to resume: the launcher says so before starting anything.
    early = procs.start("early", zmqrl_argv("local", "--run-dir", str(run_dir), "--resume"))
    assert early.wait(timeout=60) == 2, early.tail()
    assert "nothing to resume" in early.text() and "checkpoints/latest" in early.text(), early.text()

    # A checkpoint whose state.json is not JSON: the learner exits 2 on --resume, and stays down.
    latest = run_dir / "checkpoints" / "latest"
    latest.mkdir(parents=True)
    (latest / checkpoint.STATE_FILE).write_text("{not json")
    (latest / checkpoint.AGENT_FILE).write_bytes(b"\0" * 16)
    local = procs.start("local", zmqrl_argv("local", "--actors", "1", "--no-evaluator", "--run-dir", str(run_dir),
                                            "--resume", overrides=FAST))
    rc = local.wait(timeout=90)
    assert rc == 2, f"zmqrl local exited {rc}\n{diag(procs, run_dir)}"
    out = local.text()
    assert "learner exited with code 2 (bad config or input); not restarting it" in out, out
    assert "unreadable checkpoint state" in out, f"the learner's own error is not in the launcher's output:\n{out}"
    learner = role_entry(run_dir, "learner")
    assert learner["restarts"] == 0 and learner["starts"] == 1 and learner["last_exit"] == 2, learner
    assert supervisor_file(run_dir)["state"] == "failed", supervisor_file(run_dir)
    assert not pids_with_arg(str(run_dir)), "roles still alive after the launcher exited"


# --------------------------------------------------------------------------------------------------
# exit 0 while the run goes on: started again after the grace; --max-restarts caps restarts


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_exit_0_is_restarted_while_the_run_goes_on_and_restarts_are_capped(tmp_path: Path, procs: Procs) -> None:
    from zmqrl.roles.launch.supervisor import FINISH_GRACE_S

    run_dir = tmp_path / "run"
    procs.sweep_args.append(str(run_dir))
    local = procs.start("local", zmqrl_argv("local", "--actors", "2", "--no-evaluator", "--run-dir", str(run_dir),
                                            "--max-restarts", "1", overrides=[*FAST, "trainer.max_opts=10000000"]))
    wait_for(lambda: actor_stats(run_dir, "actor-1").get("batches"), 90, "batches from actor-1",
             lambda: diag(procs, run_dir))
    pid = running_pid(run_dir, "actor-1")
    assert pid is not None
    os.kill(pid, signal.SIGTERM)  # a clean stop: exit 0, while the learner goes on
    wait_for(lambda: role_entry(run_dir, "actor-1").get("state") == "finished", 30, "actor-1 to finish with exit 0",
             lambda: diag(procs, run_dir))
    stopped = time.monotonic()
    wait_for(lambda: running_pid(run_dir, "actor-1") not in (None, pid), FINISH_GRACE_S + 30,
             "actor-1 started again", lambda: diag(procs, run_dir))
    waited = time.monotonic() - stopped
    assert waited >= FINISH_GRACE_S - 1.0, f"restarted after {waited:.1f}s, before the {FINISH_GRACE_S}s grace"
    entry = role_entry(run_dir, "actor-1")
    assert entry["restarts"] == 1 and entry["exits"][-1]["exit"] == 0, entry
    assert "actor-1 finished (exit 0)" in local.text() and "exited 0 but the run goes on" in local.text()

    # Its one restart is used: the next death stops the run (exit 1), every role stopped.
    new_pid = running_pid(run_dir, "actor-1")
    assert new_pid is not None
    os.kill(new_pid, signal.SIGKILL)
    rc = local.wait(timeout=60)
    assert rc == 1, f"zmqrl local exited {rc}\n{diag(procs, run_dir)}"
    assert "already restarted 1 time(s) (--max-restarts 1); stopping the run" in local.text(), local.text()
    assert not pids_with_arg(str(run_dir)), "roles still alive after the launcher exited"
    assert supervisor_file(run_dir)["state"] == "failed"


# --------------------------------------------------------------------------------------------------
# the learner restarts with --resume only from a checkpoint this run wrote (real checkpoint files)


def test_learner_resumes_only_from_this_runs_checkpoint(tmp_path: Path) -> None:
    import torch

    run_dir = tmp_path / "run"
    spec = RoleSpec("learner", "learner", [sys.executable, "-m", "zmqrl.cli", "learner"])
    learner = Role(spec, tmp_path / "learner.log")

    def save(opt_steps: int) -> None:
        checkpoint.save(run_dir / "checkpoints" / "latest", {"w": torch.zeros(2)}, {"opt_steps": opt_steps})

    def supervisor(name: str, resume: bool = False) -> Supervisor:
        return Supervisor(name, "local", run_dir, lambda attempt: [spec], resume=resume)

    assert not supervisor("s1").learner_resumes(), "no checkpoint at all"
    save(10)  # an older run's checkpoint, there before this supervisor started
    older = supervisor("s2")
    assert not older.learner_resumes() and "--resume" not in older._argv(learner), \
        "a restarted learner would resume from a checkpoint this run did not write"
    assert supervisor("s3", resume=True).learner_resumes(), "--resume takes the checkpoint that is there"
    save(20)  # this run's learner saved
    assert older.learner_resumes() and older._argv(learner)[-1] == "--resume"


@pytest.mark.slow
def test_a_role_that_exits_before_the_stop_is_recorded_as_stopped(tmp_path: Path) -> None:
    """Inside a Slurm step every role gets the scheduler's TERM too, and may exit before the launcher
    looks again: its exit must still be recorded (it once stayed "running" in the status file)."""
    quick = RoleSpec("actor-0", "actor", [sys.executable, "-c", "pass"])
    slow = RoleSpec("actor-1", "actor", [sys.executable, "-c", "import time; time.sleep(60)"])
    sup = Supervisor("host-x", "host", tmp_path / "run", lambda attempt: [quick, slow], anchor="actors")
    sup._launch(sup.plan(1), first=True)
    sup.roles["actor-0"].proc.wait(timeout=60)  # type: ignore[union-attr]
    assert sup.roles["actor-0"].state == "running"  # exited, not yet looked at
    with StopFlag.launcher() as stop:
        sup._stop_all(stop, external=False)
    sup.write_status()
    roles = supervisor_file(tmp_path / "run", "host-x")["roles"]
    assert roles["actor-0"]["state"] == "stopped" and roles["actor-0"]["last_exit"] == 0, roles["actor-0"]
    assert roles["actor-1"]["state"] == "failed" and roles["actor-1"]["last_exit"] == -signal.SIGTERM, roles


@pytest.mark.slow
def test_a_role_with_start_after_waits_for_its_file(tmp_path: Path) -> None:
    """The evaluator waits for the learner's first update: a role with ``start_after`` starts only
    once this launch has written that file (an older copy does not count), others at once."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    marker = run_dir / "first_update.json"
    marker.write_text("{}")
    os.utime(marker, (time.time() - 3600, time.time() - 3600))  # left by an earlier run
    now = RoleSpec("actor-0", "actor", [sys.executable, "-c", "import time; time.sleep(60)"])
    later = RoleSpec("evaluator", "evaluator", [sys.executable, "-c", "import time; time.sleep(60)"],
                     start_after="first_update.json")
    sup = Supervisor("local", "local", run_dir, lambda attempt: [now, later])
    try:
        sup._launch(sup.plan(1), first=True)
        assert sup.roles["actor-0"].alive() and sup.roles["evaluator"].proc is None
        sup._start_pending(time.monotonic())
        assert sup.roles["evaluator"].state == "pending", "an earlier run's file started it"
        assert supervisor_file(run_dir)["roles"]["evaluator"]["state"] == "pending"
        marker.write_text("{}")  # this launch's learner did its first update
        sup._start_pending(time.monotonic())
        assert sup.roles["evaluator"].alive() and sup.roles["evaluator"].starts == 1
        sup._start_pending(time.monotonic())
        assert sup.roles["evaluator"].starts == 1, "started twice"
    finally:
        with StopFlag.launcher() as stop:
            sup._stop_all(stop, external=False)
    assert {r.state for r in sup.roles.values()} == {"failed"}  # both were still running: TERM ended them


@pytest.mark.slow
def test_a_role_waiting_too_long_for_start_after_starts_anyway(tmp_path: Path) -> None:
    later = RoleSpec("evaluator", "evaluator", [sys.executable, "-c", "pass"], start_after="never.json")
    sup = Supervisor("local", "local", tmp_path / "run", lambda attempt: [later])
    sup._launch(sup.plan(1), first=True)
    sup._start_pending(time.monotonic() + START_AFTER_MAX_S - 1)
    assert sup.roles["evaluator"].proc is None
    sup._start_pending(time.monotonic() + START_AFTER_MAX_S)
    assert sup.roles["evaluator"].proc is not None
    assert sup.roles["evaluator"].proc.wait(timeout=60) == 0


@pytest.mark.skipif(sys.version_info < (3, 11), reason="PYTHONSAFEPATH is new in Python 3.11")
@pytest.mark.slow
def test_roles_run_the_launchers_zmqrl_not_one_in_the_working_directory(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m`` looks in the working directory first: a ``zmqrl/`` there (another checkout)
    must not be what a launcher's roles run."""
    decoy = tmp_path / "zmqrl"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise SystemExit(97)\n")
    monkeypatch.chdir(tmp_path)
    argv = zmqrl_command("config", [])
    role = Role(RoleSpec("config", "config", argv), tmp_path / "config.log")
    role.start(argv, append=False)
    assert role.proc is not None and role.proc.wait(timeout=120) == 0, log_tail(tmp_path / "config.log")
    assert "run:  # What this run is and where it writes." in (tmp_path / "config.log").read_text()
    # the control: the same command without the guard runs the decoy
    env = launcher_role_env()
    del env["PYTHONSAFEPATH"]
    assert subprocess.run(argv, env=env, capture_output=True, timeout=120).returncode == 97
    monkeypatch.chdir(Path(checkpoint.__file__).parents[2])  # a launcher run from its own checkout
    assert "PYTHONSAFEPATH" not in launcher_role_env()


# --------------------------------------------------------------------------------------------------
# zmqrl head and two zmqrl host on loopback: unique ids, status table, the learner killed and resumed


def _hostname() -> str:
    return socket.gethostname()


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_head_and_two_hosts(tmp_path: Path, procs: Procs) -> None:
    run_dir = tmp_path / "run"
    procs.sweep_args.append(str(run_dir))
    ports = {k: free_port() for k in ("data", "model", "eval")}
    overrides = [*FAST, "trainer.max_opts=100000000", "trainer.eval_interval=300", "trainer.eval_episodes=2",
                 "actor.num_actors=3", f"net.data_port={ports['data']}", f"net.model_port={ports['model']}",
                 f"net.eval_port={ports['eval']}", f"net.snapshot_port={free_port()}"]

    # Ids must stay below actor.num_actors: refused before anything starts.
    bad = procs.start("bad", zmqrl_argv("host", "--learner", "127.0.0.1", "--actors", "2", "--first-id", "2",
                                        "--run-dir", str(run_dir), overrides=overrides))
    assert bad.wait(timeout=60) == 2, bad.tail()
    assert "actor ids 2..3 must be below actor.num_actors=3" in bad.text(), bad.text()

    head = procs.start("head", zmqrl_argv("head", "--run-dir", str(run_dir), overrides=overrides))
    procs.start("host-a", zmqrl_argv("host", "--learner", "127.0.0.1", "--actors", "2", "--name", "a",
                                     "--run-dir", str(run_dir), overrides=overrides))
    procs.start("host-b", zmqrl_argv("host", "--learner", "tcp://127.0.0.1", "--actors", "1", "--first-id", "2",
                                     "--name", "b", "--run-dir", str(run_dir), overrides=overrides))

    def all_acting() -> bool:
        s = summary(run_dir)
        actors, proxies = s.get("actors") or {}, s.get("proxies") or {}
        return all(actors.get(f"actor-{i}", {}).get("batches") for i in range(3)) and \
            {"proxy-a", "proxy-b"} <= set(proxies)

    wait_for(all_acting, 120, "batches from actors 0, 1 (host a) and 2 (host b) and both proxies' reports at the "
             "learner", lambda: diag(procs, run_dir))

    # The learner dies once it has a checkpoint: zmqrl head restarts it with --resume; the hosts' actors
    # carry on and their batches reach the new learner.
    at = wait_for(lambda: latest_opt_steps(run_dir) >= 100 and latest_opt_steps(run_dir), 120,
                  "checkpoints/latest at 100+ opt steps", lambda: diag(procs, run_dir))
    learner_pid = running_pid(run_dir, "learner", "head")
    assert learner_pid is not None, supervisor_file(run_dir, "head")
    os.kill(learner_pid, signal.SIGKILL)
    log = run_dir / "logs" / "learner.log"
    wait_for(lambda: RESUMED.search(log.read_text()), 90, "the learner to resume", lambda: diag(procs, run_dir))
    resumed = [int(n) for n in RESUMED.findall(log.read_text())]
    assert len(resumed) == 1 and resumed[0] >= at, resumed
    wait_for(lambda: summary(run_dir).get("opt_steps", 0) > resumed[0] and all_acting() and summary(run_dir)["evals"],
             90, "batches from every actor and an evaluation at the resumed learner", lambda: diag(procs, run_dir))
    assert role_entry(run_dir, "learner", "head")["restarts"] == 1, supervisor_file(run_dir, "head")

    # zmqrl status: one row per role, hosts and restarts from the launchers' files.
    status = subprocess.run(cli("status", str(run_dir)), capture_output=True, text=True, timeout=60, env=role_env(),
                            cwd=REPO)
    assert status.returncode == 0, status.stderr
    rows = {line.split()[0]: line.split() for line in status.stdout.splitlines()[1:]
            if line.split() and line.split()[0] in ("learner", "evaluator", "proxy-a", "proxy-b", "actor-0",
                                                    "actor-1", "actor-2")}
    assert sorted(rows) == ["actor-0", "actor-1", "actor-2", "evaluator", "learner", "proxy-a", "proxy-b"], \
        status.stdout
    assert rows["learner"][4] == "running" and rows["learner"][-1] == "1", rows["learner"]  # one restart
    for i in range(3):
        row = rows[f"actor-{i}"]
        assert row[1] == _hostname() and row[2] == str(i), row  # host from the host launcher's status file
        assert re.fullmatch(r"[0-9a-f]{8}", row[3]) and row[4] == "running" and int(row[6]) > 0, row
        assert row[-1] == "0", row  # no restarts
    assert "launcher host-a" in status.stdout and "launcher head" in status.stdout, status.stdout

    # --watch redraws until interrupted, then exits 0.
    watch = procs.start("watch", cli("status", str(run_dir), "--watch", "--interval", "0.5"))
    wait_for(lambda: watch.text().count("actor-2") >= 2, 60, "two refreshes of zmqrl status --watch", watch.tail)
    watch.signal(signal.SIGINT)
    assert watch.wait(timeout=30) == 0, watch.tail()

    # A host whose actors have all finished (exit 0, as when the learner tells them to) ends with exit 0.
    os.kill(running_pid(run_dir, "actor-2", "host-b") or 0, signal.SIGTERM)
    assert procs["host-b"].wait(timeout=60) == 0, procs.describe(names=["host-b"])
    host_b = supervisor_file(run_dir, "host-b")
    assert host_b["reason"] == "every actor finished" and host_b["restarts_total"] == 0, host_b
    assert host_b["roles"]["actor-2"]["state"] == "finished" and host_b["roles"]["proxy-b"]["state"] == "stopped"

    # SIGTERM stops the head cleanly (the learner saves and says the run is over): host a's actors finish
    # and host a ends with exit 0 on its own. `zmqrl head --resume` continues the run from its directory
    # (CONFIG defaults to the saved config.yaml) and a host started again joins it.
    head.signal(signal.SIGTERM)
    assert head.wait(timeout=60) == 0, diag(procs, run_dir)
    stopped = summary(run_dir)
    assert stopped.get("stop_reason") == "stopped by SIGTERM", stopped
    assert procs["host-a"].wait(timeout=60) == 0, procs.describe(names=["host-a"])
    host_a = supervisor_file(run_dir, "host-a")
    assert host_a["reason"] == "every actor finished" and host_a["restarts_total"] == 0, host_a
    again = procs.start("head-again", cli("head", "--run-dir", str(run_dir), "--resume"))
    procs.start("host-a-again", zmqrl_argv("host", "--learner", "127.0.0.1", "--actors", "2", "--name", "a",
                                           "--run-dir", str(run_dir), overrides=overrides))
    wait_for(lambda: len(RESUMED.findall(log.read_text())) == 2, 90, "the learner under zmqrl head --resume to resume",
             lambda: diag(procs, run_dir))
    assert int(RESUMED.findall(log.read_text())[-1]) == stopped["opt_steps"], (RESUMED.findall(log.read_text()),
                                                                             stopped["opt_steps"])
    wait_for(lambda: all((summary(run_dir).get("actors") or {}).get(f"actor-{i}", {}).get("batches") for i in (0, 1))
             and summary(run_dir).get("opt_steps", 0) > stopped["opt_steps"], 90,
             "host a's actors' batches at the resumed learner", lambda: diag(procs, run_dir))
    again.signal(signal.SIGTERM)
    assert again.wait(timeout=60) == 0, diag(procs, run_dir)
    assert procs["host-a-again"].wait(timeout=60) == 0, procs.describe(names=["host-a-again"])
    assert not pids_with_arg(str(run_dir)), "processes of the run are still alive"


# --------------------------------------------------------------------------------------------------
# zmqrl status on what is not (yet) a run


@pytest.mark.slow
def test_status_errors_and_an_empty_run(tmp_path: Path) -> None:
    def status(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(cli("status", str(path)), capture_output=True, text=True, timeout=60, env=role_env(),
                              cwd=REPO)

    missing = status(tmp_path / "nope")
    assert missing.returncode == 2 and "no such directory" in missing.stderr, missing
    (tmp_path / "plain").mkdir()
    plain = status(tmp_path / "plain")
    assert plain.returncode == 2 and "is not a run directory" in plain.stderr, plain
    run = tmp_path / "run"
    run.mkdir()
    dump(load(CONFIG, ["trainer.max_opts=777"]), run / "config.yaml")
    fresh = status(run)
    assert fresh.returncode == 0, fresh.stderr
    assert "no summary.json yet" in fresh.stdout, fresh.stdout
    learner = next(line for line in fresh.stdout.splitlines() if line.startswith("learner"))
    assert learner.split()[1:] == ["-"] * 10, learner
