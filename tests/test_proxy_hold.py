"""The proxy reads its actors' batches in bursts at most every ``net.proxy_hold_ms``.

A real ``zmqrl proxy`` process between this test's PUSH (the actors) and a PULL standing in for
the learner: batches sent one at a time every 10 ms must all arrive, in order, and the proxy must
have read them in at most one burst per hold; with the hold off it reads far more often. A flood
goes through at once however long the hold: there is no hold while batches come faster than
half a receive queue per hold.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from zmqrl.roles.common import free_port
from zmqrl.wire import BATCH, Limits, decode, encode, new_incarnation

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import Procs, read_json, wait_for  # noqa: E402

BATCHES = 100
GAP_S = 0.01  # between two batches sent: 5 per hold below, under half the proxy's receive queue (16)


def _through_proxy(tmp_path: Path, procs: Procs, hold_ms: float, batches: int = BATCHES, gap_s: float = GAP_S
                   ) -> tuple[dict[str, object], float]:
    """Send ``batches`` batches ``gap_s`` apart (0: as fast as they go) through a proxy holding
    ``hold_ms``; returns its stats and the seconds from the first paced send to the last batch received."""
    name = f"proxy-{hold_ms:g}"
    run_dir = tmp_path / name
    ctx = zmq.Context()
    tap = ctx.socket(zmq.PULL)
    push = ctx.socket(zmq.PUSH)
    for sock in (tap, push):
        sock.setsockopt(zmq.LINGER, 0)
    tap_port = tap.bind_to_random_port("tcp://127.0.0.1")
    proxy_port = free_port()
    arrays = {"reward": np.zeros(64, np.float32)}
    inc = new_incarnation()
    try:
        proc = procs.role(name, "proxy", "--bind", f"tcp://127.0.0.1:{proxy_port}", "--learner",
                          f"tcp://127.0.0.1:{tap_port}", "--run-dir", str(run_dir), "--name", name,
                          overrides=[f"net.proxy_hold_ms={hold_ms:g}", "net.stats_interval_s=60"])
        push.connect(f"tcp://127.0.0.1:{proxy_port}")

        def received() -> list[int]:
            seqs = []
            while tap.poll(0):
                msg = decode(tap.recv_multipart(), Limits.only({BATCH}))
                seqs.append(msg.seq)
            return seqs

        push.send_multipart(encode(BATCH, sender="actor", incarnation=inc, seq=0, version=0, arrays=arrays))
        wait_for(lambda: tap.poll(100), 60, f"{name} to forward a first batch", lambda: procs.describe())
        seqs = received()
        start = time.monotonic()
        for seq in range(1, batches + 1):
            push.send_multipart(encode(BATCH, sender="actor", incarnation=inc, seq=seq, version=0, arrays=arrays))
            seqs += received()
            if gap_s:
                time.sleep(max(0.0, start + seq * gap_s - time.monotonic()))  # pacing the sends, not waiting on them

        def all_in() -> bool:
            seqs.extend(received())
            return len(seqs) == batches + 1

        wait_for(all_in, 30, f"{name} to forward {batches + 1} batches", lambda: f"got {len(seqs)}\n{procs.describe()}")
        span = time.monotonic() - start
        assert seqs == list(range(batches + 1)), seqs
        assert proc.stop() == 0, procs.describe()
    finally:
        tap.close()
        push.close()
        ctx.term()
    stats = read_json(run_dir / "roles" / f"{name}.json")
    assert stats is not None, procs.describe()
    assert stats["forwarded"] == batches + 1, stats
    return stats, span


@pytest.mark.timeout(120)
def test_proxy_reads_in_bursts_at_most_once_per_hold(tmp_path: Path, procs: Procs) -> None:
    hold_s = 0.05
    held, span = _through_proxy(tmp_path, procs, hold_s * 1000)
    # the first batch's burst, then bursts at least hold_s apart within the span of the paced ones
    most = 2 + span / hold_s
    assert 2 <= held["bursts"] <= most, (held["bursts"], span)

    # without the hold, the same paced batches are read nearly one at a time
    at_once, span0 = _through_proxy(tmp_path, procs, 0)
    assert at_once["bursts"] > 2 + span0 / hold_s, (at_once["bursts"], span0)


@pytest.mark.timeout(120)
def test_proxy_hold_never_caps_a_flood(tmp_path: Path, procs: Procs) -> None:
    # held a whole second after every burst, 3000 batches would take minutes (the receive queue
    # holds 16 per actor); at the rate they come there is no hold, so they go through at once
    stats, span = _through_proxy(tmp_path, procs, 1000.0, batches=3000, gap_s=0.0)
    assert span < 30.0, (span, stats["bursts"])
