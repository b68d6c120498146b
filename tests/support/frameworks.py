"""What the framework-kind tests (LangGraph, the Agents SDK) share: a message and its run's
end, a run's answer, and two turns of one session executed by a separate worker process."""

from __future__ import annotations

import os
from pathlib import Path

from support.factories import post
from support.processes import (
    ProcessManager,
    assert_one_terminal_event,
    message_content,
    run,
    wait_terminal,
)

TESTS = Path(__file__).resolve().parent.parent
# A worker process imports agents by reference (``framework_agents.…``): it needs the tests'
# packages on its path.
WORKER_PYTHONPATH = os.pathsep.join([str(TESTS.parent), str(TESTS)])


def ask(db, session_id: str, text: str, *, timeout: float = 30.0):
    """Post ``text``, wait for its run to end; the run id and its one terminal event."""
    posted = post(db, session_id, text)
    wait_terminal(db, posted.run_id, timeout=timeout)
    return posted.run_id, assert_one_terminal_event(db, posted.run_id)


def answered(db, session_id: str, text: str, *, timeout: float = 30.0) -> str:
    """``ask``, checked: the run ended ``run.completed``; its id."""
    run_id, end = ask(db, session_id, text, timeout=timeout)
    assert end.type == "run.completed", end
    return run_id


def answer_of(db, run_id: str) -> str:
    return message_content(db, run(db, run_id).final_message_id)


def two_turns_in_a_worker(db, db_url: str, tmp_path, session_id: str, worker: str,
                          texts: tuple[str, str]) -> tuple[str, str]:
    """Both messages answered by an ``agentledger worker`` process named ``worker``; the two
    run ids (each checked ``run.completed``, with the worker's log on failure)."""
    ids = []
    with ProcessManager(tmp_path) as procs:
        procs.worker(db_url, worker, PYTHONPATH=WORKER_PYTHONPATH)
        for text in texts:
            run_id, end = ask(db, session_id, text, timeout=60)
            assert end.type == "run.completed", (end, procs.logs())
            ids.append(run_id)
    return ids[0], ids[1]
