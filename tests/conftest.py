"""Shared fixtures: the shipped CartPole config with ``--set`` overrides, role processes, a ZeroMQ context."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import zmq

from procs import Procs
from zmqrl import config
from zmqrl.config import Config

torch.set_num_threads(1)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--allseeds", action="store_true",
                     help="also run the extra seeds (and controls) of learning goals, the tests marked allseeds "
                          "(nightly runs; also run when -m names allseeds)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``allseeds`` run only when asked for: one seed of a learning goal is CI's, all are nightly's."""
    if config.getoption("--allseeds") or "allseeds" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="an extra seed (or control) of a learning goal: run with --allseeds")
    for item in items:
        if "allseeds" in item.keywords:
            item.add_marker(skip)

REPO = Path(__file__).resolve().parent.parent
CARTPOLE_YAML = REPO / "configs" / "cartpole_dqn.yaml"


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
