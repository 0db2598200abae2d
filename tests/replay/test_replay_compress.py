"""replay.compress: frames kept compressed in the frame pool must come back byte for byte, cost a
fraction of their raw bytes on real Pong frames, and leave sampling and checkpoints unchanged."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from zmqrl.config import ConfigError
from zmqrl.config import load as load_config
from zmqrl.replay import FramePool, make_replay
from zmqrl.replay.frames import GRANULE
from zmqrl.run.startup import make_replay_from

CODECS = ["lz4", "zstd"]
PONG_YAML = "env:\n  id: ALE/Pong-v5\n  wrappers: [atari]\n  frame_stack: 4\n  num_envs: 2\nagent:\n  n_step: 3\n" \
            "replay:\n  capacity: {capacity}\n  prioritized: {prioritized}\n  compress: {compress}\n"


@pytest.fixture(scope="module")
def pong(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """Real n-step transitions of ALE Pong (random actions, two envs, stacks of 4 84x84 frames), with
    every 7th transition's newest frames replaced by noise that does not compress."""
    pytest.importorskip("ale_py")
    from zmqrl.bench.data import transition_pool

    path = tmp_path_factory.mktemp("pong") / "pong.yaml"
    path.write_text(PONG_YAML.format(capacity=100, prioritized="false", compress="none"))
    stream = transition_pool(load_config(path), 400, seed=3)
    rng = np.random.default_rng(0)
    for i in range(0, 400, 7):
        stream["next_obs"][i, -1] = rng.integers(0, 256, (84, 84), dtype=np.uint8)
    return stream


_distinct: list[np.ndarray] = []


def distinct_frames(stream: dict[str, np.ndarray]) -> np.ndarray:
    """The stream's distinct frames (found once per module: by their bytes as one opaque item)."""
    if not _distinct:
        frames = np.ascontiguousarray(np.concatenate([stream["obs"], stream["next_obs"]]).reshape(-1, 84 * 84))
        _, first = np.unique(frames.view(np.dtype((np.void, 84 * 84))).reshape(-1), return_index=True)
        _distinct.append(frames[np.sort(first)].reshape(-1, 84, 84))
    return _distinct[0]


