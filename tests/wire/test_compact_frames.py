"""Image frames once per batch on the wire (:mod:`zmqrl.wire.compact`).

- Real Pong transitions from the actor's own acting loop go out compact (frames once, maybe lz4 or
  zstd) and come back as exactly the stacks they were, alone and joined in a real proxy's bundle.
- Each hostile variant (indices out of range, wrong dtype or shape, too many frames, frames of the
  wrong shape, data that does not decompress, a claim of a huge size) is refused with its reason,
  before anything large is allocated.
- End to end (slow): Catch through actor, proxy and learner processes with lz4 frames: every
  transition the actors sent is in the learner's replay, nothing refused.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from procs import REPO, Procs, wait_for, zmqrl_argv
from zmqrl import config
from zmqrl.frames import image_fields
from zmqrl.roles.addresses import free_port
from zmqrl.run.rundir import read_json
from zmqrl.wire import (
    BATCH,
    BUNDLE,
    DEFAULT_COPY_THRESHOLD,
    BatchEncoder,
    Limits,
    Message,
    WireError,
    batch_layout,
    check_batch_spec,
    decode,
    encode,
    encode_bundle,
    peek,
    unbundle,
)
from zmqrl.wire.compact import FRAMES_META, FrameCompactor, decompress, expand

pytestmark = pytest.mark.timeout(240)

PONG = REPO / "configs" / "pong_dqn.yaml"
CATCH = REPO / "configs" / "catch_dqn.yaml"


@pytest.fixture(scope="module")
def pong() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """256 transitions of the Pong config's actor (its acting loop: n-step, priorities), and the run's batch spec."""
    pytest.importorskip("ale_py")
    from zmqrl.bench.data import pong_transitions

    return pong_transitions(256, seed=5, config=PONG)


def needs(codec: str) -> None:
    """Skip where the codec's package is not installed (the ``all`` extra brings both)."""
    if codec != "none":
        pytest.importorskip("lz4.block" if codec == "lz4" else "zstandard")


def batches_of(batch: dict[str, np.ndarray], size: int) -> list[dict[str, np.ndarray]]:
    return [{k: v[lo:lo + size] for k, v in batch.items()} for lo in range(0, len(batch["reward"]), size)]


def send(encoder: BatchEncoder, seq: int, compactor: FrameCompactor, batch: dict[str, np.ndarray]) -> list[bytes]:
    arrays, meta = compactor.compact(batch)
    return [bytes(f) for f in encoder.encode(seq, 0, arrays, {"explore": 0.1, **meta})]


def assert_same(got: Message, want: dict[str, np.ndarray]) -> None:
    assert set(got.arrays) == set(want), (sorted(got.arrays), sorted(want))
    for key, value in want.items():
        assert got.arrays[key].dtype == value.dtype and np.array_equal(got.arrays[key], value), key


@pytest.mark.parametrize("codec", ["none", "lz4", "zstd"])
@pytest.mark.slow
def test_pong_batches_come_back_as_the_stacks_they_were(pong: Any, codec: str) -> None:
    spec, batch = pong
    assert image_fields(spec) == ("obs", "next_obs") and batch["obs"].shape[1:] == (4, 84, 84)
    needs(codec)
    compactor = FrameCompactor(image_fields(spec), codec)
    encoder = BatchEncoder("actor-0", "inc", pack_below=DEFAULT_COPY_THRESHOLD)
    wire = full = 0
    for seq, part in enumerate(batches_of(batch, 32)):
        frames = send(encoder, seq, compactor, part)
        msg = decode(frames)
        assert "obs" not in msg.arrays and msg.arrays["obs_frames"].shape == (32, 4)
        restored = expand(msg, spec)
        assert check_batch_spec(restored, spec) == 32
        assert_same(restored, part)
        wire += sum(len(f) for f in frames)
        full += sum(a.nbytes for a in part.values())
    frame = 84 * 84
    assert compactor.frames / compactor.transitions < 2.5  # of the 8 frames a transition's stacks hold
    assert wire < full / (3 if codec == "none" else 20), (codec, wire, full)
    print(f"{codec}: {compactor.frames / compactor.transitions:.2f} frames, {wire / len(batch['reward']) / frame:.3f} "
          f"frames' bytes per transition on the wire")


