"""What the session collected, before ``-m`` / ``-k`` deselect anything: kept by
``conftest.pytest_collection_modifyitems`` for the test of the fast tier's share."""

from __future__ import annotations

from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Collected:
    modules: frozenset[str]  # paths relative to the root, e.g. "tests/test_api_runs.py"
    total: int
    fast: int  # without the ``slow`` mark


COLLECTED = pytest.StashKey[Collected]()
