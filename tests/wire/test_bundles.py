"""A proxy joins the batches of one burst into one BUNDLE message; the learner takes it apart.

- On the wire: each batch comes back out of a bundle as it went in (sender, incarnation,
  sequence, version, meta, every array); a bundle whose parts do not account for its rows, or
  whose parts are not well formed, is refused with the reason; batches of two layouts never share one.
- In the learner: a bundle's batches go into replay and are accounted per actor (sequences, env
  steps, episodes) as if each had come alone; a bad bundle is refused and counted, a repeated
  part is dropped as old, and nothing else is lost.
- Through a real ``zmqrl proxy``: a burst from several actors reaches the learner as bundles, every
  batch in order; a batch of another layout goes as it came; ``net.proxy_merge=1`` turns it off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from batches import cartpole_batch
from procs import Procs, wait_for
from rigs import in_process_learner, ingest_until
from zmqrl.roles.addresses import free_port
from zmqrl.roles.learner import Learner
from zmqrl.run.rundir import read_json
from zmqrl.wire import (
    BATCH,
    BUNDLE,
    DEFAULT_COPY_THRESHOLD,
    BatchEncoder,
    Limits,
    Message,
    WireError,
    decode,
    encode,
    encode_bundle,
    new_incarnation,
    peek,
    unbundle,
)

pytestmark = pytest.mark.timeout(180)


class Actor:
    """An actor's stream of batches: its name, incarnation and next sequence number."""

    def __init__(self, name: str) -> None:
        self.name, self.seq = name, 0
        self.encoder = BatchEncoder(name, new_incarnation(), pack_below=DEFAULT_COPY_THRESHOLD)

    def batch(self, n: int = 64, **arrays: np.ndarray) -> list[Any]:
        seq, self.seq = self.seq, self.seq + 1
        data = {**cartpole_batch(n, seed=1000 * len(self.name) + seq), **arrays}
        meta = {"stats": {"env_steps": 64 * (seq + 1)}, "explore": 0.1,
                "episodes": {"returns": [float(seq)], "lengths": [seq + 1]}}
        return [bytes(f) for f in self.encoder.encode(seq, 3, data, meta)]


def join(messages: list[list[Any]], sender: str = "proxy-0", seq: int = 0) -> list[bytes]:
    parts = []
    for frames in messages:
        header, views, specs = peek(frames)
        parts.append((header, views, specs[0][2][0]))
    return encode_bundle(sender, "proxy-inc", seq, parts)


def same(a: Message, b: Message) -> bool:
    return ((a.kind, a.sender, a.incarnation, a.seq, a.version, a.meta, a.nbytes)
            == (b.kind, b.sender, b.incarnation, b.seq, b.version, b.meta, b.nbytes)
            and a.arrays.keys() == b.arrays.keys()
            and all(np.array_equal(a.arrays[k], b.arrays[k]) and a.arrays[k].dtype == b.arrays[k].dtype
                    for k in a.arrays))


# ------------------------------------------------------------------------- on the wire

def test_each_batch_comes_out_of_a_bundle_as_it_went_in() -> None:
    actors = [Actor("actor-0"), Actor("actor-1")]
    sent = [actors[0].batch(), actors[1].batch(32), actors[0].batch(8)]
    bundle = join(sent, seq=5)
    msg = decode(bundle)
    assert (msg.kind, msg.sender, msg.seq, len(bundle)) == (BUNDLE, "proxy-0", 5, 1)
    assert msg.arrays["reward"].shape == (64 + 32 + 8,)
    parts = unbundle(msg)
    originals = [decode(frames) for frames in sent]
    assert [(p.sender, p.seq) for p in parts] == [("actor-0", 0), ("actor-1", 0), ("actor-0", 1)]
    assert all(same(p, o) for p, o in zip(parts, originals, strict=True))


def test_batches_of_two_layouts_never_share_a_bundle() -> None:
    actor = Actor("actor-0")
    wide = actor.batch(obs=np.zeros((64, 6), np.float32), next_obs=np.zeros((64, 6), np.float32))
    with pytest.raises(WireError) as caught:
        join([actor.batch(), wide])
    assert caught.value.reason == "schema" and "actor-0" in str(caught.value)


def _bundle(parts: Any, rows: int = 4, **extra: Any) -> list[Any]:
    return encode(BUNDLE, sender="proxy-0", incarnation="p", seq=0, arrays={"reward": np.zeros(rows, np.float32)},
                  meta={"parts": parts, **extra})


