"""Shared helpers of tests/test_guarantees_*.py: a replayable random seed (``GUARANTEE_SEED``),
``SOAK=1`` counts, and runs seeded with many events through the real write path.

Every test derives its own ``random.Random`` from the seed and a name, so one test replays alone.
"""

from __future__ import annotations

import os
import random

from factories import make_session, post

from agentledger.core.database import Database
from ingest.events import append_events
from ingest.leases import claim_run

SEED = int(os.environ.get("GUARANTEE_SEED") or random.SystemRandom().randrange(2**32))
SOAK = os.environ.get("SOAK") == "1"
SEED_INSTANCE = "guarantee-seeder"


def soak(default: int, soaked: int) -> int:
    """``soaked`` under ``SOAK=1``, else ``default``."""
    return soaked if SOAK else default


def seeded_random(name: str) -> random.Random:
    """The named test's own generator; prints the seed that replays it."""
    print(f"[guarantees] {name}: GUARANTEE_SEED={SEED} (set it to replay)")
    return random.Random(f"{SEED}:{name}")


_TEXT = "abc xyz 0123 é ß 漢字 🙂 \n\r\t \\ \" ' : data: id: event: <>&"


def event_batch(rng: random.Random, n: int) -> list[tuple[str, dict]]:
    """``n`` random progress events (deltas, tool calls and results, usage)."""
    batch: list[tuple[str, dict]] = []
    for _ in range(n):
        kind = rng.random()
        text = "".join(rng.choice(_TEXT) for _ in range(rng.randint(0, 40)))
        if kind < 0.7:
            batch.append(("message.delta", {"text": text}))
        elif kind < 0.8:
            batch.append(("tool.call", {"name": "search", "input": {"q": text}}))
        elif kind < 0.9:
            batch.append(("tool.result", {"name": "search", "output": [text, rng.random()]}))
        else:
            batch.append(("usage", {"input_tokens": rng.randint(0, 500),
                                    "output_tokens": rng.randint(0, 500),
                                    "cost_usd": round(rng.random() / 100, 6)}))
    return batch


def seed_runs(db: Database, rng: random.Random, *, runs: int, events_per_run: int,
              finish: bool = True, owner: str = "alice", agent_id: str = "echo") -> list[str]:
    """``runs`` runs of ``events_per_run`` events each (``run.queued`` and ``run.started``
    included), claimed by ``SEED_INSTANCE`` with a long lease; with ``finish`` the last event is
    ``run.completed``, else the run stays running (append with its ``executor_instance_id``)."""
    run_ids = []
    for i in range(runs):
        session_id = make_session(db, owner=owner, agent_id=agent_id, title=f"seeded {i}")
        run_id = post(db, session_id, f"seeded run {i}", owner=owner).run_id
        with db.write() as s:
            claim_run(s, run_id, SEED_INSTANCE, lease_seconds=3600)
        remaining = events_per_run - 2
        while remaining > 0:
            n = min(remaining, rng.randint(1, 50))
            batch = event_batch(rng, n)
            if finish and n == remaining:
                batch[-1] = ("run.completed", {})
            with db.write() as s:
                append_events(s, run_id, batch, executor_instance_id=SEED_INSTANCE)
            remaining -= n
        run_ids.append(run_id)
    return run_ids
