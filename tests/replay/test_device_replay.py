"""Replay on a torch device (:mod:`zmqrl.replay.device`) held to the numpy replay, on the CPU: the same code runs
on CUDA. The same items (host and device copies), frames once with the same slots and reference counts through
eviction and wraparound, ``add_frames`` with fingerprints, the same samples for the same seed and the same
priorities (``sampled_at`` included), the very same files both ways; the device sum tree finds what the host's
finds; a replay that cannot fit its device is refused naming the key; only the learner's start-up imports it."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_frames import STACK, assert_same_contents, check_refcounts, compact, stacked_stream

from zmqrl.config import ConfigError
from zmqrl.replay import UniformReplay, make_replay
from zmqrl.replay.device import DeviceReplay, DeviceSumTree, PrioritizedDeviceReplay, make_device_replay
from zmqrl.replay.files import read_npz
from zmqrl.replay.sumtree import SumTree

REPO = Path(__file__).resolve().parents[2]
CAPACITY = 64  # small enough that the streams below wrap the ring several times


def host_arrays(batch: dict[str, Any]) -> dict[str, np.ndarray]:
    """A sampled batch as host arrays (device tensors copied back)."""
    return {k: v.cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v) for k, v in batch.items()}


def twins(prioritized: bool, **options: Any) -> tuple[UniformReplay, UniformReplay]:
    """A numpy replay and a torch replay on the CPU, frames kept once, with the same seed."""
    host = make_replay(CAPACITY, prioritized, seed=3, frame_stack=STACK)
    device = make_device_replay("cpu", CAPACITY, prioritized, seed=3, frame_stack=STACK, **options)
    return host, device


def feed(replays: list[UniformReplay], steps: int = 120, seed: int = 0) -> None:
    """Stacked transitions into every replay, batches alternating ``add`` of the stacks and ``add_frames``
    of their distinct frames (every other one with fingerprints as the intake computes them)."""
    from zmqrl.frames import Fingerprints

    rng = np.random.default_rng(seed + 1)
    stream = stacked_stream(steps, seed=seed)
    for i in range(0, len(stream), 3):
        part = stream[i : i + 3]
        batch = {k: np.concatenate([b[k] for b in part]) for k in part[0]}
        prio = rng.random(len(batch["reward"]))
        for replay in replays:
            if i % 2 == 0:
                replay.add(batch, priorities=prio)
            else:
                rest, frames, indices = compact(batch)
                prints = Fingerprints(frames[0].nbytes).of_frames(frames) if i % 4 == 1 else None
                replay.add_frames(rest, frames, indices, priorities=prio, fingerprints=prints)


def assert_same_replay(host: UniformReplay, device: UniformReplay) -> None:
    """The same items, slots, reference counts and state; the device's copy equal to the host's."""
    assert_same_contents(host, device)
    assert host.state_dict() == device.state_dict()
    assert host._pool is not None and device._pool is not None
    for key in host.frame_keys:
        np.testing.assert_array_equal(host._frame_refs[key], device._frame_refs[key], err_msg=key)
    np.testing.assert_array_equal(host._pool.refcount[: host._pool.high], device._pool.refcount[: device._pool.high])
    check_refcounts(device)
    assert isinstance(device, (DeviceReplay, PrioritizedDeviceReplay))
    everything = np.arange(len(device))
    on_device, on_host = device.gather(everything), device.get(everything)
    assert sorted(on_device) == sorted(on_host)
    for key, tensor in on_device.items():
        assert tensor.device == device.device
        np.testing.assert_array_equal(tensor.numpy(), on_host[key], err_msg=key)


@pytest.mark.parametrize("prioritized", [False, True])
def test_same_items_slots_and_samples_as_the_numpy_replay_through_wraparound(prioritized: bool) -> None:
    host, device = twins(prioritized)
    feed([host, device])
    assert host.num_added > 3 * CAPACITY and len(host) == CAPACITY  # wrapped, items evicted, frames released
    assert_same_replay(host, device)
    rng = np.random.default_rng(7)
    for step in range(12):
        want, got = host.sample(32), device.sample(32)
        assert isinstance(got["indices"], np.ndarray)  # drawn on the host, where priorities come back to
        for key, tensor in got.items():
            if key != "indices":
                assert isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu", key
        got_host = host_arrays(got)
        assert sorted(got_host) == sorted(want)
        for key in want:
            assert got_host[key].dtype == want[key].dtype and got_host[key].shape == want[key].shape, key
            np.testing.assert_array_equal(got_host[key], want[key], err_msg=key)
        sampled_at = host.num_added
        if step % 3 == 1:  # new items land between the sample and its priorities: they keep their own
            feed([host, device], steps=9, seed=100 + step)
        priorities = rng.random(32) * 3
        host.update_priorities(want["indices"], priorities, sampled_at=sampled_at)
        device.update_priorities(got["indices"], priorities, sampled_at=sampled_at)
    assert_same_replay(host, device)
    if prioritized:
        assert isinstance(host.tree, SumTree) and isinstance(device.tree, SumTree)
        np.testing.assert_array_equal(host.tree.leaves, device.tree.leaves)


def test_fingerprint_collisions_never_share_different_frames_on_the_device() -> None:
    host, device = twins(False)
    feed([host, device], steps=6)
    for replay in (host, device):
        assert replay._pool is not None
        replay._pool._mult[:] = 0  # every frame has fingerprint 0 from now on: only the bytes tell frames apart
    feed([host, device], steps=60, seed=1)
    assert_same_replay(host, device)


@pytest.mark.parametrize("prioritized", [False, True])
def test_files_are_the_numpy_replays_and_load_either_way(tmp_path: Path, prioritized: bool) -> None:
    host, device = twins(prioritized)
    feed([host, device])
    host.save(str(tmp_path / "host.npz"), stamp={"opt_steps": 5})
    device.save(str(tmp_path / "device.npz"), stamp={"opt_steps": 5})
    written, expected = read_npz(str(tmp_path / "device.npz")), read_npz(str(tmp_path / "host.npz"))
    assert sorted(written) == sorted(expected)
    for name, array in expected.items():
        assert written[name].dtype == array.dtype, name
        np.testing.assert_array_equal(written[name], array, err_msg=name)

    _, loaded = twins(prioritized)  # the numpy replay's file on the device, and the device's in numpy
    assert loaded.load(str(tmp_path / "host.npz")) == {"opt_steps": 5}
    back = make_replay(CAPACITY, prioritized, seed=99, frame_stack=STACK)
    back.load(str(tmp_path / "device.npz"))
    assert_same_replay(back, loaded)
    for _ in range(3):
        want, got = back.sample(16), host_arrays(loaded.sample(16))
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_a_snapshot_holds_the_host_side_alone_and_saves_the_same_file(tmp_path: Path) -> None:
    _, device = twins(True, sum_tree="device")
    feed([device])
    assert isinstance(device, PrioritizedDeviceReplay)
    snap = device.snapshot()
    assert snap.device_nbytes == 0 and device.device_nbytes > 0  # type: ignore[attr-defined]
    feed([device], steps=9, seed=50)  # the live replay goes on; the snapshot stays as it was
    snap.save(str(tmp_path / "snap.npz"))
    again = make_replay(CAPACITY, True, frame_stack=STACK)
    again.load(str(tmp_path / "snap.npz"))
    assert again.num_added == snap.num_added < device.num_added
    want, got = snap.sample(8), again.sample(8)  # the snapshot samples on the host, as the file's numpy replay
    assert all(isinstance(v, np.ndarray) for v in want.values())
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    assert device.sample(8)["indices"].device.type == "cpu"  # the live one still on its device


def test_the_device_sum_tree_finds_what_the_hosts_finds() -> None:
    rng = np.random.default_rng(0)
    for capacity in (1, 5, 64, 1000, 4099):
        tree = SumTree(capacity)
        values = rng.random(capacity) * (rng.random(capacity) < 0.7)  # zero leaves among them
        values[rng.integers(capacity)] = 0.5
        tree.update(np.arange(capacity), values)
        copy = DeviceSumTree(tree, torch.device("cpu"))
        copy.load(tree)
        total = tree.total()
        targets = np.concatenate([rng.random(500) * total, [0.0, total, total * (1 + 1e-12), -1.0]])
        found = copy.find(torch.from_numpy(targets)).numpy()
        np.testing.assert_array_equal(found, tree.find(targets))
        assert np.all(tree.get(found) > 0)
        weights = copy.weights(torch.from_numpy(found), 0.7).numpy()
        np.testing.assert_allclose(weights, ((tree.get(found) / tree.min_positive()) ** -0.7).astype(np.float32),
                                   rtol=1e-6)
        # round-off at block ends: leaves of 1e-8 to 1e6, the last ones of each block zero (a search that lands
        # past a block's sum takes its last positive leaf; about one in a few hundred of these edges does)
        for _ in range(10):
            spread = np.where(np.arange(capacity) % 64 < 40, 10.0 ** rng.uniform(-8, 6, capacity), 0.0)
            tree.update(np.arange(capacity), spread)
            copy.load(tree)
            ends = np.cumsum(tree.block_sums)
            edges = np.concatenate([ends, np.nextafter(ends, 0.0), ends * (1 - 1e-9)])
            np.testing.assert_array_equal(copy.find(torch.from_numpy(edges)).numpy(), tree.find(edges))
            assert np.all(tree.get(tree.find(edges)) > 0)
        nodes = np.unique(rng.integers(0, capacity, 17))  # changed leaves, and the blocks they are in
        tree.update(nodes, rng.random(nodes.size))
        copy.set(tree, nodes)
        np.testing.assert_array_equal(copy.find(torch.from_numpy(targets)).numpy(), tree.find(targets))


def test_sampling_on_the_device_tree_draws_the_host_trees_items() -> None:
    """The same targets (drawn on the host with the same RNG) searched on the device: the same items and
    weights as the host's tree; the indices come back for the priorities as a device tensor."""
    _, on_host = twins(True)
    _, on_device = twins(True, sum_tree="device")
    feed([on_host, on_device])
    rng = np.random.default_rng(3)
    for _ in range(8):
        want, got = on_host.sample(32), on_device.sample(32)
        assert isinstance(got["indices"], torch.Tensor)
        np.testing.assert_array_equal(got["indices"].numpy(), want["indices"])
        np.testing.assert_allclose(got["weights"].numpy(), want["weights"].numpy(), rtol=1e-6)
        for key in ("obs", "next_obs", "action", "reward"):
            np.testing.assert_array_equal(got[key].numpy(), want[key].numpy(), err_msg=key)
        priorities = rng.random(32)
        on_host.update_priorities(want["indices"], priorities, sampled_at=on_host.num_added)
        on_device.update_priorities(got["indices"], priorities, sampled_at=on_device.num_added)
    assert isinstance(on_device, PrioritizedDeviceReplay)
    np.testing.assert_array_equal(on_host.tree.leaves, on_device.tree.leaves)


