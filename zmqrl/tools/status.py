"""``zmqrl status RUN_DIR [--watch]``: one table of every role of a run, from what the run writes.

The learner refreshes ``RUN_DIR/summary.json`` every ``net.stats_interval_s`` with per-actor stats
(``actors``) and per-proxy reports (``proxies``); every launcher (``zmqrl local``, ``head``, ``host``)
keeps ``RUN_DIR/supervisor/NAME.json`` with its roles' processes and restarts. The table joins
the two: a role the learner has heard from, or a launcher runs, is a row. A field that neither
holds shows as ``-``. The same command serves a run on this machine and one on a cluster (where
hosts whose run directory is not shared show only what the learner knows of them).

This module imports no torch.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import yaml

from zmqrl.config import ConfigError
from zmqrl.run.rundir import SUPERVISOR_DIR, read_json, read_status_files

COLUMNS = ("role", "host", "id", "incarnation", "state", "env steps/s", "batches", "lost", "lag (versions)",
           "last seen", "restarts")
_ACTOR = re.compile(r"^actor-(\d+)$")


def _number(value: Any) -> float | None:
    """A plain finite number a file holds (summary.json carries what peers reported), else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and -2**63 <= value <= 2**63:
        return float(value)  # (NaN fails the comparison; 10**400 never reaches float())
    return None


def _dict(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _fmt_int(value: Any) -> str:
    number = _number(value)
    return "-" if number is None else str(int(number))


def _fmt_float(value: Any, digits: int = 1) -> str:
    number = _number(value)
    return "-" if number is None else f"{number:.{digits}f}"


def _ago(when: Any, now: float) -> str:
    """``3s ago`` for a Unix time (``-`` for none)."""
    number = _number(when)
    if number is None:
        return "-"
    age = max(0.0, now - number)
    if age < 120:
        return f"{age:.0f}s ago"
    if age < 7200:
        return f"{age / 60:.0f}m ago"
    return f"{age / 3600:.1f}h ago"


def check_run_dir(run_dir: Path) -> None:
    """Raise ConfigError unless ``run_dir`` looks like a run directory (summary, config or launcher status)."""
    if not run_dir.exists():
        raise ConfigError(f"{run_dir}: no such directory")
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: not a directory")
    marks = ("summary.json", "config.yaml", SUPERVISOR_DIR)
    if not any((run_dir / mark).exists() for mark in marks):
        raise ConfigError(f"{run_dir} is not a run directory (it holds none of {', '.join(marks)})")


def _of_max_opts(run_dir: Path) -> str:
    """`` of MAX`` from the run's ``config.yaml`` (``trainer.max_opts``), or nothing."""
    try:
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
        return f" of {int(cfg['trainer']['max_opts'])}"
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        return ""


def collect(run_dir: Path, now: float | None = None) -> dict[str, Any]:
    """Everything the table shows: ``header`` lines and ``rows`` (dicts keyed by :data:`COLUMNS`)."""
    now = time.time() if now is None else now
    summary_path = run_dir / "summary.json"
    summary = read_json(summary_path) or {}
    try:
        summary_time: float | None = summary_path.stat().st_mtime
    except OSError:
        summary_time = None
    launchers = read_status_files(run_dir)
    supervised: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}  # role name -> (its entry, its launcher)
    for launcher in launchers.values():
        for name, entry in (launcher.get("roles") or {}).items():
            if isinstance(entry, dict):
                supervised[name] = (entry, launcher)

    def base(name: str, kind: str) -> dict[str, str]:
        entry, launcher = supervised.get(name, ({}, {}))
        m = _ACTOR.match(name)
        return {"role": name, "host": str(launcher.get("hostname") or "-"), "id": m.group(1) if m else "-",
                "incarnation": "-", "state": str(entry.get("state") or "-"), "env steps/s": "-", "batches": "-",
                "lost": "-", "lag (versions)": "-", "last seen": "-", "restarts": _fmt_int(entry.get("restarts")),
                "_kind": kind}

    rows: dict[str, dict[str, str]] = {}
    learner = rows["learner"] = base("learner", "learner")
    msgs, lag = _dict(summary, "messages"), _dict(summary, "policy_lag")
    if summary:
        learner.update({"env steps/s": _fmt_float(summary.get("env_steps_per_s"), 0),
                        "batches": _fmt_int(msgs.get("batches_received")), "lost": _fmt_int(msgs.get("batches_lost")),
                        "lag (versions)": _fmt_float(lag.get("mean")), "last seen": _ago(summary_time, now)})
        if summary.get("stop_reason") and learner["state"] == "-":
            learner["state"] = "finished"
    for name, stats in sorted(_dict(summary, "proxies").items()):
        if not isinstance(stats, dict):
            continue
        row = rows[name] = base(name, "proxy")
        actors = _dict(stats, "actors")
        lost = [_number(a.get("lost")) or 0 for a in actors.values() if isinstance(a, dict)]
        row.update({"incarnation": str(stats.get("incarnation") or "-")[:8],
                    "batches": _fmt_int(stats.get("forwarded")),
                    "lost": str(int(sum(lost))) if actors else "-",
                    "last seen": _ago(stats.get("last_seen", stats.get("time")), now)})
    for name, stats in _dict(summary, "actors").items():
        if not isinstance(stats, dict):
            continue
        row = rows[name] = base(name, "actor")
        row.update({"incarnation": str(stats.get("incarnation") or "-")[:8],
                    "env steps/s": _fmt_float(stats.get("env_steps_per_s"), 0),
                    "batches": _fmt_int(stats.get("batches")), "lost": _fmt_int(stats.get("lost")),
                    "lag (versions)": _fmt_float(stats.get("lag_mean")),
                    "last seen": _ago(stats.get("last_seen"), now)})
        if row["restarts"] == "-" and _number(stats.get("incarnations")):
            row["restarts"] = str(max(0, int(stats["incarnations"]) - 1))  # each restart is a new incarnation
    evals = summary["evals"] if isinstance(summary.get("evals"), list) else []
    if evals or "evaluator" in supervised:
        row = rows["evaluator"] = base("evaluator", "evaluator")
        row["batches"] = str(len(evals)) if summary else "-"
    for name, (entry, _) in supervised.items():
        if name not in rows:
            rows[name] = base(name, str(entry.get("kind") or "-"))

    order = {"learner": 0, "evaluator": 1, "proxy": 2, "actor": 3}

    def key(row: dict[str, str]) -> tuple[int, int, str]:
        m = _ACTOR.match(row["role"])
        return order.get(row["_kind"], 4), int(m.group(1)) if m else 0, row["role"]

    header = [f"run {run_dir}"]
    if summary:
        header.append(
            f"opt steps {_fmt_int(summary.get('opt_steps'))}{_of_max_opts(run_dir)}, "
            f"env steps {_fmt_int(summary.get('env_steps'))}, model version {_fmt_int(summary.get('model_version'))}, "
            f"best eval {_fmt_float(summary.get('best_eval_return'))}, "
            f"last eval {_fmt_float(summary.get('last_eval_return'))}"
            + (f"; {summary['stop_reason']}" if summary.get("stop_reason") else ""))
    elif summary_path.exists():
        header.append("summary.json is unreadable")
    else:
        header.append("no summary.json yet (the learner writes it once it runs)")
    for name, launcher in launchers.items():
        header.append(f"launcher {name} on {launcher.get('hostname', '-')}: {launcher.get('state', '-')}"
                      f"{' (' + launcher['reason'] + ')' if launcher.get('reason') else ''}, restarts "
                      f"{_fmt_int(launcher.get('restarts_total'))}, updated {_ago(launcher.get('updated'), now)}")
    return {"header": header, "rows": sorted(rows.values(), key=key)}


