"""Tests for atomic checkpoints: round trips, replacement, crash recovery and clear errors."""

from __future__ import annotations

import collections
import json
import math
import os
import selectors
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from zmqrl.envs import state
from zmqrl.run import checkpoint, rundir
from zmqrl.run.checkpoint import AGENT_FILE, STATE_FILE, CheckpointError


def agent_state(value: float) -> dict[str, object]:
    return {"q": {"w": torch.full((3, 2), value), "b": torch.arange(3, dtype=torch.float32) + value},
            "opt_steps": int(value), "rng": {"state": 12345678901234567890, "name": "PCG64"}}


def assert_agent_state(loaded: dict[str, object], value: float) -> None:
    expected = agent_state(value)
    assert set(loaded) == set(expected)
    q = loaded["q"]
    assert isinstance(q, dict)
    torch.testing.assert_close(q["w"], torch.full((3, 2), value))
    torch.testing.assert_close(q["b"], torch.arange(3, dtype=torch.float32) + value)
    assert loaded["opt_steps"] == int(value) and loaded["rng"] == expected["rng"]


def listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def test_save_load_round_trip(tmp_path: Path) -> None:
    state = {"env_steps": 1234, "best_eval": 17.5, "evals": [{"opt_steps": 100, "return_mean": 9.0}], "x": None}
    written = checkpoint.save(tmp_path / "ckpts" / "latest", agent_state(2.0), state)
    assert written == tmp_path / "ckpts" / "latest"
    assert listing(written) == sorted([AGENT_FILE, STATE_FILE])
    loaded_agent, loaded_state = checkpoint.load(written)
    assert_agent_state(loaded_agent, 2.0)
    assert loaded_state == state
    assert listing(tmp_path / "ckpts") == ["latest"]


def test_save_writes_extra_files(tmp_path: Path) -> None:
    def writer(path: Path) -> None:
        path.write_text("replay bytes")

    directory = checkpoint.save(tmp_path / "c", agent_state(1.0), {}, extra_files={"replay.npz": writer})
    assert (directory / "replay.npz").read_text() == "replay bytes"


def test_state_json_takes_numpy_scalars(tmp_path: Path) -> None:
    directory = checkpoint.save(tmp_path / "c", agent_state(1.0), {"mean": np.float32(1.5), "m64": np.float64(2.25)})
    _, state = checkpoint.load(directory)
    assert state == {"mean": 1.5, "m64": 2.25}


def test_replacing_a_checkpoint_leaves_only_the_new_one(tmp_path: Path) -> None:
    target = tmp_path / "latest"
    checkpoint.save(target, agent_state(1.0), {"version": 1}, extra_files={"only_in_old": lambda p: p.write_text("")})
    checkpoint.save(target, agent_state(2.0), {"version": 2})
    loaded_agent, state = checkpoint.load(target)
    assert_agent_state(loaded_agent, 2.0)
    assert state == {"version": 2}
    assert listing(target) == sorted([AGENT_FILE, STATE_FILE])  # no file of the old checkpoint survives
    assert listing(tmp_path) == ["latest"]  # no NAME.old, no temporary directory


def test_save_removes_a_stale_old_copy(tmp_path: Path) -> None:
    target = tmp_path / "latest"
    checkpoint.save(target, agent_state(1.0), {"version": 1})
    (tmp_path / "latest.old").mkdir()
    (tmp_path / "latest.old" / "junk").write_text("x")
    checkpoint.save(target, agent_state(3.0), {"version": 3})
    assert listing(tmp_path) == ["latest"]
    assert checkpoint.load(target)[1] == {"version": 3}


def test_load_falls_back_to_old_after_a_crash_mid_swap(tmp_path: Path) -> None:
    target = tmp_path / "latest"
    checkpoint.save(target, agent_state(4.0), {"version": 4})
    os.replace(target, tmp_path / "latest.old")  # the first rename happened, the second did not
    assert not target.exists()
    assert checkpoint.resolve(target) == tmp_path / "latest.old"
    loaded_agent, state = checkpoint.load(target)
    assert_agent_state(loaded_agent, 4.0)
    assert state == {"version": 4}
    # the next save completes the swap and cleans up
    checkpoint.save(target, agent_state(5.0), {"version": 5})
    assert listing(tmp_path) == ["latest"]
    assert checkpoint.load(target)[1] == {"version": 5}


def test_complete_checkpoint_wins_over_old(tmp_path: Path) -> None:
    target = tmp_path / "latest"
    checkpoint.save(tmp_path / "latest.old", agent_state(1.0), {"version": 1})
    checkpoint.save(target, agent_state(2.0), {"version": 2})
    assert checkpoint.resolve(target) == target
    assert checkpoint.load(target)[1] == {"version": 2}


