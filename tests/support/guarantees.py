"""Shared helpers of tests/test_guarantees_*.py: runs seeded with many events through the real
write path. The seed and the soak switch (``SEED``, ``SOAK``, ``soak``, ``seeded_random``) live in
``support.seeds`` and are re-exported here.
"""

from __future__ import annotations

import random

from agentledger.core.database import Database
from ingest.events import append_events
from ingest.leases import claim_run
from support.factories import make_session, post
from support.seeds import SEED, SOAK, seeded_random, soak

__all__ = ["SEED", "SEED_INSTANCE", "SOAK", "event_batch", "seed_runs", "seeded_random", "soak"]

SEED_INSTANCE = "guarantee-seeder"


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
