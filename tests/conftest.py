"""Shared fixtures: the shipped CartPole config, loadable with ``--set`` overrides."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from zmqrl import config
from zmqrl.config import Config

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parent.parent
CARTPOLE_YAML = REPO / "configs" / "cartpole_dqn.yaml"


@pytest.fixture
def cartpole_cfg() -> Callable[..., Config]:
    """``cartpole_cfg("trainer.max_opts=300", ...)``: the shipped CartPole config with overrides."""

    def make(*overrides: str) -> Config:
        return config.load(CARTPOLE_YAML, list(overrides))

    return make
