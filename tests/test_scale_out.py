"""The documented scale-out deployment on PostgreSQL: 2 ``serve`` processes (gunicorn, 2 HTTP
workers each, no executor) + 3 ``worker`` processes, all on one database.

Runs posted through either server are executed by all three workers, each exactly once; a
stream opened on one server sees the events written by workers through the other processes
(LISTEN/NOTIFY), and ends with the run.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import requests
from support.processes import (
    Api,
    ProcessManager,
    assert_one_terminal_event,
    make_token,
    run,
    types,
    wait_terminal,
)

FAST = {"AGENTLEDGER_LEASE_SECONDS": "5", "AGENTLEDGER_HEARTBEAT_SECONDS": "1",
        "AGENTLEDGER_RECONCILE_SECONDS": "1", "AGENTLEDGER_RUN_RATE_LIMIT": "0"}


@pytest.fixture
def cluster(pg_url, pg_db, tmp_path):
    with ProcessManager(tmp_path) as procs:
        servers = [procs.serve(pg_url, name=f"serve-{n}", args=("--workers", "2"), **FAST)
                   for n in (1, 2)]
        workers = [procs.start(name, ["worker", "--instance-id", name, "--concurrency", "2"],
                               procs.environment(pg_url, **FAST))
                   for name in ("w1", "w2", "w3")]
        for proc in workers:
            proc.wait_for_log(rf"worker {re.escape(proc.name)} executing")
        token = make_token(pg_url)
        apis = [Api(s.base_url, token) for s in servers]
        yield apis, pg_db, procs
        for api in apis:
            api.close()


def _stream_types(base_url: str, token: str, run_id: str) -> list[str]:
    seen = []
    with requests.get(f"{base_url}/api/agent-runs/{run_id}/events", stream=True, timeout=30,
                      headers={"Authorization": f"Bearer {token}",
                               "Accept": "text/event-stream"}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith(b"data: "):
                seen.append(json.loads(line[6:])["type"])
    return seen


def test_two_servers_and_three_workers_share_one_database(cluster):
    apis, db, procs = cluster
    apis[0].register_agent("stepper", params={"steps": [
        {"say": "working on {input}. "}, {"sleep": 0.3}, {"say": "done."}]})
    sessions = [api.new_session("stepper") for api in apis for _ in range(3)]
    run_ids = []
    for i in range(4):
        for n, session in enumerate(sessions):
            run_ids.append(apis[n % 2].send(session, f"job {i}-{n}"))
    token = apis[0].http.headers["Authorization"].split()[1]
    # a stream on server 2 follows a run whose events are written by worker processes
    watched = _stream_types(apis[1].base_url, token, run_ids[0])
    assert watched[0] == "run.queued" and watched[-1] == "run.completed"

    statuses = wait_terminal(db, run_ids, timeout=60)
    assert set(statuses.values()) == {"succeeded"}, procs.logs()
    holders = Counter(run(db, r).executor_instance_id for r in run_ids)
    assert set(holders) == {"w1", "w2", "w3"}, holders
    for run_id in run_ids:
        assert types(db, run_id).count("run.started") == 1
        assert assert_one_terminal_event(db, run_id).type == "run.completed"
    # per-thread FIFO held across processes: within a session, runs never overlapped
    by_session: dict[str, list] = {}
    for run_id in run_ids:
        row = run(db, run_id)
        by_session.setdefault(row.session_id, []).append(row)
    for rows in by_session.values():
        rows.sort(key=lambda r: r.started_at)
        for earlier, later in zip(rows, rows[1:], strict=False):
            assert later.started_at >= earlier.finished_at