@pytest.mark.parametrize("frames, reason, words", [
    (_bundle([["a", "i", 0, 0, 3, {}]]), "shape", "hold 3 rows, its arrays 4"),
    (_bundle([["a", "i", 0, 0, 3, {}], ["b", "i", 0, 0, 3, {}]]), "shape", "part 1 claims 3 rows; 1 of 4"),
    (_bundle([["a", "i", 0, 0, 0, {}], ["b", "i", 0, 0, 4, {}]]), "shape", "part 0 claims 0 rows"),
    (_bundle([["a", "i", 0, 0, 4.0, {}]]), "shape", "part 0 claims 4.0 rows"),
    (_bundle([["", "i", 0, 0, 4, {}]]), "meta", "bundle part 0: sender"),
    (_bundle([["a", "i", -1, 0, 4, {}]]), "meta", "bundle part 0: seq"),
    (_bundle([["a", "i", 0, 0, 4, []]]), "meta", "part 0: meta must be a JSON object"),
    (_bundle([["a", "i", 0, 0, 4]]), "meta", "part 0 must be [sender"),
    (_bundle([]), "meta", "a bundle's meta must be"),
    (_bundle([["a", "i", 0, 0, 4, {}]], extra=1), "meta", "a bundle's meta must be"),
])
def test_a_bad_bundle_is_refused_with_the_reason(frames: list[Any], reason: str, words: str) -> None:
    with pytest.raises(WireError) as caught:
        unbundle(decode(frames))
    assert caught.value.reason == reason and words in str(caught.value), caught.value


# ------------------------------------------------------------------------- in the learner

def test_the_learner_takes_bundles_apart_and_accounts_each_actor(tmp_path: Path, cartpole_cfg: Any,
                                                                 zctx: zmq.Context) -> None:
    learner: Learner = in_process_learner(cartpole_cfg("run.log_level=warning"), tmp_path / "run")
    push = zctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(learner.endpoints["data"])
    a, b = Actor("actor-a"), Actor("actor-b")
    try:
        first = [a.batch(), b.batch(), a.batch()]  # a 0, b 0, a 1
        push.send_multipart(join(first, seq=0))
        repeat = first[2]  # a 1 again: dropped as old; b 1 beside it goes in
        push.send_multipart(join([repeat, b.batch()], seq=1))
        junk = {**cartpole_batch(64, 9), "reward": np.full(64, 7.0, np.float32)}
        bad = encode(BUNDLE, sender="proxy-0", incarnation="p", seq=2, arrays=junk,
                     meta={"parts": [["actor-b", "x", 0, 3, 32, {}]]})  # 32 of 64 rows accounted
        push.send_multipart(bad)
        push.send_multipart(b.batch())  # b 2, alone: still in after the bad bundle
        ingest_until(learner, lambda: learner.batches == 5 and sum(learner.intake.receiver.rejected.values()) == 1)
        assert len(learner.replay) == 5 * 64 and learner.intake.receiver.rejected["shape"] == 1
        stored = learner.replay.sample(4096)["reward"]  # every stored row is an actor's (ones), not the bad one's
        assert np.all(stored == 1.0)
        actors = learner.summary_extra()["actors"]
        actor_a, actor_b = actors["actor-a"], actors["actor-b"]
        assert (actor_a["batches"], actor_a["transitions"], actor_a["dropped_old"]) == (2, 128, 1)
        assert (actor_b["batches"], actor_b["lost"]) == (3, 0)
        assert learner.book.env_steps == 2 * 64 + 3 * 64  # each actor's env_steps, counted once
        summary = learner.summary_extra()["messages"]
        assert summary["bundles_received"] == 2 and summary["batches_received"] == 5
        assert summary["batches_dropped_old"] == 1 and summary["rejected_total"] == 1
    finally:
        push.close(linger=0)
        learner.close()


# ------------------------------------------------------------------------- through a real proxy

