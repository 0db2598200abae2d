"""The proxy reads its actors' batches in bursts at most every ``net.proxy_hold_ms``.

A real ``zmqrl proxy`` process between this test's PUSH (the actors) and a PULL standing in for
the learner: batches sent one at a time every 10 ms must all arrive, in order, and the proxy must
have read them in at most one burst per hold; with the hold off it reads far more often. So must
many slow actors, together far faster than one. A flood from one actor goes through at once
however long the hold: there is no hold while one actor's batches come faster than half its
receive queue per hold.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zmq

from procs import Procs, wait_for  # noqa: E402
from zmqrl.roles.addresses import free_port
from zmqrl.run.rundir import read_json
from zmqrl.wire import BATCH, BUNDLE, Limits, decode, encode, new_incarnation, unbundle

BATCHES = 100
GAP_S = 0.01  # between two batches sent: 5 per hold below, under half the proxy's receive queue (16)


def _through_proxy(tmp_path: Path, procs: Procs, hold_ms: float, batches: int = BATCHES, gap_s: float = GAP_S,
                   actors: int = 1) -> tuple[dict[str, object], float]:
    """Send ``batches`` batches ``gap_s`` apart (0: as fast as they go), from ``actors`` actors in
    turn (after a first one from each), through a proxy holding ``hold_ms``; returns its stats and
    the seconds from the first send to the last batch received."""
    name = f"proxy-{hold_ms:g}"
    run_dir = tmp_path / name
    ctx = zmq.Context()
    tap = ctx.socket(zmq.PULL)
    pushes = [ctx.socket(zmq.PUSH) for _ in range(actors)]
    for sock in (tap, *pushes):
        sock.setsockopt(zmq.LINGER, 0)
    tap_port = tap.bind_to_random_port("tcp://127.0.0.1")
    proxy_port = free_port()
    arrays = {"reward": np.zeros(64, np.float32)}
    incs = [new_incarnation() for _ in range(actors)]
    try:
        proc = procs.role(name, "proxy", "--bind", f"tcp://127.0.0.1:{proxy_port}", "--learner",
                          f"tcp://127.0.0.1:{tap_port}", "--run-dir", str(run_dir), "--name", name,
                          overrides=[f"net.proxy_hold_ms={hold_ms:g}", "net.stats_interval_s=60"])
        for push in pushes:
            push.connect(f"tcp://127.0.0.1:{proxy_port}")

        def send(i: int) -> None:
            actor, seq = i % actors, i // actors
            pushes[actor].send_multipart(encode(BATCH, sender=f"actor-{actor}", incarnation=incs[actor], seq=seq,
                                                version=0, arrays=arrays))

        def received() -> list[tuple[str, int]]:
            got = []
            while tap.poll(0):
                msg = decode(tap.recv_multipart(), Limits.only({BATCH, BUNDLE}))
                got += [(m.sender, m.seq) for m in (unbundle(msg) if msg.kind == BUNDLE else [msg])]
            return got

        wait_for(lambda: "actors connect to" in proc.text(), 60, f"{name} to bind", lambda: procs.describe())
        start = time.monotonic()  # every burst comes after this
        seqs: list[tuple[str, int]] = []

        def reached(count: int) -> Callable[[], bool]:
            """Whether ``count`` batches in all have come through, reading what has."""
            def check() -> bool:
                seqs.extend(received())
                return len(seqs) == count
            return check

        for i in range(actors):  # a first batch from each, so every link is up before the paced ones
            send(i)
        wait_for(reached(actors), 60, f"{name} to forward a first batch from each actor", lambda: procs.describe())
        paced = time.monotonic()
        for i in range(actors, actors + batches):
            send(i)
            seqs += received()
            if gap_s:  # pacing the sends, not waiting on them
                time.sleep(max(0.0, paced + (i - actors + 1) * gap_s - time.monotonic()))
        wait_for(reached(actors + batches), 30, f"{name} to forward {actors + batches} batches",
                 lambda: f"got {len(seqs)}\n{procs.describe()}")
        span = time.monotonic() - start
        for actor in range(actors):  # each actor's batches in order, none missing
            mine = [seq for sender, seq in seqs if sender == f"actor-{actor}"]
            assert mine == list(range(len(mine))), (actor, mine)
        assert proc.stop() == 0, procs.describe()
    finally:
        for sock in (tap, *pushes):
            sock.close()
        ctx.term()
    stats = read_json(run_dir / "roles" / f"{name}.json")
    assert stats is not None, procs.describe()
    assert stats["forwarded"] == actors + batches, stats
    return stats, span


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_proxy_reads_in_bursts_at_most_once_per_hold(tmp_path: Path, procs: Procs) -> None:
    hold_s = 0.05
    held, span = _through_proxy(tmp_path, procs, hold_s * 1000)
    # bursts at least hold_s apart, all within the span from the first send (and one for rounding)
    most = 2 + span / hold_s
    assert 2 <= held["bursts"] <= most, (held["bursts"], span)

    # without the hold, the same paced batches are read nearly one at a time
    at_once, span0 = _through_proxy(tmp_path, procs, 0)
    assert at_once["bursts"] > 2 + span0 / hold_s, (at_once["bursts"], span0)


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_proxy_holds_for_many_slow_actors(tmp_path: Path, procs: Procs) -> None:
    # 16 actors, each 40 batches/s: 32 batches per 50 ms hold in all, 2 from each actor; the hold
    # is judged per actor (each has its own receive queue), so the proxy still reads in bursts
    hold_s = 0.05
    stats, span = _through_proxy(tmp_path, procs, hold_s * 1000, batches=320, gap_s=1 / 640, actors=16)
    assert 2 <= stats["bursts"] <= 2 + span / hold_s, (stats["bursts"], span)


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_proxy_hold_never_caps_a_flood(tmp_path: Path, procs: Procs) -> None:
    # held a whole second after every burst, 3000 batches would take minutes (the receive queue
    # holds 16 per actor); at the rate they come there is no hold, so they go through at once
    stats, span = _through_proxy(tmp_path, procs, 1000.0, batches=3000, gap_s=0.0)
    assert span < 30.0, (span, stats["bursts"])
