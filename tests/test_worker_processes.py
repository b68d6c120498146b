"""Real processes: ``agentledger serve`` (with and without its in-process worker),
``agentledger worker`` and ``agentledger reconcile``, talking to one database.

A worker a test kills leases for 3 s (heartbeat 1 s) so that its death shows up quickly; every
other process leases for 15 s, longer than a slow, busy machine stalls a process, so a run that
must succeed or end otherwise never ends ``lease_expired`` by accident. Reconcilers pass every
second. Every process runs in its own process group and is killed with its group at teardown.
"""

from __future__ import annotations

import re
import signal
import socket
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from support import history as h
from support.factories import claim, make_agent, make_session, post
from support.processes import (
    TERMINAL,
    Api,
    ProcessManager,
    assert_one_terminal_event,
    events,
    free_port,
    make_token,
    run,
    status,
    statuses,
    types,
    wait_terminal,
    wait_until,
)
from support.rollup import assert_rollup_matches_scan

from ingest.events import append_events
from ingest.runs import create_child_run
from queries.chain_verification import verify_chains

LEASE, HEARTBEAT, RECONCILE = 3, 1, 1
FAST = {"AGENTLEDGER_LEASE_SECONDS": str(LEASE), "AGENTLEDGER_HEARTBEAT_SECONDS": str(HEARTBEAT),
        "AGENTLEDGER_RECONCILE_SECONDS": str(RECONCILE)}
SAFE_LEASE = 15  # as in tests/test_remote_worker.py
SAFE = {**FAST, "AGENTLEDGER_LEASE_SECONDS": str(SAFE_LEASE)}
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def api_for():
    clients = []

    def make(server, db_url) -> Api:
        client = Api(server.base_url, make_token(db_url))
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def start_cluster(procs: ProcessManager, db_url: str, workers: list[str], *, concurrency: int,
                  killed: tuple[str, ...] = ()):
    """A server without a worker (reconciling every second) plus standalone workers: the ones
    named in ``killed`` with the short lease, the others with the safe one."""
    server = procs.serve(db_url, **FAST)
    started = [procs.start(name, ["worker", "--instance-id", name, "--concurrency",
                                  str(concurrency)],
                           procs.environment(db_url, **(FAST if name in killed else SAFE)))
               for name in workers]
    for proc in started:
        proc.wait_for_log(rf"worker {re.escape(proc.name)} executing")
    return server, started


def sleeper_steps(seconds: float) -> dict:
    return {"steps": [{"say": "on it "}, {"sleep": seconds}, {"say": "done"}]}


def all_running(db, run_ids) -> bool:
    found = statuses(db, run_ids)
    return len(found) == len(run_ids) and all(v == "running" for v in found.values())


def assert_chains_ok(db) -> None:
    with db.read(transaction=True) as s:
        report = verify_chains(s)
    assert report.ok, report.problems


# --------------------------------------------------------------------------------------------
# two workers: load sharing, kill -9, never twice (on SQLite too: a killed process releases
# the database file's locks, and the other worker's reconciler takes over)
# --------------------------------------------------------------------------------------------


