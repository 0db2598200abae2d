"""What every bench group shares: rows and their verdicts, settings, process control, helper processes.

Group modules (:mod:`zmqrl.bench.replay`, :mod:`zmqrl.bench.actor`, ...) import this module;
it imports none of them and names no algorithm: each group picks its own configs.

Processes are started as the launchers' :class:`~zmqrl.roles.launch.supervisor.Role` (own session,
one thread, a log file, SIGTERM should the bench die) and stopped with its staged stop;
results come back through :func:`zmqrl.run.rundir.write_json_atomic` and
:func:`zmqrl.run.rundir.read_json`. Helper processes are ``python -c`` children running
:func:`child_main`, which calls a function named ``module:name`` of a group module; they import
numpy, pyzmq, the config and :mod:`zmqrl.wire` (torch only where a policy is needed), so they
start in well under a second.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zmqrl.bench.procfs import kill_pids, pids_with_arg
from zmqrl.roles.addresses import free_port
from zmqrl.roles.launch.processes import Role, RoleSpec, stop_roles
from zmqrl.run.lifecycle import StopFlag
from zmqrl.run.rundir import read_json, write_json_atomic

if TYPE_CHECKING:
    import numpy as np
    import zmq

    from zmqrl.config import Config

REPO = Path(__file__).resolve().parent.parent.parent
CONFIGS = REPO / "configs"
HOST = "127.0.0.1"


class BenchError(RuntimeError):
    """A measurement could not be taken (a process died, a deadline passed)."""


# ------------------------------------------------------------------------------------- rows


@dataclass
class Row:
    """One line of the table (and one object of the JSON list)."""

    name: str
    measured: float | None
    baseline: float | None
    ratio: float | None  # measured / baseline, or baseline / measured for rows whose goal is an upper bound
    goal: str | None  # a condition on ``ratio``, e.g. ">= 0.9"; None where there is no goal
    met: bool | None  # None where there is no goal or nothing was measured
    unit: str = ""
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def make_row(name: str, measured: float | None, baseline: float | None, unit: str, note: str,
             goal: tuple[str, float] | None = None, inverse: bool = False, complete: bool = True) -> Row:
    """A row whose ratio and verdict follow from its own two figures and nothing else.

    ``ratio`` is ``measured / baseline`` (``baseline / measured`` with ``inverse``, for rows whose
    baseline is an absolute goal such as 5 ms), computed from the figures as stored (5 significant
    digits), so anyone can recompute it from the JSON. ``goal`` = (">=" or "<=", value) on the
    ratio; ``met`` is that comparison. ``complete=False`` says a figure is only a bound (a run hit
    its cap): such a row is never met, whatever its ratio.
    """
    measured, baseline = _clean(measured), _clean(baseline)
    ratio = None
    if measured is not None and baseline is not None and measured > 0 and baseline > 0:
        ratio = _clean(baseline / measured if inverse else measured / baseline)
    row = Row(name, measured, baseline, ratio, None, None, unit, note)
    if goal is not None:
        op, value = goal
        if op not in (">=", "<="):
            raise ValueError(f"goal operator must be >= or <=, got {op!r}")
        row.goal = f"{op} {value:g}"
        if ratio is not None:
            row.met = complete and (ratio >= value if op == ">=" else ratio <= value)
    return row


def skipped_row(name: str, unit: str, reason: str, goal: tuple[str, float] | None = None) -> Row:
    """A row that was not measured (``met`` stays None)."""
    return make_row(name, None, None, unit, f"skipped: {reason}", goal)


def error_row(name: str, exc: BaseException, work: Path) -> Row:
    """The one row of a group that failed: ``met`` False and the error in the note."""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return Row(name, None, None, None, None, False, "", f"error: {type(exc).__name__}: {first} (logs kept in {work})")


def _clean(value: float | None) -> float | None:
    """Plain floats rounded to 5 significant digits (JSON-friendly); None for missing or non-finite."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{float(value):.5g}")


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def calls_per_second(step: Any, seconds: float) -> float:
    """Calls of ``step`` per second over about ``seconds`` (after two warm-up calls)."""
    step()
    step()
    n, start = 0, time.perf_counter()
    while True:
        step()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and n >= 3:
            return n / elapsed


# ------------------------------------------------------------------------------------- settings


