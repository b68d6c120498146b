"""A stopping ``agentledger worker`` exits even when agent code it cannot interrupt is still
running in a framework's own threads (a cancelled LangGraph run whose model call hangs)."""

from __future__ import annotations

import signal
import time

import pytest
from support.factories import make_agent, make_session, post
from support.frameworks import WORKER_PYTHONPATH
from support.processes import assert_one_terminal_event, types, wait_terminal, wait_until

from agentledger.agent_kinds.storage import setup_framework_storage
from ingest.cancel import request_cancel

# Runs that must end as they would: a lease that outlasts a stall of a busy machine.
WORKER_ENV = {"AGENTLEDGER_LEASE_SECONDS": "15", "AGENTLEDGER_HEARTBEAT_SECONDS": "1",
              "AGENTLEDGER_RECONCILE_SECONDS": "1", "PYTHONPATH": WORKER_PYTHONPATH}


@pytest.mark.slow  # a worker process and a hung model call
def test_a_worker_stops_and_exits_though_a_cancelled_graph_is_stuck_in_its_model_call(
        db, db_url, procs):
    setup_framework_storage(db_url)
    make_agent(db, "staller", kind="langgraph",
               params={"graph": "framework_agents.lg_graphs:stalling"})
    session = make_session(db, agent_id="staller")
    worker = procs.worker(db_url, "exit-worker", **WORKER_ENV)
    stalled = post(db, session, "stall for a while").run_id
    wait_until(lambda: "message.delta" in types(db, stalled), timeout=60,
               message=lambda: f"the graph to be mid-flight: {types(db, stalled)}\n{procs.logs()}")
    with db.write() as s:
        request_cancel(s, stalled, requested_by="alice")
    wait_terminal(db, stalled, timeout=30)
    assert assert_one_terminal_event(db, stalled).type == "run.cancelled"

    worker.send(signal.SIGTERM)
    signalled = time.monotonic()
    assert worker.wait(20) == 0, worker.log()
    print(f"the worker exited {time.monotonic() - signalled:.2f}s after SIGTERM")
    assert "exiting without waiting for agent code" in worker.log()