def check_arena(pool: FramePool) -> None:
    """Live extents lie inside the handed-out arena, whole granules, none overlapping another."""
    live = np.flatnonzero(pool.refcount[: pool.high] > 0)
    assert np.all(pool._length[live] > 0)
    start = pool._offset[live]
    end = start + -(-pool._length[live].astype(np.int64) // GRANULE) * GRANULE
    order = np.argsort(start)
    assert np.all(start % GRANULE == 0) and (end.max(initial=0) <= pool._top)
    assert np.all(start[order][1:] >= end[order][:-1])


@pytest.mark.parametrize("codec", CODECS)
def test_real_frames_round_trip_exactly_at_a_fraction_of_their_bytes(pong: dict[str, np.ndarray], codec: str) -> None:
    frames = distinct_frames(pong)
    noisy = np.array([f.std() > 60 for f in frames])
    assert 50 < noisy.sum() < len(frames) - 300  # both kinds are there
    pool = FramePool((84, 84), np.dtype(np.uint8), reserve=16, compress=codec)
    order = np.random.default_rng(1).permutation(len(frames))
    slots = np.concatenate([pool.intern(frames[order[i : i + 50]]) for i in range(0, len(frames), 50)])
    assert len(pool) == len(frames)
    np.testing.assert_array_equal(pool.gather(slots), frames[order])
    by_slot = np.zeros((pool.high, 84, 84), np.uint8)
    by_slot[slots] = frames[order]
    picks = np.random.default_rng(2).choice(slots, (64, 2, 4))  # any shape of slots, repeats included
    np.testing.assert_array_equal(pool.gather(picks), by_slot[picks])
    again = pool.intern(frames[order])  # every frame is known: nothing stored anew
    np.testing.assert_array_equal(again, slots)
    assert len(pool) == len(frames) and pool.high == len(frames)
    lengths = pool._length[slots]
    pong_bytes = lengths[~noisy[order]].mean()
    assert pong_bytes < 7056 / 15  # Pong frames compress (lz4 ~26x, zstd ~40x, one frame at a time)
    assert lengths[noisy[order]].min() > 7000  # noise does not, and still round-trips
    assert pool.nbytes < pool._top + len(frames) * 24 + 100 * len(frames) + 1
    check_arena(pool)


@pytest.mark.parametrize("codec", CODECS)
def test_released_extents_are_reused_and_the_arena_compacted(pong: dict[str, np.ndarray], codec: str) -> None:
    frames = distinct_frames(pong)
    pool = FramePool((84, 84), np.dtype(np.uint8), reserve=8, compress=codec)
    rng = np.random.default_rng(2)
    held: dict[int, int] = {}  # slot -> frame row, one reference each
    compactions = 0
    compact = pool._compact

    def counted() -> None:
        nonlocal compactions
        compactions += 1
        compact()

    pool._compact = counted  # type: ignore[method-assign]
    for _ in range(60):
        rows = rng.choice(len(frames), 40, replace=False)
        rows = np.array([r for r in rows if r not in held.values()][:30], dtype=np.int64)
        slots = pool.intern(frames[rows])
        held.update(zip(slots.tolist(), rows.tolist(), strict=True))
        drop = rng.choice(list(held), max(0, len(held) - 60), replace=False)  # 60 frames stay alive
        pool.release(drop)
        for slot in drop.tolist():
            del held[slot]
        live = np.array(list(held), dtype=np.int64)
        np.testing.assert_array_equal(pool.gather(live), frames[[held[s] for s in live.tolist()]])
        check_arena(pool)
    assert len(pool) == len(held) == 60 and pool.high <= 60 + 30  # slots reused, not one per frame ever stored
    assert compactions >= 1  # a churn of mixed sizes leaves free extents that only compaction returns
    assert pool._top <= 2 * pool.compressed_nbytes + 64 * 1024


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("prioritized", [False, True])
def test_compressed_replay_samples_what_the_plain_one_does(pong: dict[str, np.ndarray], codec: str,
                                                            prioritized: bool) -> None:
    plain = make_replay(150, prioritized, seed=4, frame_stack=4)
    packed = make_replay(150, prioritized, seed=4, frame_stack=4, compress=codec)
    prio = np.random.default_rng(5).random(400)
    for i in range(0, 400, 25):  # the ring wraps: frames are released and their extents reused
        batch = {k: v[i : i + 25] for k, v in pong.items()}
        plain.add(batch, priorities=prio[i : i + 25])
        packed.add(batch, priorities=prio[i : i + 25])
    assert packed._pool is not None and packed._pool.compress == codec and len(packed._pool) == len(plain._pool)
    for _ in range(4):
        got, want = packed.sample(64), plain.sample(64)
        assert sorted(got) == sorted(want)
        for key in want:
            assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape, key
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        assert got["obs"].flags.writeable and got["next_obs"].flags.writeable
    assert packed.frames_nbytes < plain.frames_nbytes / 4  # (a seventh of the frames is noise)
    check_arena(packed._pool)


@pytest.mark.parametrize(("saved", "loaded"), [("lz4", "lz4"), ("zstd", "none"), ("none", "zstd")])
def test_checkpoint_round_trip_with_compression(pong: dict[str, np.ndarray], tmp_path: Path, saved: str,
                                                loaded: str) -> None:
    src = make_replay(120, True, seed=1, frame_stack=4, compress=saved)
    plain = make_replay(120, True, seed=1, frame_stack=4)
    for i in range(0, 300, 30):
        batch = {k: v[i : i + 30] for k, v in pong.items()}
        src.add(batch)
        plain.add(batch)
    path = str(tmp_path / "replay.npz")
    src.save(path)
    dst = make_replay(120, True, seed=9, frame_stack=4, compress=loaded)
    assert dst.load(path) == {}
    assert dst.state_dict() == src.state_dict() and dst._pool is not None and dst._pool.compress == loaded
    idx = np.arange(len(plain))
    for key, want in plain.get(idx).items():
        np.testing.assert_array_equal(dst.get(idx)[key], want, err_msg=key)
    for i in range(300, 400, 25):  # goes on after the load, evicting loaded frames
        batch = {k: v[i : i + 25] for k, v in pong.items()}
        dst.add(batch)
        plain.add(batch)
    for key, want in plain.get(idx).items():
        np.testing.assert_array_equal(dst.get(idx)[key], want, err_msg=key)
    if loaded != "none":
        check_arena(dst._pool)


def test_config_threads_compress_and_refuses_what_cannot_work(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "pong.yaml"
    path.write_text(PONG_YAML.format(capacity=100, prioritized="true", compress="zstd"))
    replay = make_replay_from(load_config(path))
    replay.add({"obs": np.zeros((2, 4, 84, 84), np.uint8), "next_obs": np.ones((2, 4, 84, 84), np.uint8),
                "reward": np.zeros(2, np.float32)})
    assert replay._pool is not None and replay._pool.compress == "zstd"
    with pytest.raises(ConfigError, match="replay.compress"):
        load_config(path, ["replay.compress=gzip"])
    with pytest.raises(ConfigError, match=r"replay.compress='lz4' needs replay.dedup_frames"):
        make_replay_from(load_config(path, ["replay.compress=lz4", "replay.dedup_frames=false"]))
    monkeypatch.setitem(sys.modules, "lz4", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "lz4.block", None)
    with pytest.raises(ConfigError, match=r"replay.compress='lz4': the lz4 package is not installed"):
        make_replay_from(load_config(path, ["replay.compress=lz4"]))
    with pytest.raises(ConfigError, match="replay.compress='brotli'"):
        FramePool((2, 2), np.dtype(np.uint8), 4, compress="brotli")
    vectors = make_replay(10, frame_stack=1, compress="zstd")  # no image frames: nothing to compress
    vectors.add({"obs": np.zeros((2, 4), np.float32), "next_obs": np.zeros((2, 4), np.float32)})
    assert vectors.frame_keys == () and vectors.frames_nbytes == 0
