"""Image frames stored once: replay contents must match plain storage exactly, at a fraction of the bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from zmqrl.config import load as load_config
from zmqrl.replay import FramePool, UniformReplay, make_replay
from zmqrl.run.adders import NStepBuilder
from zmqrl.run.startup import make_replay_from

STACK, SIDE, ENVS, N_STEP = 4, 12, 3, 3


def stacked_stream(steps: int, seed: int = 0, episode_len: int = 17) -> list[dict[str, np.ndarray]]:
    """n-step transitions of ``ENVS`` envs whose obs are stacks of the last ``STACK`` frames.

    Every step brings one new random frame; a reset repeats the first frame ``STACK`` times
    (as gymnasium's FrameStackObservation does), and episodes end by termination.
    """
    rng = np.random.default_rng(seed)

    def frame() -> np.ndarray:
        return rng.integers(0, 256, (SIDE, SIDE), dtype=np.uint8)

    stacks = [np.stack([f] * STACK) for f in (frame() for _ in range(ENVS))]
    ages = rng.integers(0, episode_len, ENVS)
    builder = NStepBuilder(ENVS, N_STEP, 0.99)
    batches = []
    for _ in range(steps):
        obs = np.stack(stacks)
        ages += 1
        done = ages >= episode_len
        next_obs = np.stack([np.concatenate([s[1:], frame()[None]]) for s in stacks])
        out = builder.push(obs, rng.integers(0, 6, ENVS), rng.random(ENVS).astype(np.float32), next_obs,
                           done, np.zeros(ENVS, dtype=bool))
        for e in range(ENVS):
            if done[e]:
                first = frame()
                stacks[e] = np.stack([first] * STACK)
                ages[e] = 0
            else:
                stacks[e] = next_obs[e]
        if out is not None:
            batches.append(out)
    return batches


def fill(replays: list[UniformReplay], batches: list[dict[str, np.ndarray]], chunk: int = 5) -> None:
    """Add the transitions in batches of about ``chunk`` steps' worth, with random priorities."""
    rng = np.random.default_rng(1)
    for i in range(0, len(batches), chunk):
        part = batches[i : i + chunk]
        batch = {k: np.concatenate([b[k] for b in part]) for k in part[0]}
        prio = rng.random(len(batch["reward"]))
        for r in replays:
            r.add(batch, priorities=prio)


def assert_same_contents(a: UniformReplay, b: UniformReplay) -> None:
    assert len(a) == len(b)
    idx = np.arange(len(a))
    got, want = a.get(idx), b.get(idx)
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape, key
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def check_refcounts(replay: UniformReplay) -> None:
    pool = replay._pool
    assert pool is not None
    refs = np.concatenate([replay._frame_refs[k][: len(replay)].reshape(-1) for k in replay.frame_keys])
    expected = np.bincount(refs, minlength=pool.high)
    np.testing.assert_array_equal(pool.refcount[: pool.high], expected)
    assert len(pool) == np.count_nonzero(expected)


@pytest.mark.parametrize("prioritized", [False, True])
def test_frames_stored_once_match_plain_storage_through_wraparound(prioritized: bool) -> None:
    plain = make_replay(64, prioritized, seed=3)
    shared = make_replay(64, prioritized, seed=3, frame_stack=STACK)
    batches = stacked_stream(200)
    fill([plain, shared], batches)
    assert shared.frame_keys == ("obs", "next_obs") and plain.frame_keys == ()
    assert shared.num_added == plain.num_added > 3 * shared.capacity  # the ring wrapped several times
    assert_same_contents(shared, plain)
    check_refcounts(shared)
    for _ in range(5):  # same seed, same priorities: the same samples
        s, p = shared.sample(32), plain.sample(32)
        for key in p:
            np.testing.assert_array_equal(s[key], p[key], err_msg=key)
    # one new frame per transition plus resets and the n-step tails still referenced
    pool = shared._pool
    assert pool is not None and len(pool) <= shared.capacity + ENVS * (STACK + N_STEP) + 12
    frame_bytes = SIDE * SIDE
    assert pool.high * frame_bytes < 0.3 * (plain.nbytes - shared.nbytes + pool.high * frame_bytes)


def test_frame_bytes_ratio_is_under_goal_at_realistic_size() -> None:
    plain = UniformReplay(500)
    shared = UniformReplay(500, frame_stack=STACK)
    fill([plain, shared], stacked_stream(600, seed=4, episode_len=200), chunk=20)
    item_bytes = 2 * STACK * SIDE * SIDE
    image_part = lambda r: r.nbytes - sum(a.nbytes for k, a in r._storage.items() if k not in ("obs", "next_obs"))  # noqa: E731
    assert image_part(plain) == 500 * item_bytes
    assert image_part(shared) / image_part(plain) < 0.35


@pytest.mark.parametrize("compress", ["none", "lz4", "zstd"])
def test_fingerprint_collisions_never_share_different_frames(compress: str) -> None:
    plain = UniformReplay(40, seed=0)
    shared = UniformReplay(40, seed=0, frame_stack=STACK, compress=compress)
    shared.add({k: v[:1] for k, v in stacked_stream(5)[-1].items()})
    assert shared._pool is not None
    shared._pool._mult[:] = 0  # every frame now has fingerprint 0
    plain.add({k: v[:1] for k, v in stacked_stream(5)[-1].items()})
    batches = stacked_stream(60, seed=9)
    fill([plain, shared], batches)
    assert_same_contents(shared, plain)
    check_refcounts(shared)


def test_save_load_round_trip_with_frames(tmp_path: Path) -> None:
    batches = stacked_stream(120, seed=5)
    src = make_replay(50, True, seed=1, frame_stack=STACK)
    plain = make_replay(50, True, seed=1)
    fill([src, plain], batches[:80])
    path = str(tmp_path / "replay.npz")
    src.save(path)
    dst = make_replay(50, True, seed=7, frame_stack=STACK)
    dst.load(path)
    assert dst.state_dict() == src.state_dict() and dst.frame_keys == src.frame_keys
    assert_same_contents(dst, plain)
    check_refcounts(dst)
    fill([dst, plain], batches[80:])  # keeps going after the load, evicting loaded frames
    assert_same_contents(dst, plain)
    check_refcounts(dst)


def test_channels_last_images_are_stored_as_frames_of_their_last_two_axes() -> None:
    batches = stacked_stream(80, seed=2)
    channels_last = [{k: (np.moveaxis(v, 1, -1).copy() if k in ("obs", "next_obs") else v) for k, v in b.items()}
                     for b in batches]
    plain = UniformReplay(30)
    shared = UniformReplay(30, frame_stack=STACK)  # (12, 12, 4) items: 12 frames of (12, 4) each
    fill([plain, shared], channels_last)
    assert shared._frame_refs["obs"].shape == (30, 12) and shared._pool is not None
    assert shared._pool.frame_shape == (12, 4)
    assert_same_contents(shared, plain)
    check_refcounts(shared)


def test_only_uint8_images_are_pooled_and_schema_is_still_checked() -> None:
    vectors = UniformReplay(10, frame_stack=1)
    vectors.add({"obs": np.zeros((2, 4), np.float32), "next_obs": np.zeros((2, 4), np.float32)})
    assert vectors.frame_keys == ()
    images = UniformReplay(10, frame_stack=STACK)
    batch = {k: v[:2] for k, v in stacked_stream(3)[-1].items()}
    images.add(batch)
    with pytest.raises(ValueError, match="'obs': expected per-item shape"):
        images.add({**batch, "obs": batch["obs"][:, :2]})
    with pytest.raises(ValueError, match="'next_obs': expected dtype"):
        images.add({**batch, "next_obs": batch["next_obs"].astype(np.int16)})
    assert len(images) == 2
    check_refcounts(images)


@pytest.mark.parametrize("compress", ["none", "lz4", "zstd"])
def test_pool_release_frees_and_reuses_slots(compress: str) -> None:
    pool = FramePool((3, 3), np.dtype(np.uint8), reserve=2, compress=compress)
    frames = np.arange(4 * 9, dtype=np.uint8).reshape(4, 3, 3)
    slots = pool.intern(np.concatenate([frames, frames[:2]]))  # 4 distinct, two of them twice
    assert len(pool) == 4 and pool.high == 4  # grew past its reserve of 2
    np.testing.assert_array_equal(slots[4:], slots[:2])
    np.testing.assert_array_equal(pool.gather(slots), np.concatenate([frames, frames[:2]]))
    pool.release(slots[2:4])
    assert len(pool) == 2
    again = pool.intern(frames[3:])  # stored anew in a freed slot, not past the high-water mark
    assert pool.high == 4 and again[0] in slots[2:4]
    np.testing.assert_array_equal(pool.gather(np.concatenate([slots[:2], again])), frames[[0, 1, 3]])
    with pytest.raises(RuntimeError, match="more references"):
        pool.release(np.array([slots[2], slots[2], slots[2]]))


def test_make_replay_from_config_pools_stacked_atari_frames(tmp_path: Path) -> None:
    path = tmp_path / "atari.yaml"
    path.write_text("env:\n  id: ALE/Pong-v5\n  wrappers: [atari]\n  frame_stack: 4\nreplay:\n  capacity: 100\n")
    replay = make_replay_from(load_config(path))
    assert replay._frame_stack == 4
    off = make_replay_from(load_config(path, ["replay.dedup_frames=false"]))
    assert off._frame_stack == 0


# ------------------------------------------------------------------------- frames as the wire brings them


def compact(batch: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], np.ndarray, dict[str, np.ndarray]]:
    """A batch as the wire brings it: the other fields, its distinct frames, each image field's indices."""
    from zmqrl.wire.compact import FrameCompactor

    arrays, _ = FrameCompactor(("obs", "next_obs")).compact(batch)
    assert "frames" in arrays
    frames = arrays.pop("frames")
    indices = {k: arrays.pop(f"{k}_frames") for k in ("obs", "next_obs")}
    return arrays, frames, indices