@dataclass
class Settings:
    """Durations and counts of one suite run; see :meth:`preset`."""

    mode: str = "full"
    reps: int = 2  # alternations of measured and baseline in the transport and learner rows
    actor_reps: int = 6  # actor rows: alternations of bare loop and real actor
    actor_s: float = 1.5  # seconds per actor measurement
    small_messages: int = 20_000  # transport: messages of 1024 small transitions (4 float32 obs)
    large_messages: int = 400  # transport: messages of 64 transitions of 4x84x84 uint8 frames
    paced_s: float = 4.0  # transport: seconds one actor sends paced batches through each proxy setting
    learner_s: float = 8.0  # seconds of optimisation per learner measurement window
    settle_s: float = 2.0  # seconds before a learner window opens (senders connected, loop running)
    publishes: int = 50  # model broadcasts per model size
    publish_gap_s: float = 0.1  # seconds between 1 MB broadcasts (10 MB: twice that)
    scaling: tuple[int, ...] = (1, 2, 4)  # actor counts; the first is the baseline
    scaling_window_s: float = 10.0  # seconds between the learner summaries compared
    startup_reps: int = 5
    seeds: int = 5  # solve: seeds 0..seeds-1
    solve_budget_s: float = 600.0  # wall-clock budget of the capped ``zmqrl local``/``train`` runs of one config
    actor_rate: float = 0.0  # learner row: transitions/s per simulated actor; 0 = the group's default
    fanin: tuple[int, ...] = (64, 256)  # fanin rows: connected senders, one learner run each
    fanin_window_s: float = 4.0  # fanin: seconds per measured window (idle, each offered rate): summaries 2 s apart
    fanin_refine: int = 2  # fanin: bisection steps between the last offered rate kept and the first not kept
    intake_batches: int = 1000  # fanin: batches per timed pass of the learner's intake (5 passes)
    sb3: bool = False
    sb3_python: str = ""
    config: Path | None = None  # --config: measure with this config instead of each group's own
    keep: Path | None = None  # keep run directories and logs here

    @classmethod
    def preset(cls, mode: str, **overrides: Any) -> Settings:
        """``full`` (the longest), ``quick`` (a few minutes) or ``smoke`` (plumbing only, figures meaningless)."""
        if mode == "quick":
            base = cls(mode="quick", reps=1, actor_reps=2, actor_s=1.5, small_messages=5000, large_messages=100,
                       paced_s=2.0, learner_s=4.0, settle_s=1.5, publishes=20, scaling_window_s=5.0, startup_reps=1,
                       seeds=1, solve_budget_s=60.0, fanin_window_s=2.0, fanin_refine=1, intake_batches=500)
        elif mode == "smoke":
            base = cls(mode="smoke", reps=1, actor_reps=1, actor_s=0.5, small_messages=300, large_messages=20,
                       paced_s=0.5, learner_s=1.0, settle_s=1.0, publishes=5, publish_gap_s=0.05, scaling=(1,),
                       scaling_window_s=0.0, startup_reps=1, seeds=1, solve_budget_s=14.0, fanin=(8,),
                       fanin_window_s=1.0, fanin_refine=0, intake_batches=100)
        elif mode == "full":
            base = cls()
        else:
            raise ValueError(f"unknown bench mode {mode!r}")
        return dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})


@dataclass
class Context:
    """What the groups of one run share: settings, a work directory, figures measured so far."""

    settings: Settings
    work: Path
    measured: dict[str, float] = field(default_factory=dict)

    @property
    def logs(self) -> Path:
        path = self.work / "logs"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def path(self, name: str) -> Path:
        return self.work / name

    def configs(self, *names: str) -> list[Path]:
        """The group's own config files (names under ``configs/``), or ``--config`` alone when given."""
        if self.settings.config is not None:
            return [self.settings.config]
        return [CONFIGS / name for name in names]


def load_config(path: str | Path, *overrides: str) -> Config:
    """``path`` with seed 0 and ``overrides`` (``KEY=VALUE``) applied."""
    from zmqrl import config as config_mod

    return config_mod.load(path, ["run.seed=0", *overrides])


def free_addr() -> str:
    """``tcp://127.0.0.1:PORT`` on a port :func:`~zmqrl.roles.addresses.free_port` hands out."""
    return f"tcp://{HOST}:{free_port(HOST)}"


# ------------------------------------------------------------------------------------- processes


def zmqrl_argv(*args: str) -> list[str]:
    """``python -m zmqrl.cli ARGS...`` with this interpreter (as the local launcher starts roles)."""
    return [sys.executable, "-m", "zmqrl.cli", *args]


_BOOT = "import sys; from zmqrl.bench.harness import child_main; sys.exit(child_main(sys.argv[1:]))"


