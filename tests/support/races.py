"""Helpers for tests/test_guarantees_races.py: a replayable random seed, concurrent firing of HTTP
requests, deterministic two-connection interleavings, and whole-table tallies of runs' events.

The seed (``SEED``, ``seeded``) comes from ``support.seeds``: ``GUARANTEE_SEED`` replays a run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import requests
from sqlalchemy import func, select

from agentledger.core.database import Database
from agentledger.core.schema import AgentRun, RunEvent
from support.seeds import SEED, seeded

__all__ = ["SEED", "Answer", "Interleaving", "ORDERED", "Outcome", "event_counts",
           "fire_together", "interleave", "run_together", "seeded", "status_counts",
           "terminal_counts"]

TERMINAL_EVENTS = ("run.completed", "run.failed", "run.cancelled", "run.interrupted")


# --------------------------------------------------------------------------------------------
# concurrent HTTP
# --------------------------------------------------------------------------------------------


def run_together(n: int, work) -> list:
    """Call ``work(i)`` in ``n`` threads released at the same instant; return results/errors."""
    barrier = threading.Barrier(n)

    def task(i):
        barrier.wait(timeout=30)
        try:
            return work(i)
        except Exception as exc:  # noqa: BLE001 - returned to the test, which checks it
            return exc

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(task, range(n)))


@dataclass
class Answer:
    status: int
    body: Any
    headers: dict[str, str]
    tag: str = ""


def fire_together(base_url: str, token: str, requests_: list[tuple[str, str, dict, dict]],
                  *, timeout: float = 60.0) -> list[Answer]:
    """Send every (tag, path, json, headers) POST at once: one thread and one connection each,
    all released by one barrier once their connections are set up."""
    barrier = threading.Barrier(len(requests_))
    answers: list[Answer | None] = [None] * len(requests_)
    errors: list[BaseException] = []

    def one(i: int, tag: str, path: str, body: dict, headers: dict) -> None:
        http = requests.Session()
        http.headers["Authorization"] = f"Bearer {token}"
        try:
            http.get(base_url + "/api/health", timeout=timeout)  # open the connection first
            barrier.wait(timeout)
            r = http.post(base_url + path, json=body, headers=headers, timeout=timeout)
            try:
                payload = r.json()
            except ValueError:
                payload = r.text
            answers[i] = Answer(r.status_code, payload, dict(r.headers), tag)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            http.close()

    threads = [threading.Thread(target=one, args=(i, *req), daemon=True)
               for i, req in enumerate(requests_)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    assert not errors, errors[:3]
    assert all(a is not None for a in answers), "a request thread did not finish"
    return answers  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# two connections, interleaved
# --------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    value: Any = None
    error: BaseException | None = None
    began: float = 0.0
    ended: float = 0.0


@dataclass
class Interleaving:
    """How two operations (each one write transaction) meet.

    ``a_then_b`` / ``b_then_a``: one commits before the other begins.
    ``a_holds`` / ``b_holds``: the first does its work and keeps its transaction open while the
    second starts (and waits on the row lock, skips the locked row, or waits for SQLite's write
    lock); then the first commits.
    ``together``: both released by one barrier, each after a random delay of up to ``jitter``.
    """

    name: str
    jitter_a: float = 0.0
    jitter_b: float = 0.0
    extra: dict = field(default_factory=dict)


ORDERED = ("a_then_b", "b_then_a", "a_holds", "b_holds")
HOLD_SECONDS = 0.15


def interleave(db: Database, how: Interleaving, op_a: Callable, op_b: Callable
               ) -> tuple[Outcome, Outcome]:
    """Run ``op_a(session)`` and ``op_b(session)``, each in its own ``db.write()`` transaction
    (its own connection), in the interleaving ``how``. Errors are returned, not raised."""
    out_a, out_b = Outcome(), Outcome()

    def run(op, out: Outcome, *, before: Callable[[], None] | None = None,
            hold: Callable[[], None] | None = None) -> None:
        if before:
            before()
        out.began = time.monotonic()
        try:
            with db.write() as s:
                try:
                    out.value = op(s)
                except BaseException as exc:  # noqa: BLE001 - the caller judges it
                    out.error = exc
                if hold:
                    hold()  # refused or not, the transaction (and its locks) stays open
                if out.error is not None:
                    raise out.error
        except BaseException as exc:  # noqa: BLE001
            out.error = exc
        out.ended = time.monotonic()

    if how.name == "a_then_b":
        run(op_a, out_a)
        run(op_b, out_b)
    elif how.name == "b_then_a":
        run(op_b, out_b)
        run(op_a, out_a)
    elif how.name in ("a_holds", "b_holds"):
        first, second = (op_a, op_b) if how.name == "a_holds" else (op_b, op_a)
        out_first, out_second = (out_a, out_b) if how.name == "a_holds" else (out_b, out_a)
        worked, release = threading.Event(), threading.Event()

        def hold():
            worked.set()
            release.wait(10)

        t1 = threading.Thread(target=run, args=(first, out_first), kwargs={"hold": hold})
        t1.start()
        assert worked.wait(10), "first operation never got to its commit"
        t2 = threading.Thread(target=run, args=(second, out_second))
        t2.start()
        time.sleep(HOLD_SECONDS)  # the second is now blocked on a lock (or already done)
        how.extra["released_at"] = time.monotonic()
        release.set()
        t1.join(20)
        t2.join(20)
    elif how.name == "together":
        barrier = threading.Barrier(2)

        def gate(delay):
            return lambda: (barrier.wait(10), time.sleep(delay))

        t1 = threading.Thread(target=run, args=(op_a, out_a), kwargs={"before": gate(how.jitter_a)})
        t2 = threading.Thread(target=run, args=(op_b, out_b), kwargs={"before": gate(how.jitter_b)})
        t1.start()
        t2.start()
        t1.join(20)
        t2.join(20)
    else:  # pragma: no cover
        raise ValueError(how.name)
    return out_a, out_b


# --------------------------------------------------------------------------------------------
# tallies
# --------------------------------------------------------------------------------------------


def event_counts(db: Database, run_ids, event_type: str) -> dict[str, int]:
    """How many events of ``event_type`` each run has (0 included)."""
    run_ids = list(run_ids)
    found: dict[str, int] = {}
    with db.read() as s:
        for start in range(0, len(run_ids), 500):
            chunk = run_ids[start:start + 500]
            found.update(s.execute(
                select(RunEvent.run_id, func.count())
                .where(RunEvent.run_id.in_(chunk), RunEvent.type == event_type)
                .group_by(RunEvent.run_id)
            ).all())
    return {r: found.get(r, 0) for r in run_ids}


def terminal_counts(db: Database, run_ids) -> dict[str, int]:
    run_ids = list(run_ids)
    found: dict[str, int] = {}
    with db.read() as s:
        for start in range(0, len(run_ids), 500):
            chunk = run_ids[start:start + 500]
            found.update(s.execute(
                select(RunEvent.run_id, func.count())
                .where(RunEvent.run_id.in_(chunk), RunEvent.type.in_(TERMINAL_EVENTS))
                .group_by(RunEvent.run_id)
            ).all())
    return {r: found.get(r, 0) for r in run_ids}


def status_counts(db: Database, run_ids) -> dict[str, int]:
    run_ids = list(run_ids)
    tally: dict[str, int] = {}
    with db.read() as s:
        for start in range(0, len(run_ids), 500):
            chunk = run_ids[start:start + 500]
            for st, n in s.execute(
                select(AgentRun.status, func.count())
                .where(AgentRun.id.in_(chunk)).group_by(AgentRun.status)
            ).all():
                tally[st] = tally.get(st, 0) + n
    return tally