@pytest.mark.parametrize("prioritized", [False, True])
@pytest.mark.parametrize("compress", ["none", "lz4"])
def test_frames_as_they_came_are_the_same_items_as_their_stacks(prioritized: bool, compress: str) -> None:
    """``add_frames`` (frames once, no stack built) against ``add`` of the stacks, through wraparound:
    the same items, the same samples, the same frames held once; a replay that keeps stacks as given
    builds them from the frames."""
    stacks = make_replay(64, prioritized, seed=3, frame_stack=STACK, compress=compress)
    frames_once = make_replay(64, prioritized, seed=3, frame_stack=STACK, compress=compress)
    given = make_replay(64, prioritized, seed=3)
    rng = np.random.default_rng(1)
    batches = stacked_stream(200)
    for i in range(0, len(batches), 5):
        batch = {k: np.concatenate([b[k] for b in batches[i:i + 5]]) for k in batches[i]}
        prio = rng.random(len(batch["reward"]))
        stacks.add(batch, priorities=prio)
        rest, frames, indices = compact(batch)
        frames_once.add_frames(rest, frames, indices, priorities=prio)
        given.add_frames(rest, frames, indices, priorities=prio)
        assert frames_once.new_frames == stacks.new_frames
    assert frames_once.num_added == stacks.num_added > 3 * stacks.capacity
    assert_same_contents(frames_once, stacks)
    assert_same_contents(given, stacks)
    check_refcounts(frames_once)
    assert frames_once._pool is not None and stacks._pool is not None
    assert len(frames_once._pool) == len(stacks._pool)
    for _ in range(3):
        a, b = frames_once.sample(16), stacks.sample(16)
        for key in b:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_frames_no_index_names_are_not_kept_and_given_fingerprints_are_checked() -> None:
    replay = make_replay(32, True, seed=0, frame_stack=STACK)
    plain = make_replay(32, True, seed=0)
    batch = {k: v[:6] for k, v in stacked_stream(8)[-1].items()}
    rest, frames, indices = compact(batch)
    extra = np.random.default_rng(5).integers(0, 256, (7, SIDE, SIDE), dtype=np.uint8)  # named by no index
    wrong = np.zeros(len(frames) + 7, np.uint64)  # every fingerprint the same: the bytes still decide
    replay.add_frames(rest, np.concatenate([frames, extra]), indices, fingerprints=wrong)
    plain.add(batch)
    assert_same_contents(replay, plain)
    check_refcounts(replay)
    assert replay._pool is not None and len(replay._pool) == len(np.unique(frames.reshape(len(frames), -1), axis=0))