def test_frames_grow_past_the_reserve_and_stay_equal() -> None:
    """Episodes of 3 steps share few frames: the frame slots outgrow the device's reserve and grow there too."""
    host = make_replay(CAPACITY, True, seed=3, frame_stack=STACK)
    device = make_device_replay("cpu", CAPACITY, True, seed=3, frame_stack=STACK)
    for batches in (stacked_stream(40, seed=s, episode_len=3) for s in range(3)):
        for b in batches:
            host.add(b, priorities=np.ones(len(b["reward"])))
            device.add(b, priorities=np.ones(len(b["reward"])))
    assert device._pool is not None and device._pool.refcount.size > CAPACITY * 2
    assert device.device_nbytes >= device._pool.refcount.size * device._pool.frame_nbytes
    assert_same_replay(host, device)


def test_a_replay_that_cannot_fit_its_device_is_refused_naming_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    import zmqrl.replay.device as device_mod

    schema = {"obs": (np.uint8, (4, 84, 84)), "next_obs": (np.uint8, (4, 84, 84)), "action": (np.int64, ()),
              "reward": (np.float32, ()), "discount": (np.float32, ())}
    monkeypatch.setattr(device_mod, "free_bytes", lambda device: 3 << 30)
    refused = r"replay.capacity=1,000,000 needs 7\.\d+ GiB on cpu \(replay.device.*lower replay.capacity \(about " \
              r"2\d\d,\d\d\d fit\) or set replay.device: cpu"
    with pytest.raises(ConfigError, match=refused):
        DeviceReplay(1_000_000, frame_stack=4, schema=schema)
    monkeypatch.setattr(device_mod, "free_bytes", lambda device: None)  # where the device cannot tell: allowed
    assert DeviceReplay(1000, frame_stack=4, schema=schema).device_nbytes > 0


