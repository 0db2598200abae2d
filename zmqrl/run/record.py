"""Recording: TensorBoard event files, a console progress view, and the run summary."""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zmqrl.run.costs import cost_text

log = logging.getLogger("zmqrl")


def setup_logging(level: str = "info", role: str = "") -> None:
    """One log format for every role: time, role, level, message."""
    prefix = f"[{role}] " if role else ""
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format=f"%(asctime)s {prefix}%(levelname)s %(message)s", datefmt="%H:%M:%S",
                        force=True)


class Progress:
    """How far a run is toward ``total`` optimisation steps (``trainer.max_opts``).

    On a terminal: a live bar with the fraction done, env and opt steps/s, returns, the best
    evaluation and the time left; log lines are written above it while it runs. Otherwise
    (a file, a pipe, a role's log): a plain log line every ``interval_s`` with the same figures.
    """

    BAR_FORMAT = "{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} opt steps [{elapsed}<{remaining}{postfix}]"

    def __init__(self, total: int, unit: str = "opt", interval_s: float = 5.0,
                 stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.total = total
        self.interval_s = interval_s
        self._last = -math.inf
        self._first: tuple[float, int] | None = None  # (time, n) of the first update: the rate for the ETA
        self.bar: Any = None
        self._redirect: Any = None
        if getattr(self.stream, "isatty", lambda: False)():
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            sized = _columns(self.stream) > 0  # a terminal that reports no size gets a fixed width
            self.bar = tqdm(total=total, unit=unit, file=self.stream, smoothing=0.1, bar_format=self.BAR_FORMAT,
                            dynamic_ncols=sized, ncols=None if sized else 100, nrows=None if sized else 20)
            self._redirect = logging_redirect_tqdm()
            self._redirect.__enter__()  # log lines go above the bar instead of through it

    def update(self, n: int, fields: Mapping[str, Any]) -> None:
        """Move to ``n`` and show ``fields`` (a few short key/value pairs)."""
        now = time.monotonic()
        if self._first is None:
            self._first = (now, n)
            if self.bar is not None and n > 0:  # a resumed run: steps done before are not this run's rate
                self.bar.initial = self.bar.n = self.bar.last_print_n = n
                self.bar.last_print_t = self.bar.start_t = time.time()  # (tqdm's clock)
        if self.bar is not None:
            if now - self._last >= 0.5:
                self._last = now
                self.bar.set_postfix_str(" ".join(f"{k}={_fmt(v)}" for k, v in fields.items()), refresh=False)
            if n > self.bar.n:
                self.bar.update(n - self.bar.n)
            return
        if now - self._last >= self.interval_s:
            self._last = now
            text = " ".join(f"{k}={_fmt(v)}" for k, v in fields.items())
            log.info("opt %d/%d (%.0f%%)  %s  eta %s", n, self.total, 100.0 * n / max(self.total, 1), text,
                     self.eta(n, now))

    def eta(self, n: int, now: float | None = None) -> str:
        """Time left at the average rate since the first update, as ``1h02m``, ``4m05s`` or ``-``."""
        if self._first is None:
            return "-"
        t0, n0 = self._first
        elapsed = (time.monotonic() if now is None else now) - t0
        if n <= n0 or elapsed <= 0:
            return "-"
        return format_duration(max(self.total - n, 0) * elapsed / (n - n0))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None


def _columns(stream: Any) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0


def format_duration(seconds: float) -> str:
    """``3h07m``, ``4m05s``, ``12s``."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.3g}"
    return str(value)


def _eval_text(summary: Mapping[str, Any], value: float | None) -> str:
    """An evaluation return with where it happened (from ``summary["evals"]``)."""
    if value is None:
        return "-  (no evaluation)"
    entry = next((e for e in summary.get("evals", []) if e.get("return_mean") == value), None)
    if entry is None:
        return f"{value:.1f}"
    return (f"{value:.1f} ± {entry.get('return_std', 0.0):.1f} over {entry.get('episodes', '?')} episodes "
            f"(opt {entry.get('opt_steps')}, env {entry.get('env_steps')}, {entry.get('wall_s', 0.0):.1f} s)")


def run_table(summary: Mapping[str, Any], run_dir: str | Path | None = None) -> str:
    """The end-of-run table shared by ``zmqrl train``, the learner and ``zmqrl local``.

    Rows every run has (stop reason, wall time, env/opt steps and rates, best and last
    evaluation, where the loop's time went, the run directory), then, where ``summary`` is a learner's,
    the distributed ones (items inserted: transitions or sequence items; replay samples, model version,
    policy lag, batches) and a row per actor; an on-policy store's segments trained and dropped.
    """
    solved = summary.get("solved")
    rows = [("stop reason", summary.get("stop_reason") or "-"),
            ("wall time", format_duration(float(summary.get("wall_s", 0.0)))
             + f" ({float(summary.get('wall_s', 0.0)):.1f} s)"),
            ("env steps", f"{summary.get('env_steps', 0)} ({summary.get('env_steps_per_s', 0.0):.0f}/s)"),
            ("opt steps", f"{summary.get('opt_steps', 0)} ({summary.get('opt_steps_per_s', 0.0):.0f}/s)")]
    if "messages" in summary:  # a learner's summary
        lag, msgs = summary.get("policy_lag", {}), summary["messages"]
        item = str(summary.get("replay_item") or "transition")  # what replay holds: transitions, or sequence items
        rows += [("inserted", f"{summary.get('transitions_inserted', 0)} {item}s "
                              f"({summary.get('transitions_inserted_per_s', 0.0):.0f}/s)"),
                 ("replay samples", f"{summary.get('replay_samples_per_s', 0.0):.0f}/s "
                                    f"({summary.get('samples_per_insert', 0.0):.2f} per {item} inserted)"),
                 ("model version", str(summary.get("model_version", "-"))),
                 ("policy lag", f"mean {lag.get('mean', float('nan')):.1f}, p90 {lag.get('p90', float('nan')):.0f}, "
                                f"max {lag.get('max', '-')} model versions"
                                + (f" ({lag['updates_per_version']} updates each)" if "updates_per_version" in lag
                                   else "")),
                 ("batches", f"received {msgs.get('batches_received', 0)}, lost {msgs.get('batches_lost', 0)}, "
                             f"rejected {msgs.get('rejected_total', 0)}")]
    store = summary.get("store")
    if isinstance(store, dict):  # an on-policy store's accounting (zmqrl.core.OnPolicyStore)
        share = 100 * store.get("dropped_lag_share", 0)
        rows.append(("segments", f"trained {store.get('trained', 0)} x {store.get('epochs', 1)} passes, dropped "
                                 f"{store.get('dropped_lag', 0)} for lag ({share:.1f}%), "
                                 f"{store.get('dropped_other_line', 0)} of another line, "
                                 f"{store.get('dropped_overflow', 0)} overflowing; full {store.get('full_pauses', 0)} "
                                 "times"))
    if summary.get("compute_cost"):
        rows.append(("time spent", cost_text(summary["compute_cost"])))
    rows += [("best eval return", _eval_text(summary, summary.get("best_eval_return"))),
             ("last eval return", _eval_text(summary, summary.get("last_eval_return")))]
    if solved:
        rows.append(("solved at", f"opt {solved.get('opt_steps')}, env {solved.get('env_steps')}, "
                                  f"{float(solved.get('wall_s', 0.0)):.1f} s"))
    if run_dir is not None:
        rows.append(("run directory", str(run_dir)))
    lines = [f"{name:<18}{value}" for name, value in rows]
    actors = summary.get("actors") or {}
    if actors:
        lines.append(f"{'actor':<12}{'env steps':>11}{'steps/s':>9}{'batches':>9}{'lost':>6}{'lag':>7}"
                     f"{'blocked s':>11}")
        lines += [f"{name:<12}{int(a.get('env_steps', 0)):>11}{a.get('env_steps_per_s', 0):>9.0f}"
                  f"{a.get('batches', 0):>9}{a.get('lost', 0):>6}{a.get('lag_mean', 0.0):>7.1f}"
                  f"{a.get('blocked_s', 0):>11.1f}" for name, a in sorted(actors.items())]
    return "\n".join(lines)


def print_run_table(summary: Mapping[str, Any], run_dir: str | Path | None = None, title: str = "run summary") -> None:
    """:func:`run_table` in the log, under ``title``."""
    log.info("%s\n%s", title, run_table(summary, run_dir))