@pytest.mark.parametrize("what", ["index past the frames", "negative index", "float indices", "indices of a stack less",
                                  "frames of another size", "int16 frames", "an image field without indices",
                                  "a field too many", "more new frames than allowed"])
def test_frames_or_indices_that_do_not_fit_are_refused_and_nothing_is_stored(what: str) -> None:
    replay = make_replay(32, True, seed=0, frame_stack=STACK)
    first = {k: v[:4] for k, v in stacked_stream(8, seed=1)[-1].items()}
    replay.add(first)
    before = (len(replay), replay.num_added, replay.state_dict(), replay._pool.high if replay._pool else 0)
    rest, frames, indices = compact({k: v[:6] for k, v in stacked_stream(8, seed=2)[-1].items()})
    k, max_new = len(frames), None
    if what == "index past the frames":
        indices["obs"] = np.full_like(indices["obs"], k)
    elif what == "negative index":
        indices["next_obs"] = np.full_like(indices["next_obs"], -1)
    elif what == "float indices":
        indices["obs"] = indices["obs"].astype(np.float32)
    elif what == "indices of a stack less":
        indices["obs"] = indices["obs"][:, 1:]
    elif what == "frames of another size":
        frames = np.zeros((k, SIDE, SIDE + 1), np.uint8)
    elif what == "int16 frames":
        frames = frames.astype(np.int16)
    elif what == "an image field without indices":
        del indices["next_obs"]
    elif what == "a field too many":
        rest["extra"] = np.zeros(6, np.float32)
    else:
        max_new = 2
    with pytest.raises(ValueError):
        replay.add_frames(rest, frames, indices, max_new_frames=max_new)
    assert (len(replay), replay.num_added, replay.state_dict(), replay._pool.high if replay._pool else 0) == before
    check_refcounts(replay)


