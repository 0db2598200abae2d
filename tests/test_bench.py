"""Tests of ``zmqrl bench``: the command line, the row schema, and one smoke run of the whole suite.

The smoke run (``--smoke``) exercises every measurement with tiny durations: its figures mean
nothing, but every row must come back with the documented fields and a positive, finite ratio.
It starts real processes (proxy, sinks, feeders, ``zmqrl local`` and ``zmqrl train``) and takes
about 45 s on two cores.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from zmqrl import bench

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


def positive_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_register_adds_the_bench_subcommand() -> None:
    parser = argparse.ArgumentParser(prog="zmqrl")
    sub = parser.add_subparsers(dest="command", required=True)
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {}
    bench.register(sub, handlers)
    args = parser.parse_args(["bench", "--only", "actor,replay", "--only", "solve", "--json", "out.json",
                              "--quick", "--seeds", "2", "--sb3", "--sb3-python", "/x/python"])
    assert handlers["bench"] is bench.cmd_bench
    assert args.only == ["actor,replay", "solve"] and args.json == "out.json"
    assert args.quick and args.seeds == 2 and args.sb3 and args.sb3_python == "/x/python"


def test_presets_shorten_and_overrides_apply() -> None:
    full, quick, smoke = (bench.Settings.preset(m) for m in ("full", "quick", "smoke"))
    assert full.seeds == 3 and quick.seeds == 1
    assert smoke.actor_s * smoke.actor_reps < quick.actor_s * quick.actor_reps < full.actor_s * full.actor_reps
    assert quick.solve_budget_s < full.solve_budget_s
    assert bench.Settings.preset("quick", seeds=5, solve_budget_s=None).seeds == 5
    with pytest.raises(ValueError):
        bench.Settings.preset("slow")


def test_unknown_names_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--only", "actor,warp"]) == 2
    assert "warp" in capsys.readouterr().err


def test_rows_compute_ratio_and_goal() -> None:
    row = bench.make_row("x", 90.0, 100.0, "steps/s", "", (">=", 0.9))
    assert row.ratio == 0.9 and row.goal == ">= 0.9" and row.met is True
    row = bench.make_row("y", 69.0, 48.0, "B", "", ("<=", 1.1))
    assert row.met is False
    row = bench.make_row("z", 2.0, 5.0, "ms", "", (">=", 1.0), ratio=5.0 / 2.0)
    assert row.ratio == 2.5 and row.met is True
    assert bench.make_row("n", 3.0, 1.5, "s", "").met is None
    skipped = bench.skipped_row("s", "s", "stable-baselines3 not installed", ("<=", 0.5))
    assert skipped.ratio is None and skipped.met is None and skipped.note.startswith("skipped:")
    check_schema(skipped.as_dict())


def test_sb3_is_optional() -> None:
    settings = bench.Settings(sb3=True, sb3_python="/nonexistent/python")
    assert bench._sb3_interpreter(settings) is None
    assert "stable_baselines3" not in sys.modules  # never imported by the suite itself


def test_replay_rows(tmp_path: Path) -> None:
    out = tmp_path / "replay.json"
    assert bench.main(["--only", "replay", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["name"] for r in rows] == ["replay_bytes_cartpole", "replay_bytes_frames"]
    for row in rows:
        check_schema(row)
        assert positive_finite(row["ratio"]) and row["met"] is not None
    frames = rows[1]
    assert frames["baseline"] == 2 * 4 * 84 * 84  # obs and next_obs stacks of one transition
    assert 84 * 84 / frames["baseline"] < frames["ratio"] < 0.35  # about one frame per transition is kept
    assert "each distinct frame stored once" in frames["note"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_smoke_run_of_the_whole_suite(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    started = time.monotonic()
    code = bench.main(["--smoke", "--json", str(out), "--keep", str(tmp_path / "work")])
    elapsed = time.monotonic() - started
    rows = json.loads(out.read_text())
    errors = [r for r in rows if r["note"].startswith("error:")]
    assert code == 0 and not errors, errors
    names = {r["name"] for r in rows}
    expected = {"replay_bytes_cartpole", "replay_bytes_frames", "actor_env_steps", "transport_cartpole_1024",
                "transport_atari_64", "transport_cartpole_1024_ceiling", "transport_atari_64_ceiling",
                "learner_opt_steps", "broadcast_1mb", "broadcast_10mb", "startup_s", "scaling_1_actors",
                "solve_local_vs_train"}
    assert expected <= names, expected - names
    for row in rows:
        check_schema(row)
        assert positive_finite(row["ratio"]), row
        assert positive_finite(row["measured"]) and positive_finite(row["baseline"]), row
    assert elapsed < 150, f"the smoke run took {elapsed:.0f}s"