def test_a_file_too_large_for_the_device_is_refused_and_leaves_replay_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import zmqrl.replay.device as device_mod

    full, empty = twins(True)[1], twins(True)[1]
    feed([full])
    full.save(str(tmp_path / "full.npz"))
    feed([empty], steps=3)
    items = {k: v.clone() for k, v in empty.gather(np.arange(len(empty))).items()}
    before = (empty.state_dict(), empty.device_nbytes, items)
    held = empty.device_nbytes
    monkeypatch.setattr(device_mod, "free_bytes", lambda device: device_mod.HEADROOM - held)  # room for what it holds
    with pytest.raises(ConfigError, match="replay.capacity=64 needs"):
        empty.load(str(tmp_path / "full.npz"))
    assert (empty.state_dict(), empty.device_nbytes) == before[:2]
    for key, tensor in empty.gather(np.arange(len(empty))).items():
        assert torch.equal(tensor, before[2][key]), key
    monkeypatch.setattr(device_mod, "free_bytes", lambda device: device_mod.HEADROOM + (64 << 20))
    empty.load(str(tmp_path / "full.npz"))  # with room, counting what it held as freed
    assert empty.state_dict() == full.state_dict()


def test_bytes_a_pong_transition_holds_on_the_device() -> None:
    """Pong's stacked 84x84 frames once: about one frame a transition, reserve included, so that 1M transitions
    fit 8 GB (one frame each is 7 GB); measured on the CPU's tensors at 100k."""
    schema = {"obs": (np.uint8, (4, 84, 84)), "next_obs": (np.uint8, (4, 84, 84)), "action": (np.int64, ()),
              "reward": (np.float32, ()), "discount": (np.float32, ())}
    capacity = 100_000
    replay = PrioritizedDeviceReplay(capacity, frame_stack=4, schema=schema)
    per_transition = replay.device_nbytes / capacity
    assert replay.device_nbytes == replay.planned_nbytes()
    assert 84 * 84 < per_transition < 8 * 2**30 / 1_000_000, per_transition  # (~7.6 KB: 1/16 over one frame)


