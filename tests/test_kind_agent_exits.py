"""An agent's ``sys.exit()`` or ``KeyboardInterrupt`` (a LangGraph node, an Agents SDK tool)
fails its run at once, ``agent_error`` like any other exception of the agent (CONTRACT §7),
instead of leaving it ``running`` until its lease expires; the worker goes on serving runs."""

from __future__ import annotations

import gc
import logging

import pytest
from support.factories import make_agent, make_session
from support.frameworks import WORKER_PYTHONPATH, answer_of, answered, ask
from support.processes import events, run

AGENTS = [
    pytest.param("langgraph", {"graph": "framework_agents.lg_side_calls:exiting"},
                 id="langgraph"),
    # asyncio lets SystemExit / KeyboardInterrupt out of the event loop at once (no coroutine
    # can catch them), so ``asyncio.run`` closes the loop under the SDK's unfinished coroutines
    # ("Exception ignored in" when they are collected) and, on SQLite, under the session's
    # aiosqlite connection thread ("Event loop is closed"). The run's outcome, the session and
    # the worker are as asserted; those reports are the test's own (collected before it ends).
    pytest.param("openai-agents", {"agent": "framework_agents.sdk_agent_tools:leaver"},
                 id="openai-agents", marks=[
                     pytest.mark.filterwarnings(
                         "ignore::pytest.PytestUnhandledThreadExceptionWarning"),
                     pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
                 ]),
]
LEAVING = [("exit", "SystemExit: 3"), ("interrupt", "KeyboardInterrupt: pressed")]


@pytest.mark.parametrize(("kind", "params"), AGENTS)
def test_an_agent_leaving_the_interpreter_fails_its_run_and_the_worker_goes_on(
        fw_db, fw_executors, kind, params, caplog):
    if kind == "openai-agents":
        # No log record (pytest keeps them until the test ends) may hold an exit's traceback,
        # which holds the coroutines its aborted event loop left: they are collected below.
        caplog.set_level(logging.CRITICAL)
    make_agent(fw_db, "leaver", kind=kind, params=params)
    session = make_session(fw_db, agent_id="leaver")
    # One slot: the run after each exit is served by the same executor, in the thread the
    # exit left.
    fw_executors.start(concurrency=1)
    for text, message in LEAVING:
        # Well within the executor's lease: the run ends at once, not when the lease expires.
        run_id, end = ask(fw_db, session, text, timeout=20)
        assert end.type == "run.failed", end
        assert end.data["error"] == {"code": "agent_error", "message": message}
        assert run(fw_db, run_id).error == end.data["error"]
        assert [e.type for e in events(fw_db, run_id)][-1] == "run.failed"
    after = answered(fw_db, session, "fine")
    assert "still here: fine" in answer_of(fw_db, after)
    gc.collect()  # what the aborted event loops left is reported here, not in a later test


def test_a_worker_process_survives_an_agent_exit(fw_db, db_url, procs):
    make_agent(fw_db, "leaver", kind="langgraph",
               params={"graph": "framework_agents.lg_side_calls:exiting"})
    session = make_session(fw_db, agent_id="leaver")
    worker = procs.worker(db_url, "exit-worker", PYTHONPATH=WORKER_PYTHONPATH)
    run_id, end = ask(fw_db, session, "exit", timeout=60)
    assert end.data["error"] == {"code": "agent_error", "message": "SystemExit: 3"}, procs.logs()
    after = answered(fw_db, session, "fine", timeout=60)
    assert answer_of(fw_db, after) == "still here: fine"
    assert {run(fw_db, r).executor_instance_id for r in (run_id, after)} == {"exit-worker"}
    assert worker.alive()  # the exit ended a run, not the worker