def render(data: dict[str, Any]) -> str:
    """The header lines and an aligned table."""
    rows = [[row[c] for c in COLUMNS] for row in data["rows"]]
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(COLUMNS)]
    numeric = {"id", "env steps/s", "batches", "lost", "lag (versions)", "restarts"}

    def line(cells: list[str]) -> str:
        return "  ".join(cell.rjust(w) if COLUMNS[i] in numeric else cell.ljust(w)
                         for i, (cell, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return "\n".join([*data["header"], "", line(list(COLUMNS)), *(line(r) for r in rows)])


def show(run_dir: str | Path, watch: bool = False, interval_s: float = 2.0, out: TextIO | None = None,
         until: Callable[[], bool] | None = None) -> int:
    """Print the table once, or (``watch``) every ``interval_s`` until interrupted; returns the exit code."""
    path = Path(run_dir)
    check_run_dir(path)
    out = out or sys.stdout
    clear = watch and out.isatty() and os.environ.get("TERM") != "dumb"
    # Ctrl-C or SIGTERM ends a watch with exit 0 (SIGINT too: a background job may start with it ignored).
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)} if watch else {}
    try:
        while True:
            text = render(collect(path))
            out.write(("\x1b[H\x1b[2J" if clear else "") + text + "\n")
            out.flush()
            if not watch or (until is not None and until()):
                return 0
            if not clear:
                out.write("\n")
            time.sleep(interval_s)
    except KeyboardInterrupt:
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