def _through_proxy(tmp_path: Path, procs: Procs, merge: int, zctx: zmq.Context
                   ) -> tuple[list[Message], list[Message], dict[str, Any]]:
    """Three actors' batches through a proxy holding 300 ms (so a burst gathers them), one of another
    layout among them; returns the messages the learner's side received (all, and those after each
    actor's first batch) and the proxy's stats."""
    name = f"proxy-merge-{merge}"
    tap = zctx.socket(zmq.PULL)
    tap.setsockopt(zmq.LINGER, 0)
    tap_port = tap.bind_to_random_port("tcp://127.0.0.1")
    proxy_port = free_port()
    proc = procs.role(name, "proxy", "--bind", f"tcp://127.0.0.1:{proxy_port}", "--learner",
                      f"tcp://127.0.0.1:{tap_port}", "--run-dir", str(tmp_path / name), "--name", name,
                      overrides=["net.proxy_hold_ms=300", "net.stats_interval_s=60", f"net.proxy_merge={merge}"])
    actors = [Actor(f"actor-{i}") for i in range(3)]
    pushes = []
    for _ in actors:
        push = zctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(f"tcp://127.0.0.1:{proxy_port}")
        pushes.append(push)
    got: list[Message] = []

    def take(count: int) -> bool:
        while tap.poll(0):
            got.append(decode(tap.recv_multipart(), Limits.only({BATCH, BUNDLE})))
        return sum(len(unbundle(m)) if m.kind == BUNDLE else 1 for m in got) >= count

    wait_for(lambda: "actors connect to" in proc.text(), 60, f"{name} to bind", procs.describe)
    for push, actor in zip(pushes, actors, strict=True):  # a first batch each: every link up
        push.send_multipart(actor.batch())
    wait_for(lambda: take(3), 60, f"{name} to forward a first batch of each actor", procs.describe)
    first = len(got)
    wide = {"obs": np.zeros((64, 6), np.float32), "next_obs": np.zeros((64, 6), np.float32)}
    for round_ in range(4):  # 13 batches within a few ms: one or two bursts
        for push, actor in zip(pushes, actors, strict=True):
            push.send_multipart(actor.batch())
        if round_ == 1:
            pushes[0].send_multipart(actors[0].batch(**wide))
    wait_for(lambda: take(16), 60, f"{name} to forward 16 batches", procs.describe)
    assert proc.stop() == 0, procs.describe()
    stats = read_json(tmp_path / name / "roles" / f"{name}.json")
    assert stats is not None, procs.describe()
    return got, got[first:], stats


@pytest.mark.parametrize("merge", [32, 1])
@pytest.mark.slow
def test_a_proxy_sends_a_bursts_batches_joined(tmp_path: Path, procs: Procs, zctx: zmq.Context, merge: int) -> None:
    everything, got, stats = _through_proxy(tmp_path, procs, merge, zctx)
    batches = [p for m in got for p in (unbundle(m) if m.kind == BUNDLE else [m])]
    by_actor = {f"actor-{i}": [b.seq for b in batches if b.sender == f"actor-{i}"] for i in range(3)}
    assert by_actor == {"actor-0": [1, 2, 3, 4, 5], "actor-1": [1, 2, 3, 4], "actor-2": [1, 2, 3, 4]}, by_actor
    wide = [b for b in batches if b.arrays["obs"].shape[1:] == (6,)]
    assert len(wide) == 1 and wide[0].seq == 3
    bundles = [m for m in got if m.kind == BUNDLE]
    assert stats["forwarded"] == 16 and stats["bundles"] == sum(m.kind == BUNDLE for m in everything), stats
    if merge == 1:
        assert not bundles and len(got) == 13
    else:  # 13 batches in at most a few bursts, the wide one's run apart: far fewer messages than batches
        assert bundles and len(got) <= 6, [(m.kind, m.sender) for m in got]
        assert all(m.arrays["obs"].shape[1:] == (4,) for m in bundles)


def test_batches_a_proxy_cannot_join_go_each_as_it_came(tmp_path: Path, cartpole_cfg: Any,
                                                         zctx: zmq.Context) -> None:
    from zmqrl.roles.proxy import Proxy, _Pending
    from zmqrl.run.lifecycle import StopFlag

    tap = zctx.socket(zmq.PULL)
    tap.setsockopt(zmq.LINGER, 0)
    port = tap.bind_to_random_port("tcp://127.0.0.1")
    proxy = Proxy(cartpole_cfg("run.log_level=warning"), "tcp://127.0.0.1:0", f"tcp://127.0.0.1:{port}",
                  run_dir=str(tmp_path))
    try:
        actor = Actor("actor-0")
        wide = {"obs": np.zeros((64, 6), np.float32), "next_obs": np.zeros((64, 6), np.float32)}
        sent = [actor.batch(), actor.batch(**wide)]  # two layouts, as if both had been let into one bundle
        for frames in sent:
            header, views, _ = peek(frames)
            proxy.pending.append(_Pending(frames, header, views, 64, proxy.per_actor.admit("actor-0"), 1))
        with StopFlag() as stop:
            proxy.flush(stop)
        got = [decode(tap.recv_multipart()) for _ in sent if tap.poll(5000)]
        assert [(m.kind, m.seq, m.arrays["obs"].shape) for m in got] == [(BATCH, 0, (64, 4)), (BATCH, 1, (64, 6))]
        assert proxy.forwarded == 2 and proxy.bundles == 0 and not proxy.pending
    finally:
        proxy.close()
