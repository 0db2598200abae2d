"""The learner's samples-per-insert rate limiter (zmqrl/roles/ratelimit.py), as the learner drives it."""

from __future__ import annotations

from zmqrl.config import TrainerConfig
from zmqrl.roles.ratelimit import SamplesPerInsert

BATCH = 64


def limiter(min_ratio: float = 32.0, max_ratio: float = 0.0) -> SamplesPerInsert:
    return SamplesPerInsert(TrainerConfig(min_samples_per_insert=min_ratio, max_samples_per_insert=max_ratio), BATCH)


def test_actors_pause_when_data_outruns_the_updates_and_resume_when_they_catch_up() -> None:
    lim = limiter()
    lim.inserted = 500
    assert not lim.update_pause(0, warm=False) and not lim.paused  # replay still warming up
    lim.inserted = 1000
    assert lim.update_pause(0, warm=True) and lim.paused  # warm, torch still loading: pause
    assert not lim.update_pause(499, warm=True)  # 499 * 64 / 1000 < 32: still paused, nothing changed
    assert lim.update_pause(500, warm=True) and not lim.paused
    lim.inserted += 64
    assert lim.update_pause(500, warm=True) and lim.paused
    assert lim.pauses == 2
    assert lim.ratio(500) == 500 * BATCH / 1064


def test_a_resumed_learner_continues_the_ratio() -> None:
    lim = limiter()
    lim.inserted, lim.pauses = 5000, 3
    resumed = limiter()
    resumed.load_state_dict(lim.state_dict())
    assert (resumed.inserted, resumed.pauses) == (5000, 3)
    assert resumed.update_pause(2000, warm=True) and resumed.paused  # 2000 * 64 / 5000 < 32
    assert not limiter().update_pause(2000, warm=True)  # the control: a fresh count would not pause


def test_max_ratio_throttles_the_learner_and_min_ratio_zero_never_pauses() -> None:
    lim = limiter(min_ratio=0.0, max_ratio=8.0)
    lim.inserted = 1000
    assert not lim.throttled(125)  # 125 * 64 / 1000 = 8
    assert lim.throttled(126)
    assert not lim.update_pause(0, warm=True) and not lim.paused


def test_actors_get_an_allowance_per_model_only_while_the_learner_trains_with_the_bound_on() -> None:
    lim = SamplesPerInsert(TrainerConfig(min_samples_per_insert=256.0, sync_interval=50), batch_size=256)
    lim.update_pause(0, warm=False)
    assert lim.allowance() is None  # replay still warming up: actors fill it unbounded
    lim.inserted = 300
    lim.update_pause(0, warm=True)
    assert lim.allowance() == 100  # twice the 50 transitions 50 updates of 256 use at 256 samples each
    small = SamplesPerInsert(TrainerConfig(min_samples_per_insert=32.0, sync_interval=50), batch_size=64)
    small.update_pause(0, warm=True)
    assert small.allowance() == 200
    off = limiter(min_ratio=0.0)
    off.update_pause(0, warm=True)
    assert off.allowance() is None  # no lower bound on the ratio: no allowance either
