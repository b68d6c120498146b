"""Replayable randomness and the soak switch, read from the environment in one place.

``GUARANTEE_SEED`` fixes the seed (otherwise one is drawn per test process and printed by every
test that uses it); ``SOAK=1`` makes the count-driven tests run their soak counts. Every test
derives its own ``random.Random`` from the seed and its name, so one test replays alone.
"""

from __future__ import annotations

import os
import random

SEED = int(os.environ.get("GUARANTEE_SEED") or random.SystemRandom().randrange(2**32))
SOAK = os.environ.get("SOAK") == "1"


def soak(default: int, soaked: int) -> int:
    """``soaked`` under ``SOAK=1``, else ``default``: example counts are chosen up front."""
    return soaked if SOAK else default


def seeded_random(name: str) -> random.Random:
    """The named test's own generator; prints the seed that replays it."""
    print(f"[guarantees] {name}: GUARANTEE_SEED={SEED} (set it to replay)")
    return random.Random(f"{SEED}:{name}")


seeded = seeded_random
