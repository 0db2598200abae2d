"""Where a training loop's time goes: seconds spent per part (the learner's loop: replay sampling
``sample``, queuing the update ``update``, waiting for a step's results ``wait``, priority write-back
``priorities``, inserting what its intake handed over ``insert``, making models ``publish``, waiting
for data ``idle``; ``zmqrl train``: acting, inserting, sampling, the update, priority write-back,
evaluating), as fractions of wall time per record interval (``cost/<part>`` in TensorBoard, with
``cost/other`` for the rest) and over the whole run (the summary's ``compute_cost`` and the run table).
The learner's intake and publisher threads run beside its loop: their CPU time is reported apart
(``perf/intake_cpu_s``, the summary's ``intake``).

The loop times each part itself (``time.perf_counter`` around the call, well under a microsecond).
On a GPU the update's time is what the host spends queuing it: kernels still running when it returns
are counted where the host next waits for them, the learner's ``wait`` (it reads a step's results one
step later, :mod:`~zmqrl.roles.learner`).
"""

from __future__ import annotations

import time


class ComputeCost:
    """Seconds per part since the last record and since the start (see the module docstring); a part
    is known from its first :meth:`add` on."""

    def __init__(self) -> None:
        self.since_record: dict[str, float] = {}
        self.total: dict[str, float] = {}
        self.started = self.recorded = time.perf_counter()

    def add(self, part: str, seconds: float) -> None:
        """``seconds`` more spent in ``part``."""
        self.since_record[part] = self.since_record.get(part, 0.0) + seconds
        self.total[part] = self.total.get(part, 0.0) + seconds

    def interval(self) -> dict[str, float]:
        """``cost/<part>``: each part's fraction of the wall time since the last call (and ``cost/other``)."""
        now = time.perf_counter()
        out = _fractions(self.since_record, now - self.recorded)
        self.since_record = dict.fromkeys(self.since_record, 0.0)
        self.recorded = now
        return {f"cost/{part}": share for part, share in out.items()}

    def run(self) -> dict[str, float]:
        """Each part's fraction of the wall time since the start (and ``other``)."""
        return _fractions(self.total, time.perf_counter() - self.started)


def _fractions(seconds: dict[str, float], wall: float) -> dict[str, float]:
    if wall <= 0:
        return {}
    out = {part: min(s / wall, 1.0) for part, s in seconds.items()}
    out["other"] = max(0.0, 1.0 - sum(out.values()))
    return {part: round(share, 4) for part, share in out.items()}


def cost_text(shares: dict[str, float]) -> str:
    """``update 61%, sample 12%, ...`` largest first, ``other`` last."""
    parts = sorted(((p, s) for p, s in shares.items() if p != "other"), key=lambda ps: -ps[1])
    if "other" in shares:
        parts.append(("other", shares["other"]))
    return ", ".join(f"{p} {s:.0%}" for p, s in parts)
