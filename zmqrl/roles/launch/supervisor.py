"""Supervision of role processes: start them, restart one that dies, stop them all cleanly.

``zmqrl local``, ``zmqrl head`` and ``zmqrl host`` each run a :class:`Supervisor` over their roles.
Each role runs as ``python -m zmqrl.cli ROLE ...`` in its own process session, its output in
``RUN_DIR/logs/NAME.log`` (appended to across restarts), and asks the kernel to SIGTERM it should
the launcher die, so none is orphaned. What a role's exit means:

- **0**: it finished (the learner told it to, or it was asked to stop). The learner's exit 0 ends
  the run; a ``zmqrl host`` ends once all its actors have finished. Any other role that exits 0
  while its launcher goes on for :data:`FINISH_GRACE_S` more is started again.
- **2**: bad config or input. Started again it would fail the same way, so the launcher stops
  every role and exits 2, showing the tail of that role's log.
- **98** (:data:`EXIT_ADDRESS_IN_USE`): a port was taken when the role bound it. The launcher stops
  every role and starts them all again on new ports (its plan decides which), at most
  :data:`BIND_ATTEMPTS` launches in all.
- **anything else** (a crash, a signal): started again after a back-off that doubles from
  :data:`BACKOFF_BASE_S` to :data:`BACKOFF_MAX_S` (and resets once a role has run
  :data:`BACKOFF_RESET_S`), at most ``max_restarts`` times per role; the learner comes back with
  ``--resume`` from ``checkpoints/latest`` once this run has written one (fresh before that). With
  ``fail_fast`` the first such exit (or an exit 0 that would be restarted) ends the run instead.

Every start, exit and restart is logged and counted in ``RUN_DIR/supervisor/NAME.json`` (see
:meth:`Supervisor.status` for its fields), which ``zmqrl status`` reads.

SIGINT or SIGTERM stops every role: actors first, then proxies, then the rest, so queued batches
land; roles still running after the grace period are killed. Inside a Slurm step the scheduler
delivers its signal to every process of the step itself, so the launcher does not send its roles
a second one (a role takes a second signal as "stop now", skipping its final checkpoint).
A second signal to the launcher passes SIGTERM on to every role at once; a third kills them.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zmqrl.roles.addresses import EXIT_ADDRESS_IN_USE
from zmqrl.roles.launch.processes import Role, RoleSpec, signals_reach_roles, stop_in_stages
from zmqrl.run import checkpoint
from zmqrl.run.lifecycle import StopFlag
from zmqrl.run.record import Progress
from zmqrl.run.rundir import RunDir, read_json, write_json_atomic

log = logging.getLogger("zmqrl")

EXIT_BAD_INPUT = 2  # a role's config or input is bad: never restarted
MAX_RESTARTS = 10  # default cap on one role's restarts over a whole run (--max-restarts)
BIND_ATTEMPTS = 3  # launches on fresh ports when a role finds its port taken
BACKOFF_BASE_S = 0.5  # first restart delay; doubles with each restart in a row
BACKOFF_MAX_S = 30.0  # longest restart delay
BACKOFF_RESET_S = 60.0  # a role that ran this long before exiting restarts after BACKOFF_BASE_S again
FINISH_GRACE_S = 10.0  # a role that exited 0 is started again if its launcher is still running after this
STATUS_INTERVAL_S = 2.0  # RUN_DIR/supervisor/NAME.json is rewritten at least this often
START_AFTER_MAX_S = 30.0  # a role waiting for its start_after file starts anyway after this long
@dataclass
class Outcome:
    """How a supervised launch ended: the exit code, and the role that could not bind (None otherwise)."""

    code: int
    reason: str
    unbound: str | None = None



class Supervisor:
    """Runs the roles ``plan`` returns, restarting them by the rules in the module docstring.

    ``plan(attempt)`` gives the roles of launch ``attempt`` (1, 2, ... on fresh ports). ``name`` is the
    launcher's (``local``, ``head`` or a host's), used for its status file and log lines; ``anchor``
    says what ends the launch: ``"learner"`` (its exit 0) or ``"actors"`` (all of them exited 0).
    """

    def __init__(self, name: str, launcher: str, run_dir: Path, plan: Callable[[int], list[RoleSpec]], *,
                 anchor: str = "learner", max_restarts: int = MAX_RESTARTS, fail_fast: bool = False,
                 resume: bool = False, grace_s: float = 4.5, progress_total: int = 0) -> None:
        if max_restarts < 0:
            raise ValueError("max_restarts must be >= 0")
        self.name, self.launcher, self.dir, self.plan = name, launcher, run_dir, plan
        self.anchor, self.max_restarts, self.fail_fast, self.resume = anchor, max_restarts, fail_fast, resume
        self.grace_s = grace_s
        self.log_dir = RunDir(run_dir).logs
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.status_path = RunDir(run_dir).supervisor_status(name)
        self.status_path.parent.mkdir(parents=True, exist_ok=True)
        self.roles: dict[str, Role] = {}
        self.started = time.time()
        self.state = "starting"
        self.reason = ""
        self.attempt = 0
        self._latest_at_start = self._latest_signature()
        self._progress = Progress(progress_total) if progress_total else None  # from the learner's summary.json
        self._status_due = 0.0
        self._history_limit = 50
        self._launched = (time.time(), time.monotonic())  # this launch's start (wall, monotonic)
        self._append_logs = resume

    # --- the learner's checkpoint -----------------------------------------------------------
    def _latest_signature(self) -> tuple[int, int] | None:
        """(inode, mtime) of ``checkpoints/latest``'s state file, or None when there is none."""
        try:
            state = checkpoint.resolve(RunDir(self.dir).latest) / checkpoint.STATE_FILE
            st = state.stat()
        except (checkpoint.CheckpointError, OSError):
            return None
        return st.st_ino, st.st_mtime_ns

    def learner_resumes(self) -> bool:
        """Whether a learner started now resumes: asked to, or this run has written a checkpoint since."""
        signature = self._latest_signature()
        return signature is not None and (self.resume or signature != self._latest_at_start)

    def _argv(self, role: Role) -> list[str]:
        argv = list(role.spec.argv)
        if role.kind == "learner" and self.learner_resumes() and "--resume" not in argv:
            argv.append("--resume")
        return argv

    # --- the loop ----------------------------------------------------------------------------
    def run(self, stop: StopFlag) -> Outcome:
        """Launch (again on fresh ports after a failed bind) until the run ends or ``stop``; returns how it ended."""
        outcome = Outcome(0, "stopped")
        try:
            for attempt in range(1, BIND_ATTEMPTS + 1):
                self.attempt = attempt
                self._launch(self.plan(attempt), first=attempt == 1)
                outcome = self._watch(stop)
                self._stop_all(stop, external=stop.set)
                if outcome.unbound is None or stop.set:
                    break
                if attempt < BIND_ATTEMPTS:
                    log.warning("%s: %s found its port taken by another process (attempt %d of %d); starting every "
                                "role again on new ports", self.name, outcome.unbound, attempt, BIND_ATTEMPTS)
        finally:
            if self._progress is not None:
                self._progress.close()
            for role in self.roles.values():
                if role.alive():  # only after an exception: kill what is left rather than orphan it
                    role.proc.kill()  # type: ignore[union-attr]
                    role.proc.wait()  # type: ignore[union-attr]
                role.close_log()
            self.state = "finished" if outcome.code == 0 else "failed"
            self.reason = outcome.reason
            self.write_status()
        return outcome

    def _launch(self, specs: list[RoleSpec], first: bool) -> None:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"role names are not unique: {names}")
        self._launched = (time.time(), time.monotonic())
        self._append_logs = self.resume or not first
        for spec in specs:
            role = self.roles.get(spec.name)
            if role is None:
                role = self.roles[spec.name] = Role(spec, self.log_dir / f"{spec.name}.log")
            role.spec = spec
            role.state = "pending"
            if not spec.start_after:
                self._first_start(role)
        self.state = "running"
        self.write_status()

    def _first_start(self, role: Role) -> None:
        role.start(self._argv(role), append=self._append_logs or role.starts > 0)

    def _start_pending(self, now: float) -> None:
        """Start the roles of this launch that waited for their ``start_after`` file (or long enough)."""
        launched_wall, launched = self._launched
        for role in self.roles.values():
            if role.state != "pending":
                continue
            try:
                written = (self.dir / role.spec.start_after).stat().st_mtime >= launched_wall - 1.0
            except OSError:
                written = False
            if written or now - launched >= START_AFTER_MAX_S:
                self._first_start(role)
                self.write_status()

    def _watch(self, stop: StopFlag) -> Outcome:
        """Poll the roles until the launch ends (or ``stop``); restart those that died."""
        while not stop.set:
            now = time.monotonic()
            for role in list(self.roles.values()):
                if role.state == "running" and role.proc is not None and role.proc.poll() is not None:
                    outcome = self._exited(role, role.proc.returncode, now)
                    if outcome is not None:
                        return outcome
            if self._done():
                return Outcome(0, "every actor finished" if self.anchor == "actors" else "the learner finished")
            self._start_pending(now)
            for role in self.roles.values():
                if role.state == "waiting" and now >= role.restart_at:
                    self._restart(role)
                elif role.state == "finished" and now - role.finished_at >= FINISH_GRACE_S:
                    outcome = self._exited_early(role)
                    if outcome is not None:
                        return outcome
            self._show_progress()
            if time.monotonic() >= self._status_due:
                self.write_status()
            learner = self.roles.get("learner")
            if learner is not None and learner.alive():
                try:
                    learner.proc.wait(timeout=0.2)  # type: ignore[union-attr]
                except subprocess.TimeoutExpired:
                    pass
            else:
                time.sleep(0.2)
        return Outcome(0, f"stopped by {stop.signal_name or 'a signal'}")

    def _done(self) -> bool:
        if self.anchor == "actors":
            actors = [r for r in self.roles.values() if r.kind == "actor"]
            return bool(actors) and all(r.state == "finished" for r in actors)
        return False  # the learner's exit 0 ends the launch in _exited

    def _exited(self, role: Role, code: int, now: float) -> Outcome | None:
        """Account for ``role``'s exit (in the status file too); returns the launch's outcome when this exit ends it."""
        ran_s = now - role.started_at
        role.last_exit = code
        role.history.append({"time": round(time.time(), 3), "exit": code, "ran_s": round(ran_s, 3)})
        del role.history[:-self._history_limit]
        role.close_log()
        try:
            return self._judge(role, code, now, ran_s)
        finally:
            self.write_status()

    def _judge(self, role: Role, code: int, now: float, ran_s: float) -> Outcome | None:
        """What ``role``'s exit ``code`` means (the rules in the module docstring)."""
        if code == EXIT_ADDRESS_IN_USE:
            role.state = "failed"
            log.info("%s: %s could not bind:\n%s", self.name, role.name, role.tail(3))
            return Outcome(EXIT_ADDRESS_IN_USE, f"{role.name} could not bind its port", unbound=role.name)
        if code == 0:
            role.state, role.finished_at = "finished", now
            if role.kind == "learner":
                return Outcome(0, "the learner finished")
            log.info("%s: %s finished (exit 0)", self.name, role.name)
            return None
        role.state = "failed"
        where = f"last lines of {role.log_path}:\n{role.tail()}"
        if code == EXIT_BAD_INPUT:
            log.error("%s: %s exited with code 2 (bad config or input); not restarting it, it would fail the same "
                      "way; stopping the run. %s", self.name, role.name, where)
            return Outcome(EXIT_BAD_INPUT, f"{role.name} exited with code 2 (bad config or input)")
        if self.fail_fast:
            log.error("%s: %s exited with code %s (--fail-fast: stopping the run); %s", self.name, role.name, code,
                      where)
            return Outcome(1, f"{role.name} exited with code {code}")
        if role.restarts >= self.max_restarts:
            log.error("%s: %s exited with code %s after %.1fs and was already restarted %d time(s) (--max-restarts "
                      "%d); stopping the run. %s", self.name, role.name, code, ran_s, role.restarts, self.max_restarts,
                      where)
            return Outcome(1, f"{role.name} exited with code {code}; restarts exhausted")
        if ran_s >= BACKOFF_RESET_S:  # it had been running well: this is not a crash loop
            role.in_a_row = 0
        delay = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** role.in_a_row)
        role.state, role.restart_at = "waiting", now + delay
        resume = " with --resume" if role.kind == "learner" and self.learner_resumes() else \
            " fresh (no checkpoint from this run yet)" if role.kind == "learner" else ""
        log.warning("%s: %s exited with code %s after %.1fs; restarting it%s in %.1fs (restart %d of at most %d); "
                    "last lines of %s:\n%s", self.name, role.name, code, ran_s, resume, delay, role.restarts + 1,
                    self.max_restarts, role.log_path, role.tail(8))
        return None

    def _exited_early(self, role: Role) -> Outcome | None:
        """A role that exited 0 while its launcher goes on: start it again (it counts as a restart)."""
        if self.fail_fast:
            log.error("%s: %s exited 0 %.0fs ago while the run goes on (--fail-fast: stopping the run)", self.name,
                      role.name, FINISH_GRACE_S)
            return Outcome(1, f"{role.name} exited while the run went on")
        if role.restarts >= self.max_restarts:
            log.error("%s: %s exited 0 %.0fs ago while the run goes on, and was already restarted %d time(s) "
                      "(--max-restarts %d); stopping the run", self.name, role.name, FINISH_GRACE_S, role.restarts,
                      self.max_restarts)
            return Outcome(1, f"{role.name} exited while the run went on; restarts exhausted")
        log.warning("%s: %s exited 0 but the run goes on; starting it again (restart %d of at most %d)", self.name,
                    role.name, role.restarts + 1, self.max_restarts)
        self._restart(role)
        return None

    def _restart(self, role: Role) -> None:
        role.restarts += 1
        role.in_a_row += 1
        role.history[-1]["restarted"] = True
        argv = self._argv(role)
        role.start(argv, append=True)
        log.info("%s: restarted %s (pid %d%s)", self.name, role.name, role.proc.pid,  # type: ignore[union-attr]
                 ", --resume" if "--resume" in argv and role.kind == "learner" else "")
        self.write_status()

    def restarts_total(self) -> int:
        return sum(r.restarts for r in self.roles.values())

    def _show_progress(self) -> None:
        if self._progress is None:
            return
        summary = read_json(RunDir(self.dir).summary)
        if not summary:
            return
        fields = {"env": summary.get("env_steps"), "ret": summary.get("train_return_recent"),
                  "eval": summary.get("last_eval_return"), "best": summary.get("best_eval_return"),
                  "env/s": round(summary.get("env_steps_per_s") or 0),
                  "opt/s": round(summary.get("opt_steps_per_s") or 0)}
        restarts = self.restarts_total()
        if restarts:
            fields["restarts"] = restarts
        self._progress.update(int(summary.get("opt_steps") or 0), fields)

    # --- stopping ------------------------------------------------------------------------------
    def _stop_all(self, stop: StopFlag, external: bool) -> None:
        """Stop every role: actors, then proxies, then the rest; kill what is left after the grace period.

        ``external``: the launcher itself was signalled. Inside a Slurm step every role got that
        signal from the scheduler too, and is not sent another.
        """
        for role in self.roles.values():
            if role.state in ("waiting", "pending"):
                role.state = "stopped"
            elif role.state == "running" and role.proc is not None and not role.alive():
                self._stopped(role)  # exited since the last look (in a Slurm step: the scheduler's signal)
        live = [r for r in self.roles.values() if r.alive()]
        if not live:
            return
        self.state = "stopping"
        self.write_status()
        signalled = external and signals_reach_roles()
        if signalled:
            log.info("%s: every role got the scheduler's signal too; waiting up to %.0fs for them to stop",
                     self.name, self.grace_s)
        stop_in_stages(live, self.grace_s, send=not signalled, signals=lambda: stop.count, name=self.name)
        for role in live:
            self._stopped(role)

    @staticmethod
    def _stopped(role: Role) -> None:
        """Record how a role that was told to stop (or was stopping anyway) ended."""
        role.proc.wait()  # type: ignore[union-attr]
        role.last_exit = role.proc.returncode  # type: ignore[union-attr]
        role.state = "stopped" if role.last_exit == 0 else "killed" if role.last_exit == -9 else "failed"
        role.close_log()


    # --- the status file -------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """What ``RUN_DIR/supervisor/NAME.json`` holds.

        ``launcher`` (local, head or host), ``name``, ``hostname``, ``pid``, ``started`` and ``updated``
        (Unix times), ``state`` (starting, running, stopping, finished, failed), ``reason`` (how it
        ended), ``max_restarts``, ``restarts_total``, ``bind_attempts``, and ``roles``: per role name,
        ``kind``, ``pid``, ``state`` (running, waiting, finished, failed, stopped, killed), ``starts``,
        ``restarts``, ``last_exit``, ``exits`` (the last exits: ``time``, ``exit`` code, ``ran_s``,
        ``restarted``) and ``log`` (the log file, relative to the run directory).
        """
        roles = {}
        for name, role in self.roles.items():
            roles[name] = {"kind": role.kind, "pid": role.proc.pid if role.proc else None, "state": role.state,
                           "starts": role.starts, "restarts": role.restarts, "last_exit": role.last_exit,
                           "exits": role.history, "log": os.path.relpath(role.log_path, self.dir)}
        return {"launcher": self.launcher, "name": self.name, "hostname": socket.gethostname(), "pid": os.getpid(),
                "started": round(self.started, 3), "updated": round(time.time(), 3), "state": self.state,
                "reason": self.reason, "max_restarts": self.max_restarts, "restarts_total": self.restarts_total(),
                "bind_attempts": self.attempt, "roles": roles}

    def write_status(self) -> None:
        self._status_due = time.monotonic() + STATUS_INTERVAL_S
        try:
            write_json_atomic(self.status_path, self.status())
        except OSError as exc:
            log.warning("%s: could not write %s: %s", self.name, self.status_path, exc)
