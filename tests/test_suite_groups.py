"""The suite's ``xdist_group``s hold: under the suite's own options (``addopts`` in ``pyproject.toml``: two
workers, ``--dist loadgroup``) and its own ``tests/conftest.py``, the tests of one group run on one worker,
one after another, while the other worker runs the rest; and the longest units still start first.

A small suite is run in a subprocess, with a copy of ``tests/conftest.py`` as its conftest (its durations
this test's, not ``tests/durations.json``): two tests marked ``slurm``, two marked ``multihost`` (the groups
the conftest gives those marks) and two with an ``xdist_group`` of their own, first in the file, then a
few ungrouped tests, the last of them the longest by its duration. Each grouped test takes its group's
lock file (exclusive create: finding it taken means another test of its group is running) and holds it
until the other worker has started a test, so that two tests of one group sent to both workers do
overlap, and are caught; each test writes down its worker and when it ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
GROUPS = {"slurm": ["slurm_0", "slurm_1"], "netns": ["netns_0", "netns_1"], "own": ["own_0", "own_1"]}
# the order heavy_first gives: test_alone[5] alone, then the slurm group (6 s), netns (2 s), own (1 s), the rest
DURATIONS = {"test_inner.py::test_alone[5]": 100.0, "test_inner.py::test_slurm[0]": 3.0,
             "test_inner.py::test_slurm[1]": 3.0, "test_inner.py::test_netns[0]": 2.0,
             "test_inner.py::test_own[1]": 1.0}
RUN_TIMEOUT_S = 180  # the inner run: three Python processes that import torch, and tests that take milliseconds

INNER = r'''
import json, os, time
from pathlib import Path

import pytest

OUT = Path(os.environ["GROUPS_OUT"])
WAIT_S = 30  # for the other worker to start a test


def started(name: str) -> str:
    worker = os.environ["PYTEST_XDIST_WORKER"]
    with open(OUT / f"order-{worker}", "a") as fh:
        fh.write(name + "\n")
    (OUT / f"started-{worker}").touch()
    return worker


def hold(group: str, name: str) -> None:
    worker, start = started(name), time.monotonic()
    lock = OUT / f"{group}.lock"
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        mine = True
    except FileExistsError:
        mine = False
        (OUT / f"overlap-{name}").write_text(worker)
    deadline = time.monotonic() + WAIT_S
    while not [p for p in OUT.glob("started-*") if p.name != f"started-{worker}"]:
        assert time.monotonic() < deadline, f"no test started on the other worker within {WAIT_S} s"
        time.sleep(0.01)
    if mine:
        lock.unlink()
    (OUT / f"ran-{name}.json").write_text(json.dumps(
        {"group": group, "worker": worker, "start": start, "end": time.monotonic()}))
    assert mine, f"{name}: another test of the group {group!r} was running"


@pytest.mark.slurm
@pytest.mark.parametrize("i", [0, 1])
def test_slurm(i):
    hold("slurm", f"slurm_{i}")


@pytest.mark.multihost
@pytest.mark.parametrize("i", [0, 1])
def test_netns(i):
    hold("netns", f"netns_{i}")


@pytest.mark.xdist_group("own")
@pytest.mark.parametrize("i", [0, 1])
def test_own(i):
    hold("own", f"own_{i}")


@pytest.mark.parametrize("i", range(6))
def test_alone(i):
    started(f"alone_{i}")
'''


@pytest.mark.slow  # it starts processes: a pytest and its two workers
def test_a_group_runs_on_one_worker_one_test_after_another(tmp_path: Path) -> None:
    suite, out = tmp_path / "suite", tmp_path / "out"
    suite.mkdir()
    out.mkdir()
    (suite / "conftest.py").write_text((TESTS / "conftest.py").read_text() + "\n\n"
                                       f"def read_durations() -> dict[str, float]:\n    return {DURATIONS!r}\n")
    (suite / "test_inner.py").write_text(INNER)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "ZMQRL_TEST_COSTS")) and k != "PYTHONPATH"}
    env["GROUPS_OUT"] = str(out)
    # the suite's own configuration (addopts, markers, pythonpath), its ids relative to the small suite
    argv = ["-c", str(REPO / "pyproject.toml"), "--rootdir", str(suite), "-v", "-p", "no:cacheprovider", str(suite)]
    done = subprocess.run([sys.executable, "-m", "pytest", *argv], cwd=suite, env=env, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S)
    log = done.stdout[-6000:] + done.stderr[-3000:]
    assert "[gw1]" in done.stdout, f"the inner suite did not run on two workers\n{log}"
    overlaps = sorted(p.name.removeprefix("overlap-") for p in out.glob("overlap-*"))
    assert not overlaps, f"tests ran while another of their group was running: {overlaps}\n{log}"
    runs = {p.name.removeprefix("ran-").removesuffix(".json"): json.loads(p.read_text()) for p in out.glob("ran-*")}
    for group, names in GROUPS.items():
        assert set(names) <= set(runs), f"{group}: ran {sorted(runs)}\n{log}"
        workers = {runs[n]["worker"] for n in names}
        assert len(workers) == 1, f"the group {group!r} ran on {sorted(workers)}\n{log}"
        spans = sorted((runs[n]["start"], runs[n]["end"]) for n in names)
        assert all(end <= after for (_, end), (after, _) in pairwise(spans)), f"{group}: {spans}\n{log}"
    assert {p.name for p in out.glob("started-*")} == {"started-gw0", "started-gw1"}, sorted(out.iterdir())
    # each worker starts with one of the first two units of the conftest's order (longest first)
    firsts = {(out / f"order-gw{i}").read_text().split()[0] for i in (0, 1)}
    assert firsts == {"alone_5", "slurm_0"}, f"the workers started with {sorted(firsts)}\n{log}"
    assert done.returncode == 0, log
    assert " 12 passed" in done.stdout, log