def test_copy_makes_an_independent_checkpoint(tmp_path: Path) -> None:
    src = checkpoint.save(tmp_path / "100", agent_state(6.0), {"version": 6})
    checkpoint.save(tmp_path / "best", agent_state(1.0), {"version": 1})
    dest = checkpoint.copy(src, tmp_path / "best")
    assert dest == tmp_path / "best"
    assert_agent_state(checkpoint.load(dest)[0], 6.0)
    assert listing(tmp_path) == ["100", "best"]
    checkpoint.save(src, agent_state(7.0), {"version": 7})
    assert checkpoint.load(dest)[1] == {"version": 6}


def test_copy_replaces_the_destination_and_leaves_no_temporary(tmp_path: Path) -> None:
    src = checkpoint.save(tmp_path / "100", agent_state(6.0), {"version": 6},
                          extra_files={"replay.npz": lambda p: p.write_bytes(b"replay")})
    checkpoint.copy(src, tmp_path / "latest")
    assert listing(tmp_path / "latest") == sorted([AGENT_FILE, STATE_FILE, "replay.npz"])
    assert listing(tmp_path) == ["100", "latest"]


# ---------------------------------------------------------------- power loss and SIGKILL


Event = tuple[str, str, str]  # ("fsync", path, "") or ("replace", src, dst)


