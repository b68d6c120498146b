"""Writers of one run tree meeting on PostgreSQL's row locks, each interleaving forced (one
transaction held open while the other is seen waiting on a lock), not left to chance:

- a cancel of a tree against a delegation in progress under one of its runs: the cascade
  reaches the children that delegation creates, and a delegation of two children in one
  transaction (the built-in worker's) does not deadlock with it;
- a claim of a child run against its parent's ending: no child starts after its parent ended;
- concurrent duplicates of one message post under a rate limit: one run, one slot, and every
  duplicate answered as a replay, never ``rate_limited``.

SQLite serialises writers (``BEGIN IMMEDIATE``), so none of these can interleave there; the same
properties are checked on both databases by the suites of each operation.
"""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from typing import Any

import pytest
from sqlalchemy import select, text
from support.factories import claim, make_agent, make_session, post

from agentledger.core.database import Database
from agentledger.core.errors import LedgerError
from agentledger.core.schema import AgentRun, RateLimitWindow
from ingest.cancel import request_cancel
from ingest.events import append_events
from ingest.leases import claim_runs
from ingest.runs import create_child_run, post_message, post_message_alone, request_checksum


def _status(db: Database, run_id: str) -> str:
    with db.read() as s:
        return s.execute(select(AgentRun.status).where(AgentRun.id == run_id)).scalar_one()


def _wait_for_a_lock_wait(db: Database, timeout: float = 20.0) -> None:
    """Until a backend of this database waits on a lock (the other side of the interleaving)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with db.read() as s:
            waiting = s.execute(text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'")).scalar_one()
        if waiting:
            return
        time.sleep(0.02)
    raise AssertionError("the other transaction never waited on a lock")


class Background:
    """``fn()`` in a thread; ``result()`` joins it and returns its value or raises its error."""

    def __init__(self, fn):
        self._out: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self._out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test by result()
            self._out["error"] = exc

    def result(self, timeout: float = 30.0):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the other transaction never finished"
        if "error" in self._out:
            raise self._out["error"]
        return self._out["value"]


@pytest.fixture
def tree(pg_db):
    """A root run held by ``exec-root`` with one child, ``mid``, held by ``exec-mid``."""
    make_agent(pg_db, "echo")
    session_id = make_session(pg_db)
    root = post(pg_db, session_id, "the question").run_id
    assert [c.run_id for c in claim(pg_db, "exec-root")] == [root]
    with pg_db.write() as s:
        mid = create_child_run(s, root, agent_id="echo", input="mid",
                               executor_instance_id="exec-root")
    assert [c.run_id for c in claim(pg_db, "exec-mid")] == [mid]
    return {"db": pg_db, "root": root, "mid": mid}


@pytest.mark.parametrize("children", [1, 2], ids=["one-child", "two-children"])
def test_a_cancel_reaches_the_children_a_delegation_in_progress_creates(tree, children):
    """The delegation holds ``mid`` while the cancel has locked the root and waits for ``mid``.
    With two children the delegation updates ``mid`` twice, and the second update checks its
    ``parent_run_id`` again (a KEY SHARE lock on the root, which the cancel holds)."""
    db, root, mid = tree["db"], tree["root"], tree["mid"]
    with ExitStack() as stack:
        s = stack.enter_context(db.write())
        created = [create_child_run(s, mid, agent_id="echo", input="leaf 1",
                                    executor_instance_id="exec-mid")]

        def cancel() -> str:
            with db.write() as c:
                return request_cancel(c, root, requested_by="alice")

        cancelling = Background(cancel)
        _wait_for_a_lock_wait(db)
        created += [create_child_run(s, mid, agent_id="echo", input=f"leaf {n}",
                                     executor_instance_id="exec-mid")
                    for n in range(2, children + 1)]
    assert cancelling.result() == "cancelling"
    assert [_status(db, r) for r in (root, mid)] == ["cancelling", "cancelling"]
    assert [_status(db, leaf) for leaf in created] == ["cancelled"] * children
    assert claim(db, "exec-other") == []


def test_a_child_is_never_started_after_its_parent_ended(tree):
    """The claim chooses ``leaf`` while its parent's ending is written but not committed."""
    db, mid = tree["db"], tree["mid"]
    with db.write() as s:
        leaf = create_child_run(s, mid, agent_id="echo", input="leaf",
                                executor_instance_id="exec-mid")
    with ExitStack() as stack:
        s = stack.enter_context(db.write())
        append_events(s, mid, [("run.completed", {"content": "done without it"})],
                      executor_instance_id="exec-mid")

        def claim_now() -> list[str]:
            with db.write() as c:
                return [r.run_id for r in claim_runs(c, "exec-leaf", max_runs=10)]

        assert Background(claim_now).result() == []
    assert _status(db, mid) == "succeeded"
    assert claim(db, "exec-leaf") == []
    assert _status(db, leaf) == "queued"  # the reconciler's to interrupt (parent_terminal)


def test_concurrent_duplicates_of_a_post_take_one_rate_limit_slot(pg_db):
    """The second post of the same request waits for the first's insert; it must answer as its
    replay, not count against the owner's minute (with a limit of 1, refused)."""
    make_agent(pg_db, "echo")
    session_id = make_session(pg_db)
    body = {"content": "once"}
    path = f"/api/sessions/{session_id}/messages"

    def send_again():
        return post_message_alone(pg_db, owner_id="alice", session_id=session_id,
                                  idempotency_key="dup", content="once", request=(path, body),
                                  rate_limit_per_minute=1)

    with ExitStack() as stack:
        first_tx = stack.enter_context(pg_db.write())
        first = post_message(first_tx, owner_id="alice", session_id=session_id,
                             idempotency_key="dup", content="once",
                             checksum=request_checksum(path, body), rate_limit_per_minute=1)
        duplicate = Background(send_again)
        _wait_for_a_lock_wait(pg_db)
    try:
        again = duplicate.result()
    except LedgerError as exc:
        pytest.fail(f"the duplicate was refused: {exc.status} {exc.code}: {exc.message}")
    assert again.run_id == first.run_id and again.replayed
    with pg_db.read() as s:
        counted = s.execute(select(RateLimitWindow.count)
                            .where(RateLimitWindow.owner_id == "alice")).scalars().all()
        runs = s.execute(select(AgentRun.id)).scalars().all()
    assert counted == [1] and runs == [first.run_id]
