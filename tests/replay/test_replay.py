"""Tests for the ring replay, the sum tree and prioritized replay."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from zmqrl.replay import PrioritizedReplay, SumTree, UniformReplay, make_replay


def make_batch(start: int, n: int) -> dict[str, np.ndarray]:
    """Items numbered start..start+n-1 so stored contents are easy to check."""
    ids = np.arange(start, start + n)
    return {
        "obs": np.stack([ids, -ids], axis=1).astype(np.float32),
        "action": ids.astype(np.int64),
        "reward": ids.astype(np.float32),
        "frame": np.broadcast_to(ids[:, None, None] % 256, (n, 2, 3)).astype(np.uint8),
    }


def stored_ids(buf: UniformReplay) -> np.ndarray:
    return buf.get(np.arange(len(buf)))["action"]


# ---------------------------------------------------------------- ring buffer


def test_ring_wraparound_contents_and_indices() -> None:
    buf = UniformReplay(5, seed=0)
    assert len(buf) == 0 and buf.capacity == 5
    np.testing.assert_array_equal(buf.add(make_batch(0, 3)), [0, 1, 2])
    assert len(buf) == 3
    np.testing.assert_array_equal(buf.add(make_batch(3, 4)), [3, 4, 0, 1])
    assert len(buf) == 5
    np.testing.assert_array_equal(stored_ids(buf), [5, 6, 2, 3, 4])
    np.testing.assert_array_equal(buf.add(make_batch(7, 2)), [2, 3])
    items = buf.get(np.arange(5))
    np.testing.assert_array_equal(items["action"], [5, 6, 7, 8, 4])
    np.testing.assert_array_equal(items["obs"][:, 1], -items["action"].astype(np.float32))
    np.testing.assert_array_equal(items["frame"][:, 1, 2], items["action"] % 256)
    assert buf.num_added == 9 and len(buf) == 5


def test_oversize_batch_keeps_newest_items() -> None:
    buf = UniformReplay(4, seed=0)
    buf.add(make_batch(0, 1))
    written = buf.add(make_batch(100, 10))
    np.testing.assert_array_equal(written, [1, 2, 3, 0])
    np.testing.assert_array_equal(stored_ids(buf), [109, 106, 107, 108])
    assert len(buf) == 4
    np.testing.assert_array_equal(buf.add(make_batch(200, 1)), [1])


def test_empty_batch_is_a_no_op() -> None:
    buf = UniformReplay(3)
    assert buf.add(make_batch(0, 0)).shape == (0,)
    assert len(buf) == 0
    buf.add(make_batch(0, 2))
    assert len(buf) == 2


def test_dtypes_are_kept_and_nbytes() -> None:
    buf = UniformReplay(6)
    buf.add(make_batch(0, 2))
    out = buf.sample(4)
    assert out["obs"].dtype == np.float32
    assert out["action"].dtype == np.int64
    assert out["reward"].dtype == np.float32
    assert out["frame"].dtype == np.uint8 and out["frame"].shape == (4, 2, 3)
    assert out["indices"].dtype == np.int64
    assert out["weights"].dtype == np.float32
    np.testing.assert_array_equal(out["weights"], np.ones(4, np.float32))
    assert buf.nbytes == 6 * (2 * 4 + 8 + 4 + 6)


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        (lambda b: b.pop("reward"), "reward", "missing"),
        (lambda b: b.update(extra=np.zeros(2)), "extra", "unexpected"),
        (lambda b: b.update(obs=np.zeros((2, 3), np.float32)), "obs", "(2,)"),
        (lambda b: b.update(reward=np.zeros(2, np.float64)), "reward", "float32"),
        (lambda b: b.update(frame=np.zeros((2, 3, 2), np.uint8)), "frame", "(2, 3)"),
    ],
)
def test_schema_mismatch_names_the_key(change, key: str, words: str) -> None:
    buf = UniformReplay(4)
    buf.add(make_batch(0, 2))
    bad = make_batch(2, 2)
    change(bad)
    with pytest.raises(ValueError, match=key) as info:
        buf.add(bad)
    assert words in str(info.value)
    assert len(buf) == 2


def test_unequal_lengths_and_reserved_keys_raise() -> None:
    buf = UniformReplay(4)
    bad = make_batch(0, 2)
    bad["reward"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="leading length"):
        buf.add(bad)
    with pytest.raises(ValueError, match="indices"):
        buf.add({"indices": np.zeros(2)})
    with pytest.raises(ValueError, match="empty"):
        buf.sample(2)


def test_uniform_sample_matches_storage_and_is_uniform() -> None:
    buf = UniformReplay(10, seed=1)
    buf.add(make_batch(0, 10))
    out = buf.sample(20_000)
    np.testing.assert_array_equal(out["action"], out["indices"])
    counts = np.bincount(out["indices"], minlength=10)
    sigma = np.sqrt(20_000 * 0.1 * 0.9)
    assert np.all(np.abs(counts - 2000) < 4 * sigma)
    buf.update_priorities(out["indices"][:3], np.ones(3))  # no-op


def test_state_dict_is_json_serialisable() -> None:
    buf = make_replay(8, prioritized=True, seed=3)
    buf.add(make_batch(0, 5))
    buf.sample(2)
    state = json.loads(json.dumps(buf.state_dict()))
    assert state["size"] == 5 and state["sample_calls"] == 1


@pytest.mark.parametrize("prioritized", [False, True])
def test_save_load_round_trip(tmp_path: Path, prioritized: bool) -> None:
    src = make_replay(7, prioritized=prioritized, beta_steps=10, seed=5)
    src.add(make_batch(0, 5))
    src.add(make_batch(5, 4), priorities=np.linspace(0.1, 3.0, 4))
    src.sample(3)
    src.update_priorities(np.array([0, 2]), np.array([5.0, 0.01]))
    path = str(tmp_path / "replay.npz")
    src.save(path)

    dst = make_replay(7, prioritized=prioritized, beta_steps=10, seed=99)
    dst.load(path)
    assert len(dst) == len(src) and dst.state_dict() == src.state_dict()
    for key, value in src.get(np.arange(7)).items():
        restored = dst.get(np.arange(7))[key]
        assert restored.dtype == value.dtype
        np.testing.assert_array_equal(restored, value)
    if isinstance(src, PrioritizedReplay):
        assert isinstance(dst, PrioritizedReplay)
        np.testing.assert_array_equal(dst.tree.leaves, src.tree.leaves)
        np.testing.assert_array_equal(dst.tree.block_mins, src.tree.block_mins)
        assert dst.beta == src.beta
    for _ in range(3):
        a, b = src.sample(16), dst.sample(16)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    # Adding after load continues the ring at the same place.
    np.testing.assert_array_equal(src.add(make_batch(50, 1)), dst.add(make_batch(50, 1)))

    with pytest.raises(ValueError, match="capacity"):
        make_replay(6, prioritized=prioritized).load(path)


# ---------------------------------------------------------------- sum tree


def test_sumtree_blocks_and_single_leaf() -> None:
    assert (SumTree(1).block, SumTree(1).num_blocks) == (1, 1)
    assert (SumTree(5).block, SumTree(5).num_blocks) == (8, 1)
    assert (SumTree(1000).block, SumTree(1000).num_blocks) == (64, 16)
    assert SumTree(100_000).nbytes / 100_000 < 4.3  # 4-byte leaves plus 16 bytes per 64-leaf block
    with pytest.raises(ValueError, match="power of two"):
        SumTree(10, block=3)
    tree = SumTree(1)
    tree.update(np.array([0]), np.array([2.5]))
    assert tree.total() == 2.5
    np.testing.assert_array_equal(tree.find(np.array([0.0, 1.0, 9.0])), [0, 0, 0])


@pytest.mark.parametrize(("capacity", "block"), [(37, None), (37, 4), (1000, 16), (3, 1)])
def test_sumtree_matches_brute_force(capacity: int, block: int | None) -> None:
    rng = np.random.default_rng(0)
    tree = SumTree(capacity, block)
    ref = np.zeros(capacity, dtype=np.float32)
    for _ in range(50):
        idx = rng.integers(0, capacity, size=rng.integers(1, 20))  # repeats likely
        vals = rng.random(idx.size) * rng.choice([0.0, 1.0, 100.0], size=idx.size)
        tree.update(idx, vals)
        for i, v in zip(idx, vals, strict=True):  # sequential: last write wins
            ref[i] = v
        np.testing.assert_array_equal(tree.leaves, ref)
        exact = ref.astype(np.float64)
        assert tree.total() == pytest.approx(exact.sum(), rel=1e-12)
        blocks = np.pad(exact, (0, tree.num_blocks * tree.block - capacity)).reshape(tree.num_blocks, -1)
        np.testing.assert_allclose(tree.block_sums, blocks.sum(axis=1), rtol=1e-12)
        if exact.sum() == 0:
            continue
        queries = rng.random(200) * exact.sum()
        expected = np.searchsorted(np.cumsum(exact), queries, side="right")
        found = tree.find(queries)
        near_edge = np.abs(np.cumsum(exact)[np.minimum(expected, capacity - 1)] - queries) < 1e-9
        np.testing.assert_array_equal(found[~near_edge], expected[~near_edge])
        assert tree.max_value >= ref.max()


def test_sumtree_find_never_returns_zero_leaf() -> None:
    tree = SumTree(10, block=4)  # 3 blocks, 2 padding leaves never written
    vals = np.array([0.0, 0.3, 0.0, 0.1, 0.7, 0.0, 0.2, 0.9, 0.0, 0.0])
    tree.update(np.arange(10), vals)
    total = tree.total()
    queries = np.concatenate(
        [
            np.linspace(0, total, 1001),
            [-1.0, total, np.nextafter(total, 0), total * (1 + 1e-12), 1e9],
        ]
    )
    leaves = tree.find(queries)
    assert np.all(vals[leaves] > 0)
    assert leaves[-1] == 7  # beyond total: last non-zero leaf
    assert leaves[-5] == 1  # below zero: first non-zero leaf
    with pytest.raises(ValueError):
        tree.update(np.array([0]), np.array([np.nan]))
    with pytest.raises(ValueError):
        tree.update(np.array([0]), np.array([-1.0]))
    with pytest.raises(IndexError):
        tree.update(np.array([10]), np.array([1.0]))


def test_sumtree_round_off_fallback_picks_nonzero_leaf() -> None:
    tree = SumTree(4)
    tree.update(np.arange(3), np.array([1.0, 2.0, 3.0]))
    tree.block_sums[0] += 1e-6  # simulate a block sum slightly above its leaves
    leaves = tree.find(np.array([6.0000005]))
    np.testing.assert_array_equal(leaves, [2])


# ---------------------------------------------------------------- prioritized


def test_prioritized_frequencies_follow_priorities() -> None:
    alpha, eps = 0.6, 1e-6
    buf = PrioritizedReplay(10, alpha=alpha, eps=eps, seed=7)
    raw = np.arange(1.0, 9.0)
    buf.add(make_batch(0, 8), priorities=raw)  # 8 of 10 slots filled
    draws = np.concatenate([buf.sample(64)["indices"] for _ in range(2000)])
    p = (raw + eps) ** alpha
    p /= p.sum()
    freq = np.bincount(draws, minlength=10) / draws.size
    sigma = np.sqrt(p * (1 - p) / draws.size)
    assert np.all(np.abs(freq[:8] - p) < 4 * sigma)
    assert freq[8:].sum() == 0


def test_importance_weights_match_formula() -> None:
    buf = PrioritizedReplay(16, alpha=0.7, beta0=0.3, beta_steps=5, seed=2)
    raw = np.random.default_rng(0).random(12) * 4
    buf.add(make_batch(0, 12), priorities=raw)
    for _ in range(7):
        beta = buf.beta
        out = buf.sample(32)
        probs = (np.abs(raw) + buf.eps) ** buf.alpha
        probs /= probs.sum()
        n = len(buf)
        w = (n * probs[out["indices"]]) ** -beta
        w_max = (n * probs.min()) ** -beta
        np.testing.assert_allclose(out["weights"], w / w_max, rtol=1e-6)
        assert out["weights"].max() <= 1.0
        np.testing.assert_array_equal(out["action"], out["indices"])


def test_beta_anneals_to_one_and_stays() -> None:
    buf = PrioritizedReplay(4, beta0=0.4, beta_steps=10, seed=0)
    buf.add(make_batch(0, 4))
    for k in range(10):
        assert buf.beta == pytest.approx(0.4 + 0.6 * k / 10)
        buf.sample(2)
    assert buf.beta == 1.0
    for _ in range(5):
        buf.sample(2)
        assert buf.beta == 1.0
    assert PrioritizedReplay(4, beta_steps=0).beta == 1.0


def test_new_items_get_max_priority() -> None:
    buf = PrioritizedReplay(8, alpha=0.5, eps=0.0, seed=0)
    buf.add(make_batch(0, 3))
    np.testing.assert_array_equal(buf.tree.get(np.arange(3)), [1.0, 1.0, 1.0])
    buf.update_priorities(np.array([1]), np.array([16.0]))
    assert buf.max_priority == pytest.approx(4.0)
    buf.update_priorities(np.array([1]), np.array([0.25]))  # max is a running max
    buf.add(make_batch(3, 2))
    np.testing.assert_allclose(buf.tree.get(np.arange(5)), [1.0, 0.5, 1.0, 4.0, 4.0])
    buf.add(make_batch(5, 1), priorities=np.array([-36.0]))  # |p| is used
    assert buf.tree.get(np.array([5]))[0] == pytest.approx(6.0)
    assert buf.max_priority == pytest.approx(6.0)


def test_update_priorities_changes_frequencies() -> None:
    buf = PrioritizedReplay(6, alpha=1.0, seed=4)
    buf.add(make_batch(0, 6))
    before = np.bincount(buf.sample(6000)["indices"], minlength=6) / 6000
    assert before[3] < 0.25
    buf.update_priorities(np.array([3, 0]), np.array([15.0, 1.0]))
    after = np.bincount(buf.sample(6000)["indices"], minlength=6) / 6000
    expected = 15.0 / 20.0
    assert abs(after[3] - expected) < 4 * np.sqrt(expected * (1 - expected) / 6000)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_priorities_are_refused(bad: float) -> None:
    """add refuses the whole batch; update_priorities skips the entry and keeps the old priority."""
    buf = PrioritizedReplay(4, seed=0)
    buf.add(make_batch(0, 2))
    before = buf.tree.leaves.copy()
    with pytest.raises(ValueError, match="NaN or inf"):
        buf.add(make_batch(2, 1), priorities=np.array([bad]))
    np.testing.assert_array_equal(buf.tree.leaves, before)
    assert len(buf) == 2 and buf.num_added == 2 and buf.priorities_rejected == 1
    buf.update_priorities(np.array([0, 1]), np.array([4.0, bad]))
    assert buf.priorities_rejected == 2 and buf.priorities_clamped == 0
    assert buf.tree.get(np.array([0]))[0] == pytest.approx((4.0 + buf.eps) ** buf.alpha, rel=1e-6)
    assert buf.tree.get(np.array([1]))[0] == before[1]
    assert np.isfinite(buf.tree.total()) and buf.max_priority == pytest.approx((4.0 + buf.eps) ** buf.alpha)
    with pytest.raises(IndexError):
        buf.update_priorities(np.array([2]), np.array([1.0]))


def test_make_replay_and_exports() -> None:
    assert type(make_replay(4, prioritized=False)) is UniformReplay
    per = make_replay(4, prioritized=True, alpha=0.5, beta0=0.2, beta_steps=7, eps=0.1, seed=1)
    assert isinstance(per, PrioritizedReplay)
    assert (per.alpha, per.beta0, per.beta_steps, per.eps) == (0.5, 0.2, 7, 0.1)
    assert per.nbytes == per.tree.nbytes


def test_sumtree_min_positive_matches_brute_force_and_survives_rebuild() -> None:
    rng = np.random.default_rng(11)
    tree = SumTree(1000)
    assert tree.min_positive() == np.inf
    leaves = np.zeros(1000, dtype=np.float32)
    for _ in range(200):
        idx = rng.integers(0, 1000, size=rng.integers(1, 40))
        vals = rng.random(idx.size) * (rng.random(idx.size) > 0.2)  # some zeros
        tree.update(idx, vals)
        for i, v in zip(idx, vals, strict=True):
            leaves[i] = v
        positive = leaves[leaves > 0]
        assert tree.min_positive() == (positive.min() if positive.size else np.inf)
    copy = SumTree(1000)
    copy.load_leaves(tree.leaves)
    assert np.array_equal(copy.block_mins, tree.block_mins)
    np.testing.assert_array_equal(copy.block_sums, tree.block_sums)
    with pytest.raises(ValueError, match="finite"):
        copy.load_leaves(np.full(1000, np.nan))


def test_replay_files_with_a_binary_tree_still_load(tmp_path: Path) -> None:
    src = PrioritizedReplay(6, seed=0)
    src.add(make_batch(0, 5), priorities=np.array([0.5, 1.0, 2.0, 0.0, 3.0]))
    path = tmp_path / "new.npz"
    src.save(str(path))
    with np.load(path) as npz:
        arrays = {name: npz[name] for name in npz.files}
    tree = np.zeros(16)  # the earlier layout: 8 leaves at [8, 16), sums above
    tree[8:14] = arrays.pop("priorities")
    for node in range(7, 0, -1):
        tree[node] = tree[2 * node] + tree[2 * node + 1]
    old = tmp_path / "old.npz"
    np.savez(old, tree=tree, **arrays)
    dst = PrioritizedReplay(6, seed=0)
    dst.load(str(old))
    np.testing.assert_array_equal(dst.tree.leaves, src.tree.leaves)
    assert dst.tree.total() == pytest.approx(src.tree.total())
    np.testing.assert_array_equal(dst.sample(8)["indices"], src.sample(8)["indices"])
    np.savez(old, **arrays)
    with pytest.raises(ValueError, match="no 'priorities'"):
        PrioritizedReplay(6).load(str(old))


def test_replay_values_report_stored_priorities_and_clamps() -> None:
    """The learner's and ``zmqrl train``'s TensorBoard scalars of replay: size, and for prioritized
    replay the largest and mean stored priority and the count of clamped raw priorities."""
    from zmqrl.run.bookkeeping import replay_values

    uniform = UniformReplay(10, seed=0)
    uniform.add(make_batch(0, 4))
    assert replay_values(uniform) == {"perf/replay_size": 4.0}
    buf = PrioritizedReplay(10, alpha=1.0, eps=0.0, seed=0, priority_cap=100.0)
    assert replay_values(buf) == {"perf/replay_size": 0.0}
    buf.add(make_batch(0, 4), priorities=np.array([1.0, 2.0, 3.0, 500.0]))
    values = replay_values(buf)
    assert values["perf/replay_size"] == 4.0 and values["perf/priorities_clamped"] == 1.0
    assert values["perf/priority_max"] == pytest.approx(100.0)
    assert values["perf/priority_mean"] == pytest.approx((1 + 2 + 3 + 100) / 4)