def test_two_workers_share_the_load_and_a_killed_workers_runs_end_lease_expired(
        db_url, db, procs, api_for):
    server, (worker_a, worker_b) = start_cluster(procs, db_url, ["worker-a", "worker-b"],
                                                 concurrency=3, killed=("worker-a",))
    api = api_for(server, db_url)
    api.register_agent("sleeper", params=sleeper_steps(6))
    run_ids = [api.send(api.new_session("sleeper"), f"job {i}") for i in range(6)]
    wait_until(lambda: all_running(db, run_ids), timeout=60,
               message=lambda: f"6 running runs: {statuses(db, run_ids)}\n{procs.logs()}")

    holders = {r: run(db, r).executor_instance_id for r in run_ids}
    assert sorted(holders.values()) == ["worker-a"] * 3 + ["worker-b"] * 3  # both took work
    victims = [r for r, h in holders.items() if h == "worker-a"]
    survivors = [r for r, h in holders.items() if h == "worker-b"]
    wait_until(lambda: all("message.delta" in types(db, r) for r in run_ids), timeout=60)

    worker_a.kill_group(signal.SIGKILL)
    killed = time.monotonic()
    assert worker_a.wait(5) == -signal.SIGKILL
    # the dead worker's leases as it left them: nobody renews them any more
    leases = {r: run(db, r).lease_expires_at for r in victims}
    wait_terminal(db, victims, timeout=60)
    elapsed = time.monotonic() - killed
    print(f"killed worker's runs ended {elapsed:.2f}s after SIGKILL "
          f"(lease {LEASE}s, reconcile every {RECONCILE}s)")
    for run_id in victims:
        terminal = assert_one_terminal_event(db, run_id)
        assert terminal.data["reason"] == "lease_expired"
        assert terminal.data["executor_instance_id"] == "worker-a"
        # nobody wrote for the dead worker until its lease was over (the ledger's own clock)
        assert terminal.created_at > leases[run_id], (terminal, leases[run_id])

    wait_terminal(db, survivors, timeout=60)
    for run_id in run_ids:
        kinds = types(db, run_id)
        assert kinds.count("run.started") == 1, kinds  # never started twice
        assert "run.failed" not in kinds
        assert_one_terminal_event(db, run_id)
    assert {status(db, r) for r in survivors} == {"succeeded"}
    assert {run(db, r).executor_instance_id for r in run_ids} == {"worker-a", "worker-b"}
    # the API tells the same story
    page = api.events(victims[0])
    assert page["terminal"] is True and page["status"] == "interrupted"
    assert page["events"][-1]["data"]["reason"] == "lease_expired"
    assert worker_b.alive()
    assert_chains_ok(db)


def test_worker_refuses_a_concurrency_below_one(db_url, procs):
    done = procs.run(["worker", "--concurrency", "0"], procs.environment(db_url))
    assert done.returncode != 0
    assert "argument --concurrency: must be at least 1, got 0" in done.stderr


def test_per_thread_fifo_holds_across_worker_processes(db_url, db, procs, api_for):
    server, _ = start_cluster(procs, db_url, ["worker-a", "worker-b"], concurrency=2)
    api = api_for(server, db_url)
    api.register_agent("slow", params={"steps": [{"say": "{input}"}, {"sleep": 0.6}]})
    session_id = api.new_session("slow")
    run_ids = [api.send(session_id, f"m{i}") for i in range(3)]
    wait_terminal(db, run_ids, timeout=60)
    rows = [run(db, r) for r in run_ids]
    assert [r.status for r in rows] == ["succeeded"] * 3
    for earlier, later in zip(rows, rows[1:], strict=False):
        assert later.started_at >= earlier.finished_at
    messages = api.get(f"/api/sessions/{session_id}/messages")["items"]
    answers = [m for m in messages if m["role"] == "assistant"]
    assert [(a["content"], a["run_id"]) for a in answers] == list(zip(["m0", "m1", "m2"], run_ids,
                                                                      strict=True))


# --------------------------------------------------------------------------------------------
# SIGTERM
# --------------------------------------------------------------------------------------------


def test_sigterm_interrupts_the_workers_runs_with_executor_shutdown_and_exits_zero(
        db_url, db, procs, api_for):
    server, (worker,) = start_cluster(procs, db_url, ["worker-t"], concurrency=2)
    api = api_for(server, db_url)
    api.register_agent("sleeper", params=sleeper_steps(30))
    run_ids = [api.send(api.new_session("sleeper"), "x") for _ in range(2)]
    queued_later = api.send(api.new_session("sleeper"), "waits for a slot")
    wait_until(lambda: all_running(db, run_ids), timeout=60)

    worker.send(signal.SIGTERM)
    signalled = time.monotonic()
    wait_terminal(db, run_ids, timeout=60)
    print(f"SIGTERM ended the worker's runs after {time.monotonic() - signalled:.2f}s")
    assert worker.wait(10) == 0
    for run_id in run_ids:
        terminal = assert_one_terminal_event(db, run_id)
        assert terminal.data == {"reason": "executor_shutdown", "executor_instance_id": "worker-t"}
    assert status(db, queued_later) == "queued"  # never claimed by the stopping worker
    assert "stopped; 2 run(s) interrupted (executor_shutdown)" in worker.log()


# --------------------------------------------------------------------------------------------
# cancel of a delegation tree through the API, with workers running
# --------------------------------------------------------------------------------------------


