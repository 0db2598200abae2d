"""The test tiers: ``-m "not slow"`` (quick: no processes, no learning), the whole suite (one seed per
learning test), and ``--all-seeds`` (a nightly job: every seed of every learning test)."""

from __future__ import annotations

from typing import Any

import pytest


def seeds(first: int, *more: int) -> list[Any]:
    """Seeds to parametrize a learning test with: ``first`` in every run of the suite, ``more`` only with
    ``--all-seeds`` (they carry the ``allseeds`` mark)."""
    return [first, *(pytest.param(seed, marks=pytest.mark.allseeds) for seed in more)]
