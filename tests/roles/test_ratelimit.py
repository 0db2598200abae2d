"""The learner's samples-per-insert rate limiter (zmqrl/roles/ratelimit.py), as the learner drives it."""

from __future__ import annotations

import collections
import random
from typing import Any

import pytest

from zmqrl.config import TrainerConfig
from zmqrl.roles.fit import Allowance
from zmqrl.roles.ratelimit import Allowances, SamplesPerInsert
from zmqrl.wire import MODEL, Message

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


# ------------------------------------------------------------------------- allowances, both sides


def simulate(seed: int, steps: int = 4000) -> tuple[Allowances, int, int]:
    """A learner making grants (some while paused), an actor that receives a random part of the models
    (CONFLATE keeps only the newest), holds as told and makes batches, and a link that delivers its
    batches in order after random delays (some lost, as when a proxy dies). Returns the learner's
    allowances, the transitions the actor made and those that arrived."""
    rng = random.Random(seed)
    amount, n_buffer = 160, 64
    learner, actor = Allowances(16, 600.0, unstamped=10 * n_buffer), Allowance()
    paused = False
    made = arrived = 0
    queue: collections.deque[tuple[int, list[int]]] = collections.deque()
    pending_model: tuple[int, dict[str, Any]] | None = None
    for _ in range(steps):
        event = rng.random()
        if event < 0.1:  # the learner encodes a model: a grant (the limiter's pause flips now and then)
            if rng.random() < 0.2:
                paused = not paused
            number = learner.grant(amount, paused=paused)
            pending_model = (number or 0, {"pause": paused, "allow": amount, "grant": number})
        elif event < 0.2 and pending_model is not None and rng.random() < 0.7:  # the actor reads the newest model
            actor.observe(Message(MODEL, "learner", "L", pending_model[0], pending_model[0], {}, pending_model[1]),
                          made)
            if rng.random() < 0.3:  # and, now and then, the same model again (a re-send to a new subscriber)
                actor.observe(Message(MODEL, "learner", "L", pending_model[0], pending_model[0], {},
                                      pending_model[1]), made)
        elif event < 0.6 and pending_model is not None and actor.quota is not None and not actor.reached(made):
            # the actor (acting once it has a model) finishes a batch
            made += n_buffer
            queue.append((n_buffer, actor.stamp()))
        elif queue:  # the oldest batch in flight arrives (or is lost)
            n, grants = queue.popleft()
            if rng.random() < 0.02:
                continue
            assert learner.take("actor-0", n, grants), (seed, made, arrived)
            arrived += n
    return learner, made, arrived


@pytest.mark.parametrize("seed", range(20))
def test_an_honest_actor_is_never_refused_however_its_models_and_batches_are_delayed(seed: int) -> None:
    learner, made, arrived = simulate(seed)
    assert learner.refused_batches == 0 and made > 20 * 64 and arrived > 0


def test_a_sender_that_ignores_pauses_and_allowances_gets_a_sliver() -> None:
    amount, n = 160, 64
    learner = Allowances(16, 600.0, unstamped=4 * n)
    taken = 0
    for k in range(2000):
        number = learner.grant(amount, paused=k % 3 == 0)
        for _ in range(10):  # ten batches per model, whatever the model says
            taken += learner.take("rogue", n, [number] if k % 2 else []) * n
    # an honest actor gets at most ``amount`` per unpaused grant (about 1,333 of them here); the rogue a sliver
    assert taken < 0.05 * amount * 1333, taken
    assert not learner.take("rogue", n, [learner.grants + 5])  # a grant never made
    assert learner.take("newcomer", n, [2]) and not learner.take("newcomer", n, [4])  # grant 4: made while paused


def test_no_allowance_in_force_takes_everything() -> None:
    learner = Allowances(16, 600.0, unstamped=0)
    learner.grant(None)
    assert all(learner.take("a", 64) for _ in range(1000))