def test_cancel_of_a_delegation_tree_through_the_api(db_url, db, procs, api_for):
    server, _ = start_cluster(procs, db_url, ["worker-a", "worker-b"], concurrency=2)
    api = api_for(server, db_url)
    api.register_agent("leaf", params=sleeper_steps(30))
    api.register_agent("middle", params={"steps": [
        {"delegate": [{"agent_id": "leaf"}, {"agent_id": "leaf"}]}]})
    api.register_agent("top", params={"steps": [
        {"say": "planning "}, {"delegate": [{"agent_id": "middle"}, {"agent_id": "leaf"}]}]})
    root = api.send(api.new_session("top"), "a big question")

    def running_tree():
        nodes = api.tree(root)["nodes"]
        return len(nodes) == 5 and all(n["status"] == "running" for n in nodes) and nodes

    nodes = wait_until(running_tree, timeout=60,
                       message=lambda: f"a running tree of 5: {api.tree(root)}\n{procs.logs()}")
    assert nodes[0]["run_id"] == root and nodes[0]["parent_run_id"] is None
    cancel = api.post(f"/api/agent-runs/{root}/cancel", expect=202).json()
    assert cancel == {"run_id": root, "status": "cancelling"}
    asked = time.monotonic()

    def all_ended():
        found = api.tree(root)["nodes"]
        return all(n["status"] in TERMINAL for n in found) and found

    ended = wait_until(all_ended, timeout=60, interval=0.1)
    print(f"tree cancelled after {time.monotonic() - asked:.2f}s")
    assert {n["status"] for n in ended} == {"cancelled"}
    for node in ended:
        page = api.events(node["run_id"])
        assert page["terminal"] is True
        kinds = [e["type"] for e in page["events"]]
        assert kinds.count("run.cancelled") == 1 and kinds[-1] == "run.cancelled"
        assert sum(k in ("run.completed", "run.failed", "run.interrupted") for k in kinds) == 0
        assert page["events"][-1]["data"]["external_stop_confirmed"] is True
        assert [e["seq"] for e in page["events"]] == list(range(1, len(kinds) + 1))
        assert_one_terminal_event(db, node["run_id"])
    # both workers took part, and a second cancel is refused: the tree has ended
    assert {run(db, n["run_id"]).executor_instance_id for n in ended} == {"worker-a", "worker-b"}
    response = api.post(f"/api/agent-runs/{root}/cancel", expect=409)
    assert response.json()["error"]["code"] == "run_terminal"
    assert_chains_ok(db)


# --------------------------------------------------------------------------------------------
# restart of an embedded server (serve WITH its worker) while a run is running
# --------------------------------------------------------------------------------------------


def test_restarted_embedded_server_interrupts_its_leftovers_with_service_restart(
        db_url, db, procs, api_for):
    port = free_port()
    env = {"AGENTLEDGER_LEASE_SECONDS": "60", "AGENTLEDGER_HEARTBEAT_SECONDS": "1",
           "AGENTLEDGER_RECONCILE_SECONDS": "1"}
    first = procs.serve(db_url, port=port, worker=True, name="serve-first", **env)
    api = api_for(first, db_url)
    api.register_agent("leaf", params=sleeper_steps(30))
    api.register_agent("boss", params={"steps": [{"say": "asking "},
                                                 {"delegate": [{"agent_id": "leaf"}]}]})
    root = api.send(api.new_session("boss"), "x")
    wait_until(lambda: len(nodes := api.tree(root)["nodes"]) == 2
               and all(n["status"] == "running" for n in nodes), timeout=15)
    tree_ids = [n["run_id"] for n in api.tree(root)["nodes"]]
    instance = run(db, root).executor_instance_id
    assert instance == f"serve-{socket.gethostname()}-{port}-0"
    assert {run(db, r).executor_instance_id for r in tree_ids} == {instance}

    first.kill_group(signal.SIGKILL)  # a crash: master and workers, no goodbye
    first.wait(5)
    time.sleep(0.3)
    assert set(statuses(db, tree_ids).values()) == {"running"}  # the lease is still valid

    second = procs.serve(db_url, port=port, worker=True, name="serve-second", **env)
    ended = wait_terminal(db, tree_ids, timeout=60)
    assert set(ended.values()) == {"interrupted"}
    for run_id in tree_ids:
        terminal = assert_one_terminal_event(db, run_id)
        assert terminal.data == {"reason": "service_restart", "executor_instance_id": instance}
        assert types(db, run_id).count("run.started") == 1
    assert "left by a previous start (service_restart)" in second.log()

    # the tree stays readable through the API of the new incarnation
    api2 = api_for(second, db_url)
    tree = api2.tree(tree_ids[1])
    assert tree["root_run_id"] == root
    assert [(n["run_id"], n["status"]) for n in tree["nodes"]] == [(r, "interrupted")
                                                                   for r in tree_ids]
    for run_id in tree_ids:
        page = api2.events(run_id)
        assert page["terminal"] is True and page["events"][-1]["type"] == "run.interrupted"
    detail = api2.get(f"/api/agent-runs/{root}")
    assert detail["status"] == "interrupted" and detail["finished_at"]

    # and the new incarnation executes new work
    api2.register_agent("echo", kind="echo")
    fresh = api2.send(api2.new_session("echo"), "alive again")
    assert wait_terminal(db, fresh, timeout=60) == {fresh: "succeeded"}
    assert run(db, fresh).executor_instance_id == instance
    assert_chains_ok(db)


