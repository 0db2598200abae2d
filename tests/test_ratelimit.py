"""The learner's rate limiter: samples per insert, counted from the end of warm-up."""

from __future__ import annotations

from zmqrl.config import TrainerConfig
from zmqrl.roles.ratelimit import SamplesPerInsert


def test_min_ratio_counts_inserts_after_warm_up_only() -> None:
    """A 20k warm-up at 8 samples per insert (batch 32) must not hold actors for 5,000 updates."""
    limiter = SamplesPerInsert(TrainerConfig(warmup=20_000, min_samples_per_insert=8.0), batch_size=32)
    limiter.inserted = 20_000
    assert limiter.update_pause(0, warm=True) and limiter.paused  # nothing sampled yet: pause
    limiter.inserted += 32
    assert limiter.update_pause(8, warm=True) and not limiter.paused  # 256 samples for 32 new: let data in
    limiter.inserted += 64
    assert limiter.update_pause(8, warm=True) and limiter.paused  # 256 for 96: below 8, pause again
    assert limiter.pauses == 2
    assert limiter.ratio(8) == 8 * 32 / 20_096  # the run's own ratio, as the summary reports it


def test_max_ratio_waits_for_new_data_after_warm_up() -> None:
    limiter = SamplesPerInsert(TrainerConfig(warmup=1000, max_samples_per_insert=4.0), batch_size=64)
    limiter.inserted = 1000
    assert not limiter.throttled(0)
    assert limiter.throttled(1)  # 64 samples, no new transition yet
    limiter.inserted += 16
    assert not limiter.throttled(1) and limiter.throttled(2)  # 64 / 16 = 4 is allowed, 128 / 16 is not


def test_off_by_default() -> None:
    limiter = SamplesPerInsert(TrainerConfig(warmup=10), batch_size=64)
    limiter.inserted = 10
    assert not limiter.throttled(10**6) and not limiter.update_pause(10**6, warm=True) and not limiter.paused
