"""Tests for atomic checkpoints: round trips, replacement, crash recovery and clear errors."""

from __future__ import annotations

import collections
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from zmqrl import checkpoint
from zmqrl.checkpoint import AGENT_FILE, STATE_FILE, CheckpointError


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
    checkpoint.write_json_atomic(path, {"b": 1, "a": [1.5, None], "n": np.float32(0.5)})
    assert json.loads(path.read_text()) == {"a": [1.5, None], "b": 1, "n": 0.5}
    checkpoint.write_json_atomic(path, {"second": True})
    assert json.loads(path.read_text()) == {"second": True}
    assert listing(tmp_path) == ["summary.json"]  # no temporary file left behind


def test_write_json_atomic_failure_keeps_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    checkpoint.write_json_atomic(path, {"ok": 1})
    with pytest.raises(TypeError):
        checkpoint.write_json_atomic(path, {"bad": object()})
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
    copied = checkpoint.plain_copy({"a": [array]})
    array[0] = 1.0
    assert copied["a"][0][0] == 0.0
    for bad in (object(), {"a": [np.array([object()])]}, {1: 2}, b"bytes"):
        assert not checkpoint.is_plain(bad)
        with pytest.raises(TypeError, match="not plain data"):
            checkpoint.plain_copy(bad)


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
from zmqrl import checkpoint
params = {"torso.0.weight": np.arange(12, dtype=np.float32).reshape(3, 4), "mean.bias": np.ones(2, np.float32)}
directory = checkpoint.save_policy(sys.argv[1], params, {"version": 7, "eval_return": -150.5})
checkpoint.save_policy(directory, {k: v + 1 for k, v in params.items()}, {"version": 9, "eval_return": -120.0})
got, state = checkpoint.load_policy_params(directory)
assert state == {"version": 9, "eval_return": -120.0}, state
assert set(got) == set(params) and all(np.array_equal(got[k], params[k] + 1) and got[k].dtype == np.float32
                                       for k in params), got
sys.exit(3 if "torch" in sys.modules else 0)
'''


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