@pytest.mark.slow
def test_only_the_learners_start_up_imports_the_torch_replay() -> None:
    imports = re.compile(r"^\s*(from zmqrl\.replay\.device import|import zmqrl\.replay\.device)", re.M)
    users = sorted(str(p.relative_to(REPO)) for p in (REPO / "zmqrl").rglob("*.py") if imports.search(p.read_text()))
    assert users == ["zmqrl/run/startup.py"], users
    torch_importers = sorted(p.name for p in (REPO / "zmqrl" / "replay").glob("*.py")
                             if "import torch" in p.read_text())
    assert torch_importers == ["device.py"]
    code = ("import sys, zmqrl.replay, zmqrl.run.startup, zmqrl.roles.learner, zmqrl.roles.actor, "
            "zmqrl.roles.evaluator, zmqrl.roles.proxy; "
            "sys.exit(('torch' in sys.modules) or ('zmqrl.replay.device' in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_stacks_and_items_of_other_layouts_are_gathered_on_the_device() -> None:
    """Vector items (no frames) and channels-last images: the device's items are the host's."""
    vectors: Callable[[int], dict[str, np.ndarray]] = lambda n: {  # noqa: E731
        "obs": np.random.default_rng(n).standard_normal((n, 3)).astype(np.float32),
        "action": np.arange(n, dtype=np.int64), "flag": np.arange(n) % 2 == 0}
    replay = make_device_replay("cpu", 10, True, seed=1)
    for n in (4, 7, 12):
        replay.add(vectors(n))
    got = replay.gather(np.arange(10))
    want = replay.get(np.arange(10))
    for key in want:
        assert got[key].dtype == torch.from_numpy(want[key]).dtype, key
        np.testing.assert_array_equal(got[key].numpy(), want[key], err_msg=key)
    images = make_device_replay("cpu", 8, False, frame_stack=1)
    images.add({"obs": np.random.default_rng(0).integers(0, 255, (5, 6, 7, 3), dtype=np.uint8)})
    np.testing.assert_array_equal(images.gather(np.arange(5))["obs"].numpy(), images.get(np.arange(5))["obs"])


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@contextlib.contextmanager
def no_device_waits() -> Iterator[None]:
    """Any operation inside that makes the host wait for the device raises (torch's sync debug mode)."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@needs_cuda
@pytest.mark.parametrize("sum_tree", ["host", "device"])
def test_cuda_replay_on_the_gpu_is_the_numpy_replays_and_never_waits_for_the_device(sum_tree: str) -> None:
    """On CUDA: inserts (``add`` and ``add_frames``), samples and priorities one step late never make the host
    wait for the device, and the batches, priorities and contents are the numpy replay's."""
    host = make_replay(CAPACITY, True, seed=3, frame_stack=STACK)
    device = make_device_replay("cuda", CAPACITY, True, seed=3, frame_stack=STACK, sum_tree=sum_tree)
    feed([host, device], steps=6)  # (storage allocated, its size checked against the device's free memory)
    torch.cuda.synchronize()
    rng = np.random.default_rng(7)
    batches: list[tuple[dict[str, np.ndarray], dict[str, Any]]] = []
    previous: tuple[Any, np.ndarray, int] | None = None
    for step in range(12):
        sampled_at = device.num_added
        with no_device_waits():
            if step % 4 == 2:
                feed([device], steps=9, seed=200 + step)
            got = device.sample(32)
        torch.cuda.synchronize()  # (the learner waits here for the last step's results: its priorities)
        with no_device_waits():
            if previous is not None:
                device.update_priorities(previous[0], previous[1], sampled_at=previous[2])
        if step % 4 == 2:
            feed([host], steps=9, seed=200 + step)
        want = host.sample(32)
        if previous is not None:
            host.update_priorities(batches[-1][0]["indices"], previous[1], sampled_at=previous[2])
        batches.append((want, got))
        previous = (got["indices"], rng.random(32) * 3, sampled_at)
    torch.cuda.synchronize()
    for want, got in batches:
        got_host = host_arrays(got)
        for key in want:
            if key == "weights":
                np.testing.assert_allclose(got_host[key], want[key], rtol=1e-6)
            else:
                np.testing.assert_array_equal(got_host[key], want[key], err_msg=key)
    assert host.state_dict() == device.state_dict()
    assert isinstance(device, PrioritizedDeviceReplay)
    np.testing.assert_array_equal(host.tree.leaves, device.tree.leaves)
    everything = np.arange(len(device))
    for key, tensor in device.gather(everything).items():
        np.testing.assert_array_equal(tensor.cpu().numpy(), host.get(everything)[key], err_msg=key)