def test_priorities_of_a_batch_skip_the_items_written_since_it_was_drawn() -> None:
    """The learner writes a step's priorities one step late; items added meanwhile that took the place
    of some the step drew keep their own priority (``sampled_at``), the rest get the step's."""
    replay = make_replay(10, True, seed=0, alpha=1.0, eps=0.0)
    def batch(n: int, start: int) -> dict[str, np.ndarray]:
        return {"obs": np.arange(start, start + n, dtype=np.float32)[:, None], "reward": np.zeros(n, np.float32)}
    replay.add(batch(10, 0), priorities=np.ones(10))
    drawn, sampled_at = np.arange(10), replay.num_added
    replay.add(batch(3, 10), priorities=np.full(3, 7.0))  # slots 0, 1, 2 now hold new items
    assert replay.written_since(drawn, sampled_at).tolist() == [True] * 3 + [False] * 7
    replay.update_priorities(drawn, np.full(10, 2.0), sampled_at=sampled_at)
    np.testing.assert_allclose(replay.tree.get(drawn), [7.0] * 3 + [2.0] * 7)
    replay.update_priorities(drawn, np.full(10, 3.0))  # without sampled_at: every one
    np.testing.assert_allclose(replay.tree.get(drawn), np.full(10, 3.0))
    replay.add(batch(25, 20))  # more than the whole ring since: nothing of the batch is left
    assert replay.written_since(drawn, sampled_at).all()
    replay.update_priorities(drawn, np.full(10, 9.0), sampled_at=replay.num_added - 25)
    assert not np.any(replay.tree.get(drawn) == 9.0)