def test_compact_pong_batches_through_a_proxys_bundle(pong: Any, tmp_path: Path, zctx: zmq.Context) -> None:
    """Three actors' lz4 batches go through a real proxy's sockets, joined into one bundle; the learner's
    side takes it apart and rebuilds each actor's stacks exactly (raw frames: joined by encode_bundle)."""
    from zmqrl.roles.proxy import Proxy
    from zmqrl.run.lifecycle import StopFlag

    spec, batch = pong
    needs("lz4")
    parts = batches_of(batch, 32)[:3]
    tap = zctx.socket(zmq.PULL)
    tap.setsockopt(zmq.LINGER, 0)
    port = tap.bind_to_random_port("tcp://127.0.0.1")
    proxy = Proxy(config.load(CATCH, ["run.log_level=warning"]), "tcp://127.0.0.1:0", f"tcp://127.0.0.1:{port}",
                  run_dir=str(tmp_path))
    pushes = []
    try:
        sent = []
        for i, part in enumerate(parts):
            push = zctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            push.connect(proxy.bind_addr)
            pushes.append(push)
            frames = send(BatchEncoder(f"actor-{i}", f"inc-{i}", pack_below=DEFAULT_COPY_THRESHOLD), 0,
                          FrameCompactor(image_fields(spec), "lz4"), part)
            assert sum(len(f) for f in frames) < DEFAULT_COPY_THRESHOLD  # small enough to be joined
            push.send_multipart(frames)
            sent.append(frames)
        with StopFlag() as stop:
            handled = 0
            while handled < 3:
                assert proxy.pull.poll(5000), "the proxy got no batch"
                got = proxy._read()
                if got is not None:
                    proxy.handle(got, stop)
                    handled += 1
            proxy.flush(stop)
        assert tap.poll(5000)
        bundle = decode(tap.recv_multipart(), Limits.only({BATCH, BUNDLE}))
        assert bundle.kind == BUNDLE and proxy.bundles == 1 and proxy.forwarded == 3
        batches = unbundle(bundle)
        assert [b.sender for b in batches] == ["actor-0", "actor-1", "actor-2"]
        for got_part, want in zip(batches, parts, strict=True):
            assert_same(expand(got_part, spec), want)
    finally:
        for push in pushes:
            push.close()
        proxy.close()
    # uncompressed compact batches (too large for the proxy to join) bundle and unbundle the same way
    raw = [send(BatchEncoder(f"actor-{i}", "inc"), 0, FrameCompactor(image_fields(spec)), part)
           for i, part in enumerate(parts)]
    peeked = [peek(frames) for frames in raw]
    layouts = [batch_layout(specs) for _, _, specs in peeked]
    assert all(layout is not None and layout == layouts[0] for layout in layouts)
    joined = encode_bundle("proxy", "p", 0, [(h, v, 32) for h, v, _ in peeked])
    for got_part, want in zip(unbundle(decode(joined)), parts, strict=True):
        assert_same(expand(got_part, spec), want)


