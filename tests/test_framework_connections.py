"""The frameworks' memory connections of an executor with database access (PostgreSQL): the
runs of kinds ``langgraph`` and ``openai-agents`` share them (``storage.FrameworkStorage``)
instead of opening their own per run, at most one per slot, and the executor's stop closes
them. Opening a saver's connection cost about 12 ms per run and an SDK session's engine 8-10
ms, more than a trivial run's whole life; nothing bounded how many were open at once."""

from __future__ import annotations

import threading

import psycopg
import pytest
from support.factories import make_agent, make_session, post
from support.frameworks import answer_of, answered
from support.processes import ExecutorPool, wait_terminal, wait_until

from agentledger.agent_kinds.storage import (
    CHECKPOINT_POOL_NAME,
    SDK_POOL_NAME,
    setup_framework_storage,
)
from agentledger.core.database import Database

KINDS = {
    "langgraph": ("graph", "framework_agents.lg_graphs:graph", CHECKPOINT_POOL_NAME),
    "openai-agents": ("agent", "framework_agents.sdk_agents:assistant", SDK_POOL_NAME),
}


@pytest.fixture
def pg_fw_db(pg_url):
    setup_framework_storage(pg_url)
    database = Database(pg_url)
    yield database
    database.dispose()


def backends(url: str, application_name: str) -> set[int]:
    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql"), autocommit=True) as conn:
        return {pid for (pid,) in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s", [application_name])}


@pytest.mark.parametrize("kind", list(KINDS))
def test_an_executor_keeps_its_memory_connections_from_run_to_run(pg_fw_db, pg_url, kind):
    param, reference, pool_name = KINDS[kind]
    make_agent(pg_fw_db, "agent", kind=kind, params={param: reference})
    session = make_session(pg_fw_db, agent_id="agent")
    seen: set[int] = set()
    with ExecutorPool(pg_fw_db) as executors:
        executors.start(concurrency=2)
        for text in ("my name is Ada", "one", "two", "what is my name?"):
            answered(pg_fw_db, session, text)
            now = backends(pg_url, pool_name)
            assert now, "the run used connections of its own"
            seen |= now
        assert len(seen) <= 2, seen  # one pool for all four runs, bounded by the slots
        # The memory is the thread's, as with connections of the run's own.
        last = answered(pg_fw_db, session, "and now?")
        assert answer_of(pg_fw_db, last).startswith("You first said: my name is Ada.")
    wait_until(lambda: not backends(pg_url, pool_name), timeout=5,
               message="the executor's stop to close its memory connections")


def test_runs_at_once_share_at_most_one_connection_per_slot(pg_fw_db, pg_url):
    for kind, (param, reference, _name) in KINDS.items():
        make_agent(pg_fw_db, kind, kind=kind, params={param: reference})
    sessions = [make_session(pg_fw_db, agent_id=kind) for kind in KINDS for _ in range(4)]
    peak = {name: 0 for _p, _r, name in KINDS.values()}
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            for name in peak:
                peak[name] = max(peak[name], len(backends(pg_url, name)))

    with ExecutorPool(pg_fw_db) as executors:
        executors.start(concurrency=3)
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            posted = [post(pg_fw_db, s, f"question {i}").run_id for i, s in enumerate(sessions)]
            for run_id in posted:
                wait_terminal(pg_fw_db, run_id, timeout=60)
        finally:
            watching.set()
            watcher.join()
        for run_id in posted:
            assert answer_of(pg_fw_db, run_id).startswith("Hello, you said: question")
    assert all(1 <= n <= 3 for n in peak.values()), peak