def record_fsyncs_and_renames(monkeypatch: pytest.MonkeyPatch) -> list[Event]:
    """Record, in order, every os.fsync (the path its fd names) and every os.replace."""
    events: list[Event] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"), ""))
        real_fsync(fd)

    def replace(src: str | Path, dst: str | Path) -> None:
        events.append(("replace", os.path.realpath(src), os.path.realpath(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def assert_synced_before_swap(events: list[Event], target: Path, files: list[str]) -> None:
    """Each of ``files`` in the temporary, then the temporary itself, fsynced before any rename of
    ``target`` (or to ``target.old``); the parent fsynced after the temporary became ``target``."""
    target = Path(os.path.realpath(target))
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    renames = [i for i, (kind, _, dst) in enumerate(events) if kind == "replace" and Path(dst).parent == target.parent]
    assert renames, events
    swap = [i for i in renames if events[i][1:] == (str(tmp), str(target))]
    assert len(swap) == 1, events
    synced = {path: i for i, (kind, path, _) in enumerate(events) if kind == "fsync"}
    for name in files:
        assert str(tmp / name) in synced, f"{name} never fsynced: {events}"
        assert synced[str(tmp / name)] < renames[0], f"{name} fsynced after the rename: {events}"
    assert synced.get(str(tmp), len(events)) < renames[0], f"the temporary directory not fsynced first: {events}"
    assert any(kind == "fsync" and path == str(target.parent) for kind, path, _ in events[swap[0] + 1:]), \
        f"the parent directory not fsynced after the rename: {events}"


needs_proc = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names fsynced fds through /proc")


@needs_proc
def test_every_file_is_fsynced_before_the_checkpoint_is_renamed_into_place(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A power loss after the rename must not find a torn agent.pt or replay file: torch.save and
    an extra writer do not fsync, so the save does it for every file of the temporary."""
    target = tmp_path / "checkpoints" / "latest"
    checkpoint.save(target, agent_state(1.0), {"version": 1})
    events = record_fsyncs_and_renames(monkeypatch)
    checkpoint.save(target, agent_state(2.0), {"version": 2},
                    extra_files={"replay.npz": lambda p: p.write_bytes(b"replay bytes, not fsynced by the writer")})
    assert_synced_before_swap(events, target, [AGENT_FILE, STATE_FILE, "replay.npz"])
    assert checkpoint.load(target)[1] == {"version": 2}


@needs_proc
def test_a_copy_is_fsynced_before_it_is_renamed_into_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = checkpoint.save(tmp_path / "100", agent_state(6.0), {"version": 6},
                          extra_files={"replay.npz": lambda p: p.write_bytes(b"replay")})
    checkpoint.save(tmp_path / "best", agent_state(1.0), {"version": 1})
    events = record_fsyncs_and_renames(monkeypatch)
    checkpoint.copy(src, tmp_path / "best")
    assert_synced_before_swap(events, tmp_path / "best", [AGENT_FILE, STATE_FILE, "replay.npz"])
    assert checkpoint.load(tmp_path / "best")[1] == {"version": 6}


def dead_pid() -> int:
    """The PID of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait(timeout=60)
    return proc.pid


@pytest.mark.slow  # (it starts a process, for the PID of one that has exited)
def test_a_save_removes_what_dead_saves_left_and_keeps_the_only_good_copy(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    checkpoint.save(ckpts / "latest", agent_state(1.0), {"version": 1})
    checkpoint.save(ckpts / "best", agent_state(2.0), {"version": 2})
    os.replace(ckpts / "best", ckpts / "best.old")  # a swap interrupted between its renames: the only copy
    (ckpts / "latest.old").mkdir()  # a swap killed while it deleted the previous copy
    (ckpts / "latest.old" / AGENT_FILE).write_bytes(b"half deleted")
    pid = dead_pid()
    (ckpts / f".latest.tmp-{pid}").mkdir()
    (ckpts / f".latest.tmp-{pid}" / AGENT_FILE).write_bytes(b"torn")
    (ckpts / f".best.tmp-{pid}").write_bytes(b"torn")
    (ckpts / f".latest.tmp-{os.getpid()}").mkdir()  # an earlier process with this PID (a container restart)
    (ckpts / "notes.txt").write_text("not a checkpoint")
    checkpoint.save(ckpts / "100", agent_state(3.0), {"version": 3})
    assert listing(ckpts) == ["100", "best.old", "latest", "notes.txt"]
    assert checkpoint.resolve(ckpts / "best") == ckpts / "best.old"
    assert checkpoint.load(ckpts / "best")[1] == {"version": 2}
    assert checkpoint.load(ckpts / "latest")[1] == {"version": 1}


def test_a_save_keeps_the_temporary_of_a_save_in_progress_in_this_process(tmp_path: Path) -> None:
    """``latest`` written by a background thread while the training thread saves ``<opt_steps>``."""
    ckpts = tmp_path / "checkpoints"
    started, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def replay_writer(path: Path) -> None:
        path.write_bytes(b"replay")
        started.set()
        if not release.wait(60):
            raise TimeoutError("never released")

    def save_latest() -> None:
        try:
            checkpoint.save(ckpts / "latest", agent_state(1.0), {"version": 1},
                            extra_files={"replay.npz": replay_writer})
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=save_latest, daemon=True)
    thread.start()
    try:
        assert started.wait(60), "the background save never reached its writer"
        checkpoint.save(ckpts / "100", agent_state(2.0), {"version": 2})
        assert (ckpts / f".latest.tmp-{os.getpid()}" / "replay.npz").is_file()
    finally:
        release.set()
        thread.join(60)
    assert not thread.is_alive() and not errors, errors
    assert listing(ckpts) == ["100", "latest"]
    assert checkpoint.load(ckpts / "latest")[1] == {"version": 1}


_BLOCKED_SAVE_SCRIPT = r'''
import sys
import threading
import torch
from zmqrl.run import checkpoint
def replay_writer(path):
    path.write_bytes(bytes(1 << 20))
    print("writing", flush=True)
    threading.Event().wait()  # held here until the test kills this process

checkpoint.save(sys.argv[1], {"w": torch.zeros(3)}, {"version": 2}, extra_files={"replay.npz": replay_writer})
'''


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The next line ``proc`` prints, waiting at most ``timeout`` seconds ("" if it exited)."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            return ""
    return proc.stdout.readline().strip()


@pytest.mark.slow
def test_a_save_killed_midway_leaves_a_temporary_the_next_save_removes(tmp_path: Path) -> None:
    """SIGKILL in the middle of a save leaves ``.latest.tmp-PID``; it is kept while that process
    lives and removed by the next save in the directory once it is dead; ``latest`` stays whole."""
    ckpts = tmp_path / "checkpoints"
    checkpoint.save(ckpts / "latest", agent_state(1.0), {"version": 1})
    stderr = tmp_path / "child.err"
    with open(stderr, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", _BLOCKED_SAVE_SCRIPT, str(ckpts / "latest")],
                                stdout=subprocess.PIPE, stderr=err, text=True)
    tmp = ckpts / f".latest.tmp-{proc.pid}"
    try:
        line = read_line(proc, timeout=120)
        assert line == "writing", f"the child never reached its writer (exit {proc.poll()}):\n{stderr.read_text()}"
        assert (tmp / "replay.npz").is_file() and (tmp / AGENT_FILE).is_file()
        (ckpts / "latest.old").mkdir()  # beside a complete latest, but latest is being written: kept
        checkpoint.save(ckpts / "100", agent_state(3.0), {"version": 3})
        assert proc.poll() is None
        assert listing(ckpts) == sorted(["100", "latest", "latest.old", tmp.name])  # the live save's are kept
        proc.kill()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        assert proc.stdout is not None
        proc.stdout.close()
    assert tmp.is_dir()  # what SIGKILL leaves
    assert checkpoint.resolve(ckpts / "latest") == ckpts / "latest"
    checkpoint.save(ckpts / "200", agent_state(4.0), {"version": 4})
    assert listing(ckpts) == ["100", "200", "latest"]
    assert checkpoint.resolve(ckpts / "latest") == ckpts / "latest"
    assert_agent_state(checkpoint.load(ckpts / "latest")[0], 1.0)
    assert checkpoint.load(ckpts / "latest")[1] == {"version": 1}


def test_corrupt_agent_file_names_it(tmp_path: Path) -> None:
    directory = checkpoint.save(tmp_path / "latest", agent_state(1.0), {"version": 1})
    (directory / AGENT_FILE).write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(directory)
    assert str(directory / AGENT_FILE) in str(info.value)


def test_truncated_agent_file_names_it(tmp_path: Path) -> None:
    directory = checkpoint.save(tmp_path / "latest", agent_state(1.0), {"version": 1})
    data = (directory / AGENT_FILE).read_bytes()
    (directory / AGENT_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=AGENT_FILE):
        checkpoint.load(directory)


def test_agent_file_with_code_is_refused(tmp_path: Path) -> None:
    """weights_only loading: an arbitrary pickled object is an error, not executed."""
    directory = checkpoint.save(tmp_path / "latest", agent_state(1.0), {"version": 1})
    torch.save({"obj": Path("/")}, directory / AGENT_FILE)
    with pytest.raises(CheckpointError, match=AGENT_FILE):
        checkpoint.load(directory)


def test_agent_file_that_is_not_a_dict(tmp_path: Path) -> None:
    directory = checkpoint.save(tmp_path / "latest", agent_state(1.0), {"version": 1})
    torch.save(torch.zeros(3), directory / AGENT_FILE)
    with pytest.raises(CheckpointError, match="expected a dict"):
        checkpoint.load(directory)


def test_missing_agent_file_names_it(tmp_path: Path) -> None:
    directory = checkpoint.save(tmp_path / "latest", agent_state(1.0), {"version": 1})
    (directory / AGENT_FILE).unlink()
    with pytest.raises(CheckpointError, match="missing") as info:
        checkpoint.load(directory)
    assert str(directory / AGENT_FILE) in str(info.value)


def test_missing_directory_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "checkpoints" / "latest"
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(missing)
    assert str(missing) in str(info.value)


@pytest.mark.parametrize("content", ["{not json", "", "[1, 2]"])
def test_invalid_state_json_names_it(tmp_path: Path, content: str) -> None:
    directory = checkpoint.save(tmp_path / "latest", agent_state(1.0), {"version": 1})
    (directory / STATE_FILE).write_text(content)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(directory)
    assert str(directory / STATE_FILE) in str(info.value)


def test_write_json_atomic(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    rundir.write_json_atomic(path, {"b": 1, "a": [1.5, None], "n": np.float32(0.5)})
    assert json.loads(path.read_text()) == {"a": [1.5, None], "b": 1, "n": 0.5}
    rundir.write_json_atomic(path, {"second": True})
    assert json.loads(path.read_text()) == {"second": True}
    assert listing(tmp_path) == ["summary.json"]  # no temporary file left behind


def test_write_json_atomic_failure_keeps_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    rundir.write_json_atomic(path, {"ok": 1})
    with pytest.raises(TypeError):
        rundir.write_json_atomic(path, {"bad": object()})
    assert json.loads(path.read_text()) == {"ok": 1}
    assert listing(tmp_path) == ["summary.json"]  # the half-written temporary file is cleaned up


# ---------------------------------------------------------------- plain-data files


def test_tree_round_trip_keeps_types(tmp_path: Path) -> None:
    tree = {
        "none": None, "flag": True, "int": 7, "big": 2**100 + 1, "float": 0.1, "nan": float("nan"), "inf": -math.inf,
        "text": "é", "list": [1, [2.5, "x"]], "tuple": (1, (2, None)), "deque": collections.deque([1, 2], maxlen=3),
        "f32": np.float32(1.5), "i64": np.int64(-3), "array": np.arange(6, dtype=np.uint8).reshape(2, 3),
        "scalar_array": np.array(4.0), "empty": np.zeros((0, 2), dtype=np.float32),
        "rng": np.random.default_rng(5).bit_generator.state, "nested": {"a": {"b": [np.ones(2)]}},
    }
    checkpoint.write_tree(tmp_path / "t.npz", tree)
    back = checkpoint.read_tree(tmp_path / "t.npz")
    assert set(back) == set(tree)
    for key in ("none", "flag", "int", "big", "float", "text", "list", "tuple", "rng"):
        assert back[key] == tree[key] and type(back[key]) is type(tree[key]), key
    assert math.isnan(back["nan"]) and back["inf"] == -math.inf
    assert back["deque"] == tree["deque"] and back["deque"].maxlen == 3
    for key in ("f32", "i64"):
        assert back[key] == tree[key] and back[key].dtype == tree[key].dtype, key
    for key in ("array", "scalar_array", "empty"):
        np.testing.assert_array_equal(back[key], tree[key])
        assert back[key].dtype == tree[key].dtype and back[key].shape == tree[key].shape, key
    np.testing.assert_array_equal(back["nested"]["a"]["b"][0], np.ones(2))


def test_plain_copy_copies_arrays_and_refuses_objects() -> None:
    array = np.zeros(3)
    copied = state.plain_copy({"a": [array]})
    array[0] = 1.0
    assert copied["a"][0][0] == 0.0
    for bad in (object(), {"a": [np.array([object()])]}, {1: 2}, b"bytes"):
        assert not state.is_plain(bad)
        with pytest.raises(TypeError, match="not plain data"):
            state.plain_copy(bad)


def test_write_tree_names_what_is_not_plain(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"tree\.env\[1\]: object is not plain data"):
        checkpoint.write_tree(tmp_path / "t.npz", {"env": [1, object()]})


def test_read_tree_of_a_damaged_file_names_it(tmp_path: Path) -> None:
    path = tmp_path / "t.npz"
    checkpoint.write_tree(path, {"a": np.arange(1000.0), "b": [1, 2]})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=f"{path}: unreadable"):
        checkpoint.read_tree(path)
    np.savez(path, other=np.zeros(2))  # an .npz, but not one of write_tree
    with pytest.raises(CheckpointError, match=f"{path}: unreadable: missing"):
        checkpoint.read_tree(path)


def test_read_tree_never_unpickles(tmp_path: Path) -> None:
    path = tmp_path / "t.npz"
    outline = np.frombuffer(json.dumps({"__array__": "a0"}).encode(), dtype=np.uint8)
    np.savez(path, allow_pickle=True, a0=np.array([Path("/")], dtype=object), **{checkpoint.TREE_KEY: outline})
    with pytest.raises(CheckpointError, match=f"{path}: unreadable"):
        checkpoint.read_tree(path)


_POLICY_SCRIPT = r'''
import sys
import numpy as np
from zmqrl.run import checkpoint
params = {"torso.0.weight": np.arange(12, dtype=np.float32).reshape(3, 4), "mean.bias": np.ones(2, np.float32)}
directory = checkpoint.save_policy(sys.argv[1], params, {"version": 7, "eval_return": -150.5})
checkpoint.save_policy(directory, {k: v + 1 for k, v in params.items()}, {"version": 9, "eval_return": -120.0})
got, state = checkpoint.load_policy_params(directory)
assert state == {"version": 9, "eval_return": -120.0}, state
assert set(got) == set(params) and all(np.array_equal(got[k], params[k] + 1) and got[k].dtype == np.float32
                                       for k in params), got
sys.exit(3 if "torch" in sys.modules else 0)
'''


@pytest.mark.slow
def test_a_policy_checkpoint_is_written_and_read_without_torch(tmp_path: Path) -> None:
    """The evaluator's ``best``: ``policy.npz`` and ``state.json``, replaced atomically like any
    checkpoint, and neither writing nor reading it imports torch (1.2 s of CPU in the evaluator)."""
    directory = tmp_path / "checkpoints" / "best"
    done = subprocess.run([sys.executable, "-c", _POLICY_SCRIPT, str(directory)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, f"exit {done.returncode} (3: torch was imported)\n{done.stderr}"
    assert listing(directory) == sorted([checkpoint.POLICY_FILE, STATE_FILE])
    assert listing(directory.parent) == ["best"]  # no temporary or old copy left
    with pytest.raises(CheckpointError, match="holds the policy alone") as info:
        checkpoint.load(directory)  # no training state to resume from: said so, naming the file
    assert str(directory / AGENT_FILE) in str(info.value)


def test_a_policy_checkpoint_of_other_data_names_its_file(tmp_path: Path) -> None:
    directory = checkpoint.save_policy(tmp_path / "best", {"w": np.zeros(3, np.float32)}, {"version": 1})
    checkpoint.write_tree(directory / checkpoint.POLICY_FILE, {"w": "not an array"})
    with pytest.raises(CheckpointError, match=checkpoint.POLICY_FILE):
        checkpoint.load_policy_params(directory)