@pytest.mark.slow
def test_the_learner_stores_frames_as_they_came_and_never_rebuilds_a_stack(
        pong: Any, tmp_path: Path, zctx: zmq.Context, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compact Pong batches from the data socket into a learner's replay: each goes in as it came
    (``replay.add_frames``, never ``add`` with stacks), replay's pool holds the distinct frames that came
    (about one per transition, not eight), and the items are exactly the actor's stacks."""
    from zmqrl.roles.learner import Learner

    spec, batch = pong
    cfg = config.load(PONG, ["run.log_level=warning", "run.device=cpu", "env.backend=gymnasium",
                             "replay.capacity=1024", "trainer.stop_return=null"])
    learner = Learner(cfg, tmp_path / "run", *(f"tcp://127.0.0.1:{free_port()}" for _ in range(3)))
    calls = {"add": 0, "add_frames": 0}
    for name in calls:
        real = getattr(learner.replay, name)

        def counted(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(learner.replay, name, counted)
    push = zctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(learner.endpoints["data"])
    compactor = FrameCompactor(image_fields(spec))
    parts = batches_of(batch, 64)
    try:
        for seq, part in enumerate(parts):
            push.send_multipart(send(BatchEncoder("actor-0", "inc"), seq, compactor, part))
        deadline = time.monotonic() + 60
        while len(learner.replay) < len(batch["reward"]):
            assert time.monotonic() < deadline, f"{len(learner.replay)} of {len(batch['reward'])} in replay"
            learner.ingest(timeout=0.1)
        stored = learner.replay.get(np.arange(len(batch["reward"])))
        for key in ("obs", "next_obs", "action", "reward", "discount"):
            np.testing.assert_array_equal(stored[key], batch[key], err_msg=key)
        pool = learner.replay._pool
        assert pool is not None and len(pool) <= compactor.frames  # each frame that came, once (shared across batches)
        assert len(pool) / len(batch["reward"]) < 2.0, len(pool)
        assert learner.intake.receiver.compact_batches == len(parts) and learner.rejected_total() == 0
        assert calls == {"add": 0, "add_frames": len(parts)}, calls
    finally:
        push.close()
        learner.close()


# ------------------------------------------------------------------------- hostile compact batches

STACK, SIZE, N = 4, 12, 8
SPEC = {"obs": (np.dtype(np.uint8), (STACK, SIZE, SIZE)), "action": (np.dtype(np.int64), ()),
        "reward": (np.dtype(np.float32), ()), "next_obs": (np.dtype(np.uint8), (STACK, SIZE, SIZE)),
        "discount": (np.dtype(np.float32), ())}


def honest(seed: int = 0) -> dict[str, np.ndarray]:
    """A batch of one env's consecutive stacks (frames shared as in a real episode)."""
    rng = np.random.default_rng(seed)
    video = rng.integers(0, 255, (N + STACK + 1, SIZE, SIZE), dtype=np.uint8)
    t = np.arange(N)
    stacks = np.stack([video[t + k] for k in range(STACK + 1)], axis=1)
    return {"obs": stacks[:, :STACK], "action": np.zeros(N, np.int64), "reward": np.ones(N, np.float32),
            "next_obs": stacks[:, 1:], "discount": np.full(N, 0.99, np.float32)}


def compact(codec: str = "none", **changes: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    arrays, meta = FrameCompactor(("obs", "next_obs"), codec).compact(honest())
    assert "frames" in arrays or FRAMES_META in meta
    arrays.update(changes)
    return arrays, meta


def hostile_cases() -> list[tuple[str, str, dict[str, np.ndarray], dict[str, Any]]]:
    arrays, _ = compact()
    k = len(arrays["frames"])
    lz4_arrays, lz4_meta = compact("lz4")
    zstd_arrays, zstd_meta = compact("zstd")
    import zstandard

    bomb = np.frombuffer(zstandard.ZstdCompressor(level=1).compress(bytes(200 * 2**20)), np.uint8)
    return [
        ("index past the frames", "compact", {**arrays, "obs_frames": np.full((N, STACK), k, np.int32)}, {}),
        ("negative index", "compact", {**arrays, "next_obs_frames": np.full((N, STACK), -1, np.int32)}, {}),
        ("int64 indices", "compact", {**arrays, "obs_frames": arrays["obs_frames"].astype(np.int64)}, {}),
        ("indices of the wrong shape", "compact", {**arrays, "obs_frames": arrays["obs_frames"][:, :2].copy()}, {}),
        ("more frames than stacks", "compact", {**arrays, "frames": np.zeros((2 * N * STACK + 1, SIZE, SIZE),
                                                                             np.uint8)}, {}),
        ("frames of another shape", "compact", {**arrays, "frames": np.zeros((k, SIZE, SIZE + 1), np.uint8)}, {}),
        ("float frames", "compact", {**arrays, "frames": arrays["frames"].astype(np.float32)}, {}),
        ("stacks and indices", "compact", {**arrays, "obs": honest()["obs"]}, {}),
        ("no frames", "compact", {key: v for key, v in arrays.items() if key != "frames"}, {}),
        ("lz4 that does not decompress", "compress", {**lz4_arrays, "frames_lz4": np.full(64, 7, np.uint8)}, lz4_meta),
        ("lz4 of fewer frames than claimed", "compress", lz4_arrays, {FRAMES_META: lz4_meta[FRAMES_META] + 1}),
        ("a frame count past the stacks", "compact", lz4_arrays, {FRAMES_META: 10**12}),
        ("no frame count", "compact", lz4_arrays, {}),
        ("a zstd frame claiming 200 MB", "compress", {**zstd_arrays, "frames_zstd": bomb}, zstd_meta),
        ("zstd junk", "compress", {**zstd_arrays, "frames_zstd": np.arange(100, dtype=np.uint8)}, zstd_meta),
    ]


@pytest.mark.parametrize("case", range(15))
def test_a_hostile_compact_batch_is_refused_with_its_reason(case: int) -> None:
    needs("lz4")
    needs("zstd")
    what, reason, arrays, meta = hostile_cases()[case]
    msg = decode(encode(BATCH, sender="rogue", incarnation="r", seq=0, version=0, arrays=arrays, meta=meta))
    with pytest.raises(WireError) as err:
        check_batch_spec(expand(msg, SPEC), SPEC)
    assert err.value.reason == reason, (what, str(err.value))


def test_a_batch_of_few_indices_cannot_expand_past_the_message_limit() -> None:
    """A million rows of indices into one frame: 16 MB on the wire, 226 GB of stacks. Refused unmade."""
    n = 1_000_000
    idx = np.zeros((n, STACK), np.int32)
    arrays = {"frames": np.zeros((1, SIZE, SIZE), np.uint8), "obs_frames": idx, "next_obs_frames": idx,
              "action": np.zeros(n, np.int64), "reward": np.zeros(n, np.float32), "discount": np.zeros(n, np.float32)}
    msg = Message(BATCH, "rogue", "r", 0, 0, arrays)
    with pytest.raises(WireError) as err:
        expand(msg, SPEC, Limits(max_message_bytes=64 * 2**20))
    assert err.value.reason == "size"


def test_decompress_never_makes_more_than_it_was_told() -> None:
    lz4 = pytest.importorskip("lz4.block")

    data = np.frombuffer(lz4.compress(bytes(10_000), store_size=False), np.uint8)
    assert decompress("lz4", data, 10_000).nbytes == 10_000
    for size in (9_999, 10_001):
        with pytest.raises(WireError, match="compress"):
            decompress("lz4", data, size)


def test_a_batch_that_shares_nothing_goes_as_it_came() -> None:
    rng = np.random.default_rng(1)
    batch = {**honest(), "obs": rng.integers(0, 255, (N, STACK, SIZE, SIZE), dtype=np.uint8),
             "next_obs": rng.integers(0, 255, (N, STACK, SIZE, SIZE), dtype=np.uint8)}
    compactor = FrameCompactor(("obs", "next_obs"))
    arrays, meta = compactor.compact(batch)
    assert arrays.keys() == batch.keys() and not meta and compactor.full == 1
    assert expand(Message(BATCH, "a", "i", 0, 0, arrays), SPEC).arrays is arrays  # today's format as it is


def test_equal_fingerprints_of_different_frames_are_not_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every fingerprint made equal (a collision each time): frames are still compared byte for byte."""
    from zmqrl.wire import compact as module

    compactor = FrameCompactor(("obs", "next_obs"))
    compactor._prints = module.Fingerprints(SIZE * SIZE)
    compactor._prints.mult[:] = 0
    batch = honest(3)
    batch["obs"][:, :, 0, :8] = 1  # every frame's first 8 bytes alike: only they are fingerprinted, below
    batch["next_obs"][:, :, 0, :8] = 1
    compactor._prints.mult[1:] = 0
    arrays, _ = compactor.compact(batch)
    assert_same(expand(Message(BATCH, "a", "i", 0, 0, arrays), SPEC), batch)
    assert compactor.full == 1  # one fingerprint for all: every frame but the first its own, no smaller
    compactor._prints.mult[:] = 1  # a plain sum: frames with one byte moved collide, yet differ
    batch["obs"][:, :, 1, 0], batch["obs"][:, :, 1, 1] = 3, 5
    batch["next_obs"][:, :, 1, 0], batch["next_obs"][:, :, 1, 1] = 5, 3
    arrays, _ = compactor.compact(batch)
    assert "frames" in arrays and compactor.batches == 1
    assert_same(expand(Message(BATCH, "a", "i", 0, 0, arrays), SPEC), batch)


# ------------------------------------------------------------------------- end to end


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_catch_through_actor_proxy_and_learner_with_lz4_frames(tmp_path: Path, procs: Procs) -> None:
    """Two actors' Catch batches (84x84 frames) go compact and lz4-compressed through a proxy, which
    joins them into bundles; every transition the actors sent is in the learner's replay."""
    needs("lz4")
    run_dir = tmp_path / "run"
    ports = {k: free_port() for k in ("data", "model", "eval", "proxy")}
    sets = ["run.seed=4", "net.compress=lz4", "trainer.stop_return=null", "trainer.warmup=100000",
            "replay.capacity=100000", "actor.num_actors=2", "net.stats_interval_s=0.5", "net.proxy_hold_ms=50"]

    tcp = "tcp://127.0.0.1:{}".format
    procs.start("learner", zmqrl_argv("learner", "--run-dir", str(run_dir), "--bind-data", tcp(ports["data"]),
                                      "--bind-model", tcp(ports["model"]), "--bind-eval", tcp(ports["eval"]),
                                      overrides=sets, config=CATCH))
    procs.start("proxy", zmqrl_argv("proxy", "--bind", tcp(ports["proxy"]), "--learner", tcp(ports["data"]),
                                    "--run-dir", str(run_dir), overrides=sets, config=CATCH))
    for i in (0, 1):
        procs.start(f"actor-{i}", zmqrl_argv("actor", "--id", str(i), "--proxy", tcp(ports["proxy"]), "--learner",
                                             tcp(ports["model"]), "--run-dir", str(run_dir), overrides=sets,
                                             config=CATCH))

    def sending() -> bool:
        assert all(p.alive() for p in procs.procs.values()), procs.describe()
        actors = (read_json(run_dir / "summary.json") or {}).get("actors") or {}
        return all(actors.get(f"actor-{i}", {}).get("batches", 0) >= 15 for i in (0, 1))

    wait_for(sending, 150, "15 batches from each actor at the learner", procs.describe)
    for name in ("actor-0", "actor-1", "proxy", "learner"):
        procs[name].signal(15)
        assert procs[name].wait(30) == 0, procs.describe()
    sent = [read_json(run_dir / "roles" / f"actor-{i}.json") for i in (0, 1)]
    assert all(s is not None for s in sent), procs.describe()
    summary = read_json(run_dir / "summary.json")
    assert summary is not None
    msgs = summary["messages"]
    assert msgs["rejected_total"] == 0 and msgs["batches_lost"] == 0, msgs
    transitions = sum(s["transitions"] for s in sent if s is not None)
    assert summary["replay_size"] == summary["transitions_inserted"] == transitions, (summary["replay_size"], sent)
    wire = summary["wire"]
    assert wire["compact_batches"] == msgs["batches_received"] == sum(s["batches"] for s in sent if s is not None)
    assert msgs["bundles_received"] > 0, msgs  # lz4 batches are small: the proxy joined them
    assert wire["bytes_per_transition"] < 84 * 84 / 4, wire  # vs 2 frames of 84x84 per transition uncompressed
