"""What every ``zmqrl bench`` JSON row must hold, for the tests that run a group of the bench."""

from __future__ import annotations

import math
from typing import Any

FIELDS = {"name", "measured", "baseline", "ratio", "goal", "met", "unit", "note"}


def check_schema(row: dict[str, Any]) -> None:
    """One JSON row: exactly the documented fields with the documented types."""
    assert set(row) == FIELDS, row
    assert isinstance(row["name"], str) and row["name"]
    assert isinstance(row["unit"], str) and isinstance(row["note"], str)
    for key in ("measured", "baseline", "ratio"):
        assert row[key] is None or isinstance(row[key], (int, float)), (key, row)
    assert row["goal"] is None or (isinstance(row["goal"], str) and row["goal"].split()[0] in (">=", "<="))
    assert row["met"] is None or isinstance(row["met"], bool)
    if row["goal"] is None:
        assert row["met"] is None, row


def check_verdict(row: dict[str, Any]) -> None:
    """A measured row's ratio is its own figures' ratio, and ``met`` is the goal applied to that ratio."""
    if row["measured"] is None or row["baseline"] is None:
        assert row["ratio"] is None and row["met"] in (None, False), row
        return
    ratios = (row["measured"] / row["baseline"], row["baseline"] / row["measured"])
    assert any(math.isclose(row["ratio"], r, rel_tol=1e-4) for r in ratios), row
    if row["goal"] is not None and row["met"]:
        op, value = row["goal"].split()
        assert (row["ratio"] >= float(value)) if op == ">=" else (row["ratio"] <= float(value)), row


def positive_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def check_skipped_cuda(row: dict[str, Any]) -> bool:
    """True for a CUDA row on a machine without CUDA, after checking it says so and judges nothing; the CUDA
    graph rows also give this CPU's eager and static figures."""
    if not row["note"].startswith("skipped: no CUDA device here"):
        return False
    assert "_cuda" in row["name"] and row["met"] is None, row
    if row["name"].endswith("_cuda_graph"):
        assert "were not measured" in row["note"] and "static path" in row["note"], row
    return True