def test_sigterm_to_an_embedded_server_interrupts_its_runs_with_executor_shutdown(
        db_url, db, procs, api_for):
    server = procs.serve(db_url, worker=True, **SAFE)
    api = api_for(server, db_url)
    api.register_agent("sleeper", params=sleeper_steps(30))
    run_id = api.send(api.new_session("sleeper"), "x")
    wait_until(lambda: all_running(db, [run_id]), timeout=60)
    server.send(signal.SIGTERM)  # gunicorn master: graceful stop of its workers
    assert server.wait(20) == 0
    terminal = assert_one_terminal_event(db, run_id)
    assert terminal.data["reason"] == "executor_shutdown"
    assert terminal.data["executor_instance_id"] == f"serve-{socket.gethostname()}-{server.port}-0"


# --------------------------------------------------------------------------------------------
# agentledger reconcile, embedded app.py
# --------------------------------------------------------------------------------------------


def test_reconcile_once_interrupts_expired_leases_and_orphans(db_url, db, procs):
    make_agent(db, "echo")
    expired = post(db, make_session(db), "x").run_id
    claim(db, "gone-worker", lease_seconds=1)
    parent = post(db, make_session(db), "y").run_id
    claim(db, "live-worker", lease_seconds=60)
    with db.write() as s:
        orphan = create_child_run(s, parent, agent_id="echo", input="z",
                                  executor_instance_id="live-worker")
    with db.write() as s:
        append_events(s, parent, [("run.failed", {"error": {"code": "x", "message": "y"}})],
                      executor_instance_id="live-worker")
    time.sleep(1.2)
    done = procs.run(["reconcile", "--once"], procs.environment(db_url))
    assert done.returncode == 0, done.stderr
    assert "interrupted 1 run(s) with expired leases, 1 orphaned child run(s)" in done.stdout
    assert assert_one_terminal_event(db, expired).data["reason"] == "lease_expired"
    assert assert_one_terminal_event(db, orphan).data["reason"] == "parent_terminal"
    assert types(db, orphan) == ["run.queued", "run.interrupted"]  # never started


