"""The fast tier (``python -m pytest -m "not slow"``) keeps most of the suite.

``slow`` is applied from fixtures (``tests/conftest.py``): a test that starts processes, a
browser or a soak loop leaves the fast tier by itself. This checks, by collection only, that
the fast tier still holds at least 60 % of the collected tests.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from support.tiers import COLLECTED, Collected

ROOT = Path(__file__).resolve().parent.parent
FAST_SHARE = 0.60


def _collected_apart() -> Collected:
    """The whole suite's tiers from a collection of its own (a run of only some modules)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
         "-m", "not slow", "tests"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = re.search(r"(\d+)/(\d+) tests collected", done.stdout)
    assert found, done.stdout[-2000:]
    return Collected(frozenset(), total=int(found.group(2)), fast=int(found.group(1)))


def test_the_fast_tier_keeps_at_least_60_percent_of_the_tests(request):
    # A session that collected every module already knows (its collection, before ``-m`` or
    # ``-k`` deselected anything); a narrower one collects the suite apart.
    every_module = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")}
    collected = request.config.stash.get(COLLECTED, None)
    if collected is None or not every_module <= collected.modules:
        collected = _collected_apart()
    fast, total = collected.fast, collected.total
    print(f"fast tier: {fast} of {total} tests ({fast / total:.0%})")
    assert total > 0 and fast / total >= FAST_SHARE, (fast, total)
