"""The fanin bench group on a small scale: a real learner, 2 proxies and 8 senders in 2 processes.

Its figures mean nothing at this size and with such short windows; what is checked is that every
sender's batches reach replay through the proxies, valid and in sequence, and that the rows come
out with positive figures.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from zmqrl.bench import fanin, harness, registry


def test_fanin_is_a_group_after_learner() -> None:
    names = list(registry.GROUPS)
    assert names.index("fanin") == names.index("learner") + 1
    assert registry.group("fanin") is fanin.run
    assert harness.Settings.preset("smoke").fanin == (8,)
    assert harness.Settings.preset("full").fanin == (64, 256)


def test_search_doubles_until_the_learner_falls_behind_then_bisects() -> None:
    offered: list[float] = []

    def step(rate: float) -> fanin.Step:  # a learner that keeps up to 120k/s
        offered.append(rate)
        return fanin.Step(rate, 100.0 if rate <= 120_000 else 50.0, rate, 1.0)

    result = fanin.Fanin(8, 2, 2, idle_opt_s=100.0)
    fanin._search(step, result, refine=2)
    assert offered[:4] == [25_000, 50_000, 100_000, 200_000]
    assert offered[4] == pytest.approx(math.sqrt(100_000 * 200_000))
    best = result.best()
    assert best is not None and 100_000 <= best.ingest_s <= 120_000


def test_each_step_is_judged_against_the_silent_windows_around_it() -> None:
    result = fanin.Fanin(8, 2, 2, idle_opt_s=100.0)
    slow = fanin.Step(25_000, 80.0, 25_000, 1.0, reference=85.0)  # the machine slowed: 0.94x of its neighbours
    assert result.kept(slow) and not result.kept(fanin.Step(25_000, 80.0, 25_000, 1.0))  # control: 0.8x of 100
    assert not result.kept(fanin.Step(25_000, 80.0, 25_000, 1.0, reference=100.0))


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_small_fanin_run(tmp_path: Path) -> None:
    ctx = harness.Context(harness.Settings.preset("smoke"), tmp_path)
    result = fanin.measure(ctx, 8, proxies=2, processes=2)
    assert result.idle_opt_s > 0 and result.steps
    assert len(result.idle_windows) == len(result.steps) + 1  # a silent window before and after each step
    assert all(st.reference > 0 for st in result.steps)
    assert result.actors == 8 and result.proxies_seen == 2  # every sender accounted, every proxy reported
    assert result.rejected == 0 and result.lost == 0
    assert result.batches > 0 and result.inserted == 64 * result.batches
    assert result.batches <= result.sent  # (the last ones may still be in flight when the proxies stop)
    assert result.rss_start > 0 and result.rss_end > 0
    assert result.sockets >= 8 + 2  # a model subscriber per sender, a link per proxy
    rows = fanin.rows(ctx, [result])
    assert [r.name for r in rows] == ["fanin_8_senders", "fanin_8_senders_rss"]
    for row in rows:
        assert row.measured is not None and row.measured > 0, row
        assert row.baseline is not None and row.baseline > 0, row
        assert row.ratio is not None and row.ratio > 0 and row.met is not None, row
    assert rows[0].baseline == fanin.GOAL_RATE and rows[0].goal == ">= 1"
    assert "0 rejected, 0 lost" in rows[0].note


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_intake_row_times_every_queued_batch_into_replay(tmp_path: Path) -> None:
    ctx = harness.Context(harness.Settings.preset("smoke"), tmp_path)
    row = fanin.intake_row(ctx)  # (raises unless all 5 x 100 batches went in, none rejected)
    assert row.name == "fanin_intake_us_per_batch" and row.goal == "<= 1"
    assert row.baseline == pytest.approx(1e6 * (1 - fanin.KEEP) * 64 / fanin.GOAL_RATE)  # 64 us
    assert row.measured is not None and 1.0 < row.measured < 10_000, row  # CPU time was counted
    assert "from 64 senders" in row.note