def test_reconcile_once_prunes_old_minutes_and_folds_the_rollup_shards_of_past_hours(
        db_url, db, procs):
    from sqlalchemy import func, select

    from agentledger.core.rollup_periods import minutes_kept_from
    from agentledger.core.schema import (
        AgentOutcomeRollup,
        AgentOutcomeRollupHour,
        AgentOutcomeRollupMinute,
    )

    def count(models, where) -> int:
        with db.read() as s:
            return sum(s.execute(select(func.count()).select_from(m).where(*where(m)))
                       .scalar_one() for m in models)

    def unfolded() -> int:
        return count((AgentOutcomeRollup, AgentOutcomeRollupHour, AgentOutcomeRollupMinute),
                     lambda m: (m.shard != 0,))

    h.agent(db, "alpha")
    chat = h.chat(db, owner="alice", agent_id="alpha")
    for n in range(30):  # a month ago: days and hours that are over, minutes no longer kept
        h.answered(db, chat, "q", "a", owner="alice", when=h.at_seconds(n * 200))
    recent = datetime.now(UTC) - timedelta(hours=40)  # a day that is over
    for n in range(5):  # minutes kept
        h.answered(db, chat, "q", "a", owner="alice", when=recent + timedelta(seconds=n * 20))
    minute = AgentOutcomeRollupMinute
    old_minutes = count((minute,), lambda m: (m.minute < recent - timedelta(days=1),))
    old_shard_minutes = count((minute,), lambda m: (m.minute < recent - timedelta(days=1),
                                                     m.shard != 0))
    kept_minutes = {r.minute for r in _rows(db, minute) if r.minute >= recent - timedelta(minutes=1)}
    shard_rows = unfolded()
    assert shard_rows > old_shard_minutes > 0 and old_minutes > 0 and kept_minutes
    done = procs.run(["reconcile", "--once"], procs.environment(db_url))
    assert done.returncode == 0, done.stderr
    assert f"deleted {old_minutes} minute rollup row(s) older than the minutes kept" in done.stdout
    assert f"folded {shard_rows - old_shard_minutes} outcome rollup shard row(s)" in done.stdout
    assert unfolded() == 0
    assert {r.minute for r in _rows(db, minute)} == kept_minutes  # one folded row each
    assert assert_rollup_matches_scan(
        db, minutes_from=minutes_kept_from(datetime.now(UTC))) == 35
    again = procs.run(["reconcile", "--once"], procs.environment(db_url))
    assert "interrupted 0 run(s) with expired leases, 0 orphaned" in again.stdout  # idempotent
    assert "deleted 0 minute rollup row(s)" in again.stdout


def _rows(db, model) -> list:
    from sqlalchemy import select

    with db.read() as s:
        return list(s.execute(select(model.__table__)))


def test_reconcile_loop_stops_on_sigterm(db_url, db, procs):
    loop = procs.start("reconcile", ["reconcile"], procs.environment(db_url, **FAST))
    loop.wait_for_log(r"reconciling every 1s")
    make_agent(db, "echo")
    expired = post(db, make_session(db), "x").run_id
    claim(db, "gone-worker", lease_seconds=1)
    wait_terminal(db, expired, timeout=60 + 2 * RECONCILE + 3)
    assert events(db, expired)[-1].data["reason"] == "lease_expired"
    loop.send(signal.SIGTERM)
    assert loop.wait(5) == 0


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.slow
def test_app_py_embedded_mode_on_a_fresh_directory(tmp_path, procs):
    if not _port_free(8050):
        pytest.skip("port 8050 is in use on this machine")
    env = {k: v for k, v in procs.environment("unused").items() if not k.startswith("AGENTLEDGER_")}
    env.update(SAFE)  # no database URL: the default SQLite file in the working directory
    handle = procs.start("app.py", [], env, argv=[sys.executable, str(REPO / "app.py")])
    handle.base_url = "http://127.0.0.1:8050"
    procs.wait_http(handle, timeout=90)

    printed = handle.log()
    assert "http://127.0.0.1:8050" in printed
    token = re.search(r"http://127\.0\.0\.1:8050/login\?token=(\S+)", printed).group(1)
    assert (tmp_path / "agentledger.db").exists()  # SQLite file in the working directory
    api = Api(handle.base_url, token)
    try:
        assert api.get("/api/health") == {"status": "ok", "database": "sqlite"}
        assert len(api.get("/api/agents")["items"]) >= 4  # demo data was seeded
        assert api.get("/api/agent-runs?status=interrupted&limit=5")["items"]
        # the login link logs a browser in
        browser = requests.Session()
        browser.get(f"{handle.base_url}/login?token={token}", timeout=10)
        assert browser.cookies.get("agentledger_session")
        browser.close()
        # the in-process worker executes new work
        api.register_agent("echo-now", kind="echo")
        run_id = api.send(api.new_session("echo-now"), "embedded works")

        def finished():
            detail = api.get(f"/api/agent-runs/{run_id}")
            return detail["status"] in TERMINAL and detail

        detail = wait_until(finished, timeout=60)
        assert detail["status"] == "succeeded"
        assert detail["executor_instance_id"].endswith("-8050-0")
    finally:
        api.close()
