"""The test tiers: ``-m "not slow"`` (quick: no processes, no learning), the whole suite (one seed per
learning test), and ``--all-seeds`` (a nightly job: every seed of every learning test, and the learning
runs whose proof the whole suite takes from another test)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def seeds(first: int, *more: int) -> list[Any]:
    """Seeds to parametrize a learning test with: ``first`` in every run of the suite, ``more`` only with
    ``--all-seeds`` (they carry the ``allseeds`` mark)."""
    return [first, *(pytest.param(seed, marks=pytest.mark.allseeds) for seed in more)]


def nightly(covered_by: str) -> pytest.MarkDecorator:
    """A learning run left to the nightly tier (``--all-seeds``) because another test of the whole suite
    proves what it proves; ``covered_by`` names that test (kept on the mark:
    ``item.get_closest_marker("allseeds").kwargs["covered_by"]``)."""
    return pytest.mark.allseeds(covered_by=covered_by)


DURATIONS = Path(__file__).with_name("durations.json")  # seconds of the tests that take 2 s or more
HEAVY_S = 2.0


def heavy_first(items: list[Any], unit_of: Callable[[Any], str], durations: dict[str, float]) -> None:
    """Sort ``items`` in place so that the longest units of work (a test, or the tests of one
    ``xdist_group``) come first and the short ones fill in after: the two workers take units in this order
    as they free up, so the suite does not end waiting on one long test that started last."""
    cost: dict[str, float] = {}
    for item in items:
        unit = unit_of(item)
        cost[unit] = cost.get(unit, 0.0) + durations.get(item.nodeid.split("@")[0], 0.0)
    items.sort(key=lambda item: -cost[unit_of(item)])


def read_durations(path: Path = DURATIONS) -> dict[str, float]:
    """``durations.json`` (nothing when it is missing: the suite then runs in collection order)."""
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def main(argv: list[str]) -> int:
    """``python tests/tiers.py COSTS.jsonl``: write ``durations.json`` from a run of the whole suite with
    ``ZMQRL_TEST_COSTS=COSTS.jsonl`` (each test of :data:`HEAVY_S` or more, its wall seconds)."""
    if len(argv) != 1:
        print(main.__doc__, file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in Path(argv[0]).read_text().splitlines() if line.strip()]
    heavy = {r["test"].split("@")[0]: round(r["wall_s"], 1) for r in rows if r["wall_s"] >= HEAVY_S}
    DURATIONS.write_text(json.dumps(dict(sorted(heavy.items(), key=lambda kv: -kv[1])), indent=1) + "\n")
    print(f"{DURATIONS}: {len(heavy)} tests of {HEAVY_S:g} s or more, {sum(heavy.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