class Proc(Role):
    """One process a measurement started: a launcher :class:`Role` (own session, one thread, a log
    file, SIGTERM should this process die) with bounded waits."""

    def __init__(self, name: str, argv: list[str], log_dir: Path) -> None:
        super().__init__(RoleSpec(name, name.split("-", 1)[0], argv), log_dir / f"{name}.log")
        self.start(argv, append=False)
        self.started = time.monotonic()

    @property
    def popen(self) -> subprocess.Popen:
        assert self.proc is not None
        return self.proc

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()  # type: ignore[no-any-return]

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if still running after ``timeout`` seconds."""
        try:
            return self.popen.wait(timeout=max(0.0, timeout))  # type: ignore[no-any-return]
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace_s: float = 5.0) -> int:
        """SIGTERM, up to ``grace_s`` to exit, then SIGKILL (the launcher's stop); returns the exit code."""
        stop_roles([self], grace_s)
        return self.popen.wait()  # type: ignore[no-any-return]

    def failure(self, what: str) -> BenchError:
        return BenchError(f"{what} ({self.name}, exit code {self.returncode}, log {self.log_path}):\n{self.tail(15)}")


class Procs:
    """The processes of one measurement; leaving the ``with`` block stops every one of them."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[Proc] = []
        self.sweep_args: list[str] = []  # afterwards, stop leftovers whose command line holds one of these

    def __enter__(self) -> Procs:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop_all()

    def start(self, name: str, argv: list[str]) -> Proc:
        proc = Proc(name, argv, self.log_dir)
        self.procs.append(proc)
        return proc

    def child(self, name: str, func: Callable[[dict[str, Any], StopFlag], dict[str, Any]],
              params: dict[str, Any]) -> Proc:
        """A helper process that runs ``func(params, stop)`` (a module-level function) and writes its
        result to ``params["out"]``."""
        target = f"{func.__module__}:{func.__qualname__}"
        return self.start(name, [sys.executable, "-c", _BOOT, target, json.dumps(params)])

    def stop_all(self, grace_s: float = 10.0) -> None:
        """Stop every process (the launcher's staged stop), then any leftover named by ``sweep_args``."""
        stop_roles([p for p in self.procs if p.proc is not None], grace_s)
        for arg in self.sweep_args:
            kill_pids(pids_with_arg(arg))


def wait_launcher(proc: Proc, timeout_s: float) -> int:
    """The exit code of a launcher (``zmqrl local``/``train``), stopping it after ``timeout_s``."""
    code = proc.wait(timeout_s)
    return proc.stop(15.0) if code is None else code


def timed_launcher(c: Context, name: str, argv: list[str], run_dir: Path,
                   timeout_s: float) -> tuple[float, dict[str, Any]]:
    """Run a launcher (``zmqrl local``/``train``) writing to ``run_dir``, stopped after ``timeout_s``: its wall
    time from launch to exit and its ``summary.json`` (a failure naming the exit code where there is none)."""
    with Procs(c.logs) as procs:
        procs.sweep_args.append(str(run_dir))
        start = time.monotonic()
        proc = procs.start(name, argv)
        code = wait_launcher(proc, timeout_s)
        wall = time.monotonic() - start
    summary = read_json(run_dir / "summary.json")
    if summary is None:
        raise proc.failure(f"zmqrl {argv[3]} exited with code {code} and no summary.json")  # (argv: zmqrl_argv's)
    return wall, summary


def child_result(proc: Proc, out: Path, timeout_s: float) -> dict[str, Any]:
    """Wait for a helper to exit and return what it wrote to ``out``."""
    code = proc.wait(timeout_s)
    if code is None:
        proc.stop()
        raise proc.failure(f"no result within {timeout_s:.0f}s")
    result = read_json(out)
    if code != 0 or result is None:
        raise proc.failure("helper failed")
    return result


def child_main(argv: list[str]) -> int:
    """Entry point of a helper process: ``MODULE:FUNCTION JSON_PARAMS``; writes the result to ``params["out"]``.

    SIGTERM sets the stop flag the function is given (a second one interrupts it).
    """
    target, params = argv[0], json.loads(argv[1])
    module, _, name = target.partition(":")
    func = getattr(importlib.import_module(module), name)
    with StopFlag() as stop:
        result = func(params, stop)
    write_json_atomic(Path(params["out"]), result)
    return 0


def child_config(params: dict[str, Any]) -> Config:
    """The config a helper was handed (``params["config"]`` and ``params.get("overrides")``)."""
    return load_config(params["config"], *params.get("overrides", []))


# ------------------------------------------------------------------------------------- sockets


def await_subscriber(pub: zmq.Socket, timeout_s: float) -> None:
    """Block until an XPUB socket sees a subscription (the subscriber is connected)."""
    import zmq

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pub.poll(100, zmq.POLLIN):
            event = pub.recv()
            if event and event[0] == 1:
                return
    raise BenchError(f"no subscriber connected within {timeout_s:.0f}s")


# ------------------------------------------------------------------------------------- arrays


def save_arrays(path: Path, arrays: dict[str, Any]) -> Path:
    """Named arrays as an ``.npz`` a helper process reads back with ``allow_pickle=False``."""
    import numpy as np

    with open(path, "wb") as fh:
        np.savez(fh, **arrays)  # type: ignore[arg-type]
    return path


def load_arrays(path: str | Path) -> dict[str, np.ndarray]:
    import numpy as np

    with np.load(path, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}
