"""Shared fixtures: the shipped CartPole config with ``--set`` overrides, role processes, a ZeroMQ context."""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import zmq

from procs import Procs
from tiers import heavy_first, read_durations
from zmqrl import config
from zmqrl.config import Config

torch.set_num_threads(1)


REPO = Path(__file__).resolve().parent.parent
CARTPOLE_YAML = REPO / "configs" / "cartpole_dqn.yaml"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--all-seeds", action="store_true",
                     help="also run the learning tests' extra seeds (marked allseeds): the nightly tier")


SHARED = {"multihost": "netns", "slurm": "slurm"}  # marks of tests that share one resource: for one worker


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without ``--all-seeds`` (or ``-m`` naming ``allseeds``) the extra seeds and controls of learning tests
    (``tiers.seeds``, the ``allseeds`` mark) are deselected; the tests of one shared resource are marked to
    run on one worker (``xdist_group``) and, on an xdist worker, carry their group in their id
    (:func:`_name_groups`); the longest go first (``tiers.heavy_first``, from ``tests/durations.json``)."""
    for item in items:
        for mark, group in SHARED.items():
            if item.get_closest_marker(mark) is not None:
                item.add_marker(pytest.mark.xdist_group(group))
    _name_groups(config, items)
    heavy_first(items, _unit_of, read_durations())
    if config.getoption("--all-seeds") or "allseeds" in (config.getoption("markexpr") or ""):
        return
    extra = [item for item in items if item.get_closest_marker("allseeds") is not None]
    if extra:
        config.hook.pytest_deselected(items=extra)
        items[:] = [item for item in items if item.get_closest_marker("allseeds") is None]


def _group_of(item: pytest.Item) -> str | None:
    """An item's ``xdist_group`` as pytest-xdist names it: its groups' names sorted and joined by ``_``."""
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    return "_".join(sorted(names)) or None


def _name_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker under ``--dist loadgroup``: each grouped test's id ends in ``@GROUP``, the one thing
    the controller's scheduler reads to send a group's tests to one worker, one after another.

    pytest-xdist's worker appends it in its own ``pytest_collection_modifyitems``, which does not do it for
    this suite: (1) it runs before this conftest's hook (its plugin registers after the conftest), so the
    groups the ``slurm`` and ``multihost`` marks give above were never named, whatever the versions; (2) with
    pytest 9.2 it names none at all: it writes ``item._nodeid``, while a node's id is now read from the
    structured ``item._id`` (pytest-xdist issue 1386). This hook runs last (``trylast``) and names the groups
    itself where the id lacks them, through whichever attribute the running pytest reads; should neither
    take, it stops the run rather than let the groups' tests run on both workers at once."""
    if not hasattr(config, "workerinput") or not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        group = _group_of(item)
        if group is None or item.nodeid.endswith(f"@{group}"):
            continue
        named = f"{item.nodeid}@{group}"
        ident = getattr(item, "_id", None)
        if ident is not None and callable(getattr(type(ident), "parse", None)):
            item._id = type(ident).parse(named)  # pytest >= 9.2: the id is structured (_pytest.nodeid.NodeId)
        else:
            item._nodeid = named  # type: ignore[attr-defined]  # earlier pytest: the id is this string
        if item.nodeid != named:
            raise pytest.UsageError(f"cannot put {named!r} in this pytest's node id: the xdist_group "
                                    "would not be kept on one worker (see tests/conftest.py, _name_groups)")


def _unit_of(item: pytest.Item) -> str:
    """What one worker runs as one unit: the tests of an ``xdist_group`` together, any other test alone."""
    group = _group_of(item)
    return f"group:{group}" if group is not None else item.nodeid


@pytest.fixture
def cartpole_cfg() -> Callable[..., Config]:
    """``cartpole_cfg("trainer.max_opts=300", ...)``: the shipped CartPole config with overrides."""

    def make(*overrides: str) -> Config:
        return config.load(CARTPOLE_YAML, list(overrides))

    return make


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """The processes a test starts; all stopped at the end, whatever happened."""
    group = Procs(tmp_path)
    try:
        yield group
    finally:
        group.stop_all()


@pytest.fixture
def zctx() -> Iterator[zmq.Context]:
    """A ZeroMQ context, destroyed without lingering after the test."""
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


# --- the quick tier stays quick -----------------------------------------------------------------------

QUICK_CPU_S = 8.0  # CPU seconds a test outside the slow tier may use (the heaviest quick test takes ~2)
_COSTS = os.environ.get("ZMQRL_TEST_COSTS")  # a file: one JSON line per test (wall time, CPU time)
_started: dict[str, tuple[float, float, float]] = {}


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _started[item.nodeid] = (time.monotonic(), *_cpu())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """After a test's teardown: a test outside the slow tier that started processes (their CPU time shows
    once they are reaped) or used more than :data:`QUICK_CPU_S` of CPU fails, saying to mark it slow, so
    ``-m "not slow"`` stays a quick tier; with ``ZMQRL_TEST_COSTS`` each test's costs are written down."""
    outcome = yield
    if call.when != "teardown" or item.nodeid not in _started:
        return
    wall, own, children = _started.pop(item.nodeid)
    own_after, children_after = _cpu()
    cpu, child_cpu = own_after - own, children_after - children
    slow = item.get_closest_marker("slow") is not None
    if _COSTS:
        with open(_COSTS, "a") as fh:
            fh.write(json.dumps({"test": item.nodeid, "wall_s": round(time.monotonic() - wall, 2),
                                 "cpu_s": round(cpu, 2), "children_cpu_s": round(child_cpu, 2), "slow": slow}) + "\n")
    report = outcome.get_result()
    if not slow and report.passed and (child_cpu > 0 or cpu + child_cpu > QUICK_CPU_S):
        report.outcome = "failed"
        why = "started processes" if child_cpu > 0 else f"used {cpu + child_cpu:.1f} s of CPU"
        report.longrepr = (f"{item.nodeid} {why}: mark it @pytest.mark.slow (the quick tier, -m 'not slow', "
                           f"runs no processes and no test over {QUICK_CPU_S:g} CPU seconds)")
