"""The on-policy store: a FIFO of segments, each batch trained on for its epochs, the stale dropped and counted,
a soft bound that asks for a pause and a hard one that makes room, never a refusal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from zmqrl.config import TrainerConfig
from zmqrl.core import OnPolicyStore
from zmqrl.replay.onpolicy import OTHER_LINE, SegmentQueue
from zmqrl.roles.ratelimit import SamplesPerInsert

SPEC = {"obs": (np.dtype(np.float32), (3, 2)), "reward": (np.dtype(np.float32), (3,))}


def segments(first: int, n: int) -> dict[str, np.ndarray]:
    """``n`` segments numbered from ``first`` (their reward's first step holds the number)."""
    reward = np.zeros((n, 3), np.float32)
    reward[:, 0] = np.arange(first, first + n)
    return {"obs": np.zeros((n, 3, 2), np.float32), "reward": reward}


def numbers(batch: dict[str, np.ndarray]) -> list[int]:
    return [int(x) for x in batch["reward"][:, 0]]


def test_each_batch_goes_out_oldest_first_for_its_epochs() -> None:
    store = SegmentQueue(capacity=100, epochs=3, schema=SPEC)
    assert isinstance(store, OnPolicyStore)
    store.add(segments(0, 5))
    store.add(segments(5, 5))
    assert len(store) == 10 and store.updates_ready(4) == 6
    for _ in range(3):
        batch = store.sample(4)
        assert numbers(batch) == [0, 1, 2, 3] and batch["weights"].tolist() == [1.0] * 4
    assert store.updates_ready(4) == 3 and len(store) == 6
    assert numbers(store.sample(4)) == [4, 5, 6, 7]  # across the two adds
    store.sample(4)
    store.sample(4)
    assert numbers(store.sample(4)) == [8, 9]  # what is left: a smaller batch
    store.sample(4)
    store.sample(4)
    with pytest.raises(ValueError, match="empty"):
        store.sample(4)
    summary = store.summary()
    assert (summary["added"], summary["trained"], summary["batches"]) == (10, 10, 9)


def test_segments_too_many_versions_old_or_of_another_line_are_dropped_and_counted() -> None:
    store = SegmentQueue(capacity=100, epochs=1, max_lag=2, schema=SPEC)
    store.at_version(5)
    store.add(segments(0, 4), versions=np.array([2, 3, 5, OTHER_LINE]))
    assert numbers(store.sample(10)) == [1, 2]  # version 2 is 3 behind: dropped; another line's: dropped
    store.add(segments(10, 3), versions=np.array([5, 6, 7]))
    store.at_version(8)  # queued ones fall behind as the learner publishes
    assert numbers(store.sample(10)) == [11, 12]
    s = store.summary()
    assert (s["dropped_lag"], s["dropped_other_line"], s["dropped_overflow"]) == (2, 1, 0)
    assert s["dropped_lag_share"] == pytest.approx(2 / 7, abs=1e-4)
    no_limit = SegmentQueue(capacity=100, schema=SPEC)  # max_lag 0: none is too old
    no_limit.at_version(10**6)
    no_limit.add(segments(0, 2), versions=np.array([0, 1]))
    assert len(no_limit) == 2


def test_a_full_queue_asks_for_a_pause_takes_what_was_on_its_way_and_makes_room_only_past_the_hard_bound() -> None:
    store = SegmentQueue(capacity=4, hard_capacity=6, schema=SPEC)
    store.add(segments(0, 3))
    assert not store.full
    store.add(segments(3, 2))
    assert store.full and store.queued == 5 and store.summary()["full_pauses"] == 1
    store.add(segments(5, 3))  # in flight when the pause went out: taken, the oldest make room
    assert store.queued == 6 and store.summary()["dropped_overflow"] == 2
    assert numbers(store.sample(6)) == [2, 3, 4, 5, 6, 7]
    assert not store.full
    limiter = SamplesPerInsert(TrainerConfig(), batch_size=4)  # the learner's pause: the rate limiter off
    assert limiter.update_pause(0, warm=True, full=True) and limiter.paused
    assert limiter.update_pause(0, warm=True, full=False) and not limiter.paused


def test_batches_that_do_not_fit_are_refused_whole() -> None:
    store = SegmentQueue(capacity=10, schema=SPEC)
    with pytest.raises(ValueError, match="obs"):
        store.add({"obs": np.zeros((2, 4, 2), np.float32), "reward": np.zeros((2, 3), np.float32)})
    with pytest.raises(ValueError, match="versions"):
        store.add(segments(0, 2), versions=np.array([1]))
    assert len(store) == 0 and store.added == 0


def test_contents_and_counters_round_trip_through_a_file(tmp_path: Path) -> None:
    store = SegmentQueue(capacity=10, epochs=2, max_lag=3, schema=SPEC)
    store.at_version(4)
    store.add(segments(0, 3), versions=np.array([4, 4, 3]))
    store.sample(2)  # a batch with one pass left
    store.save(str(tmp_path / "store.npz"), stamp={"opt_steps": 7})
    other = SegmentQueue(capacity=10, epochs=2, max_lag=3, schema=SPEC)
    assert other.load(str(tmp_path / "store.npz")) == {"opt_steps": 7}
    assert other.state_dict() == store.state_dict() and other.version == 4 and len(other) == 3
    for _ in range(2):
        a, b = store.sample(2), other.sample(2)
        assert numbers(a) == numbers(b) and a["indices"].tolist() == b["indices"].tolist()
