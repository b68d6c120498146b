"""The in-process executor (``agentledger.worker.executor.Executor``) against real SQLite and
PostgreSQL databases: claiming, per-thread FIFO, slots, delegation, cancel, leases and
heartbeats, shutdown and restart.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import select
from support.factories import claim, make_agent, make_session, post
from support.processes import (
    TERMINAL,
    ExecutorPool,
    assert_one_terminal_event,
    events,
    message_content,
    run,
    runs,
    status,
    statuses,
    types,
    wait_for_status,
    wait_terminal,
    wait_until,
)

from agentledger.agent_kinds import AgentFailed, available_kinds
from agentledger.app_factory import create_app
from agentledger.core import dialect
from agentledger.core.config import MAX_CLAIM, Settings
from agentledger.core.database import Database
from agentledger.core.schema import Message
from agentledger.worker import executor as executor_module
from agentledger.worker.executor import Executor
from agentledger.worker.reconciler_loop import reconcile_once
from ingest.cancel import request_cancel
from ingest.reconcile import interrupt_executor_runs
from ingest.tokens import create_token


@pytest.fixture
def executors(db):
    with ExecutorPool(db) as pool:
        yield pool


def sleeper(db, agent_id: str = "sleeper", seconds: float = 30, *, say: str = "working ") -> str:
    return make_agent(db, agent_id, kind="scripted",
                      params={"steps": [{"say": say}, {"sleep": seconds}, {"say": "done"}]})


def delegator(db, agent_id: str, children: list[str], *, after: str = "done") -> str:
    return make_agent(db, agent_id, kind="scripted", params={"steps": [
        {"say": f"{agent_id} delegating. "},
        {"delegate": [{"agent_id": c, "input": f"{c} for {{input}}"} for c in children]},
        {"say": after},
    ]})


def tree_of(db, root_id: str) -> list:
    return runs(db, root_run_id=root_id)


def max_overlap(intervals) -> int:
    """Most intervals open at one instant; an interval ending when another starts doesn't count."""
    points = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
                    key=lambda p: (p[0], p[1]))
    best = current = 0
    for _, delta in points:
        current += delta
        best = max(best, current)
    return best


# --------------------------------------------------------------------------------------------
# claiming, FIFO, slots
# --------------------------------------------------------------------------------------------


def test_claims_every_queued_run_and_starts_each_once(db, executors):
    make_agent(db, "echo")
    posted = [post(db, make_session(db), f"message {i}") for i in range(6)]
    executor = executors.start("exec-a", concurrency=3)
    wait_terminal(db, [p.run_id for p in posted])
    for i, p in enumerate(posted):
        row = run(db, p.run_id)
        assert row.status == "succeeded"
        assert row.executor_instance_id == "exec-a"
        assert message_content(db, row.final_message_id) == f"message {i}"
        started = [e for e in events(db, p.run_id) if e.type == "run.started"]
        assert len(started) == 1
        assert started[0].data["executor_instance_id"] == "exec-a"
        assert_one_terminal_event(db, p.run_id)
    assert executor.started_runs == 6
    assert executor.active_run_ids == []


def test_runs_of_one_thread_run_one_after_another_in_order(db, executors):
    make_agent(db, "slow", kind="scripted",
               params={"steps": [{"say": "{input}"}, {"sleep": 0.4}]})
    session_id = make_session(db, agent_id="slow")
    posted = [post(db, session_id, f"m{i}") for i in range(3)]
    other = post(db, make_session(db, agent_id="slow"), "elsewhere")
    # two executors with free slots compete for the same thread: FIFO must still hold
    executors.start("exec-a", concurrency=3)
    executors.start("exec-b", concurrency=3)
    wait_terminal(db, [p.run_id for p in posted] + [other.run_id], timeout=60)
    rows = [run(db, p.run_id) for p in posted]
    assert [r.status for r in rows] == ["succeeded"] * 3
    for earlier, later in zip(rows, rows[1:], strict=False):
        assert later.started_at >= earlier.finished_at, (earlier, later)
    # another session's run is not held back by this thread's queue
    assert run(db, other.run_id).started_at < rows[1].started_at
    with db.read() as s:
        answers = s.execute(select(Message.content, Message.run_id).where(
            Message.session_id == session_id, Message.role == "assistant")
            .order_by(Message.created_at, Message.id)).all()
    assert [a.content for a in answers] == ["m0", "m1", "m2"]


def test_concurrency_bounds_the_runs_executing_at_once(db, executors):
    make_agent(db, "slow", kind="scripted", params={"steps": [{"sleep": 0.5}]})
    posted = [post(db, make_session(db, agent_id="slow"), "x") for i in range(5)]
    ids = [p.run_id for p in posted]
    executors.start("exec-a", concurrency=2)
    most_running = 0
    deadline = time.monotonic() + 60  # only stops a hang; the loop ends when all runs ended
    while time.monotonic() < deadline:
        now = statuses(db, ids)
        most_running = max(most_running, sum(v == "running" for v in now.values()))
        if all(v in TERMINAL for v in now.values()):
            break
        time.sleep(0.05)
    assert most_running == 2
    rows = [run(db, i) for i in ids]
    assert all(r.status == "succeeded" for r in rows)
    assert max_overlap([(r.started_at, r.finished_at) for r in rows]) == 2


def test_concurrency_above_one_claims_maximum_claims_in_several_requests(db, executors):
    # A claim takes at most MAX_CLAIM runs; an executor with more slots asks for them in turns
    # instead of having every claim refused.
    make_agent(db, "echo")
    posted = [post(db, make_session(db), f"q{i}").run_id for i in range(MAX_CLAIM + 5)]
    executor = executors.start("wide", concurrency=MAX_CLAIM + 20)
    wait_terminal(db, posted, timeout=120)
    assert set(statuses(db, posted).values()) == {"succeeded"}
    assert executor.refusal is None


def test_concurrency_must_be_positive(db):
    with pytest.raises(ValueError):
        Executor(db, Settings(database_url=db.url), instance_id="x", concurrency=0)


# --------------------------------------------------------------------------------------------
# delegation
# --------------------------------------------------------------------------------------------


def test_delegation_works_with_a_single_slot(db, executors):
    make_agent(db, "echo")
    sleeper(db, "nap", 0.2, say="napped ")
    delegator(db, "boss", ["echo", "nap"])
    posted = post(db, make_session(db, agent_id="boss"), "the task")
    executors.start("solo", concurrency=1)
    wait_for_status(db, posted.run_id, "succeeded", timeout=60)
    nodes = tree_of(db, posted.run_id)
    assert len(nodes) == 3
    assert all(n.status == "succeeded" for n in nodes)
    assert all(n.executor_instance_id == "solo" for n in nodes)
    parent = run(db, posted.run_id)
    assert message_content(db, parent.final_message_id) == "boss delegating. done"
    kinds = types(db, posted.run_id)
    assert kinds.count("run.child_created") == 2 and kinds.count("run.child_finished") == 2


def test_a_slot_freed_by_a_delegating_parent_is_given_back_to_it(db, executors):
    """With one slot, two delegating roots and their children all finish (no deadlock)."""
    make_agent(db, "echo")
    delegator(db, "boss", ["echo", "echo"])
    posted = [post(db, make_session(db, agent_id="boss"), f"t{i}") for i in range(2)]
    executors.start("solo", concurrency=1)
    wait_terminal(db, [p.run_id for p in posted], timeout=60)
    for p in posted:
        nodes = tree_of(db, p.run_id)
        assert len(nodes) == 3 and {n.status for n in nodes} == {"succeeded"}


def test_delegation_tree_of_depth_three(db, executors):
    make_agent(db, "leaf", kind="scripted", params={"steps": [{"say": "leaf:{input}"}]})
    delegator(db, "middle", ["leaf", "leaf"])
    delegator(db, "top", ["middle", "leaf"])
    posted = post(db, make_session(db, agent_id="top"), "q")
    executors.start("exec-a", concurrency=2)
    wait_for_status(db, posted.run_id, "succeeded", timeout=60)

    nodes = {n.id: n for n in tree_of(db, posted.run_id)}
    assert len(nodes) == 5
    assert {n.status for n in nodes.values()} == {"succeeded"}

    def depth(node):
        return 1 if node.parent_run_id is None else 1 + depth(nodes[node.parent_run_id])

    assert max(depth(n) for n in nodes.values()) == 3
    assert {n.root_run_id for n in nodes.values()} == {posted.run_id}
    assert len({n.thread_id for n in nodes.values()}) == 5
    middle = next(n for n in nodes.values() if n.agent_id == "middle")
    assert middle.session_id is None and middle.parent_run_id == posted.run_id
    grandchildren = [n for n in nodes.values() if n.parent_run_id == middle.id]
    assert [g.input for g in grandchildren] == ["leaf for middle for q"] * 2
    for node in nodes.values():
        assert_one_terminal_event(db, node.id)
        # a parent ends only after all its children ended
        for child in (c for c in nodes.values() if c.parent_run_id == node.id):
            assert child.finished_at <= node.finished_at

    # the tree API returns parents before children
    app = create_app(Settings(database_url=db.url, secret_key="t"), database=db, dashboards=False)
    with db.write() as s:
        _, token = create_token(s, owner_id="viewer", role="viewer")
    tree = app.test_client().get(f"/api/agent-runs/{grandchildren[0].id}/tree",
                                 headers={"Authorization": f"Bearer {token}"}).get_json()
    app.extensions["agentledger"].close()
    assert tree["root_run_id"] == posted.run_id
    order = [n["run_id"] for n in tree["nodes"]]
    assert sorted(order) == sorted(nodes)
    for node in tree["nodes"]:
        if node["parent_run_id"]:
            assert order.index(node["parent_run_id"]) < order.index(node["run_id"])


def test_a_failed_child_is_reported_to_its_waiting_parent(db, executors):
    make_agent(db, "broken", kind="scripted", params={"steps": [{"fail": "nope"}]})
    make_agent(db, "echo")
    delegator(db, "boss", ["broken", "echo"])
    posted = post(db, make_session(db, agent_id="boss"), "x")
    executors.start(concurrency=2)
    wait_terminal(db, posted.run_id)
    finished = {e.data["child_run_id"]: e.data["status"]
                for e in events(db, posted.run_id) if e.type == "run.child_finished"}
    by_agent = {run(db, c).agent_id: s for c, s in finished.items()}
    assert by_agent == {"broken": "failed", "echo": "succeeded"}
    # the scripted kind goes on after its delegate step whatever the children did
    assert status(db, posted.run_id) == "succeeded"


# --------------------------------------------------------------------------------------------
# cancel
# --------------------------------------------------------------------------------------------


def test_cancel_stops_a_script_between_steps_and_is_confirmed_exactly_once(db, executors):
    steps = 4000  # 200 s of script: a cancel that waited for its end would hit the deadline
    # a script that keeps emitting: the cancel must stop it between steps
    make_agent(db, "chatty", kind="scripted",
               params={"steps": [{"say": "."}, {"sleep": 0.05}] * steps})
    posted = post(db, make_session(db, agent_id="chatty"), "x")
    executors.start()
    wait_until(lambda: types(db, posted.run_id).count("message.delta") >= 3, timeout=60)
    asked = time.monotonic()
    with db.write() as s:
        request_cancel(s, posted.run_id, requested_by="alice")
    wait_for_status(db, posted.run_id, "cancelled", timeout=60)
    print(f"cancel noticed after {time.monotonic() - asked:.2f}s")
    evs = events(db, posted.run_id)
    kinds = [e.type for e in evs]
    assert kinds.count("message.delta") < steps, "the script was stopped between its steps"
    assert kinds.count("run.cancelling") == 1
    assert kinds.count("run.cancelled") == 1
    assert kinds[-1] == "run.cancelled"
    assert evs[-1].data["external_stop_confirmed"] is True
    assert "run.completed" not in kinds and "run.failed" not in kinds
    # After the cancel request only progress the script made before the executor learned of it
    # may land (the answer to the append that carried it says cancel_requested), then the
    # confirmation. Usually none or one delta; under a starved machine's stalls the executor
    # learns later, but never a second of script (20 steps) later.
    after = kinds[kinds.index("run.cancelling") + 1:]
    assert set(after) <= {"message.delta", "run.cancelled"} and len(after) <= 20, after
    assert run(db, posted.run_id).final_message_id is None
    # nothing more is ever written
    time.sleep(0.5)
    assert len(events(db, posted.run_id)) == len(evs)


def _cancel_a_sleeping_run(db, executors, monkeypatch, cancelling_db) -> float:
    """Seconds from a cancel request (written through ``cancelling_db``) of a run sleeping in
    its agent until the run is ``cancelled``, with the executor's monitor looking at its runs
    only every 30 s: only the cancel's notification can stop the agent sooner."""
    monkeypatch.setattr(executor_module, "MONITOR_PERIOD", 30.0)
    sleeper(db, seconds=600)
    posted = post(db, make_session(db, agent_id="sleeper"), "x")
    executors.start()
    wait_until(lambda: "message.delta" in types(db, posted.run_id), timeout=30)
    asked = time.monotonic()
    with cancelling_db.write() as s:
        request_cancel(s, posted.run_id, requested_by="alice")
    wait_for_status(db, posted.run_id, "cancelled", timeout=25)
    assert types(db, posted.run_id)[-2:] == ["run.cancelling", "run.cancelled"]
    return time.monotonic() - asked


def test_a_cancel_request_stops_the_agent_at_once_not_at_the_monitors_next_look(
        db, executors, monkeypatch):
    """A cancel written in the executor's own process reaches it straight after its commit."""
    assert _cancel_a_sleeping_run(db, executors, monkeypatch, db) < 5


def test_a_cancel_request_from_another_process_reaches_the_executor_through_notify(
        pg_db, monkeypatch):
    """On PostgreSQL a cancel committed by another process's connections (here: another pool,
    whose NOTIFY this process does not take for its own) reaches the executor through
    ``LISTEN``."""
    other = Database(pg_db.url)
    try:
        with ExecutorPool(pg_db) as executors:
            assert _cancel_a_sleeping_run(pg_db, executors, monkeypatch, other) < 5
    finally:
        other.dispose()


@pytest.fixture
def test_kind(monkeypatch):
    """Register an in-process agent kind for one test (as a plug-in would)."""
    available_kinds.cache_clear()

    def register(name, fn):
        monkeypatch.setitem(available_kinds(), name, fn)

    yield register
    available_kinds.cache_clear()


def run_with_kind(db, executors, test_kind, name: str, fn) -> str:
    """One run of a test-only agent kind ``fn`` to its end; its run id."""
    test_kind(name, fn)
    make_agent(db, name, kind=name)
    posted = post(db, make_session(db, agent_id=name), "x")
    executors.start()
    wait_terminal(db, posted.run_id)
    return posted.run_id


@pytest.mark.parametrize("ending", ["answer", "failure"])
def test_a_cancel_that_arrives_while_the_agent_finishes_wins(db, executors, test_kind, ending,
                                                             monkeypatch):
    # The delta waits for the run's end whatever the machine's load: the cancel request (a
    # transaction of its own) cannot lose a race with the 20 ms flusher on a busy machine.
    monkeypatch.setattr(executor_module, "APPEND_DELAY", 30.0)

    def finishes_after_cancel(ctx):
        ctx.say("almost there")
        with db.write() as s:  # the user cancels just before the agent returns
            request_cancel(s, ctx.run_id, requested_by="alice")
        if ending == "failure":
            raise AgentFailed("gave up")
        return "the answer"

    run_id = run_with_kind(db, executors, test_kind, "late-cancel", finishes_after_cancel)
    # The delta waited to be written with the run's end: it follows the cancel request that
    # came meanwhile, and the cancel still wins.
    assert types(db, run_id) == ["run.queued", "run.started", "run.cancelling",
                                 "message.delta", "run.cancelled"]
    assert run(db, run_id).final_message_id is None
    assert run(db, run_id).error is None


def test_a_cancel_that_arrives_just_before_a_delegate_step_is_confirmed(db, executors, test_kind):
    # The parent is already cancelling when it tries to delegate: the ledger refuses to create
    # children of a cancelling run, and the executor confirms the cancel (it must not leave the
    # run hanging until its lease expires).
    def cancelled_then_delegates(ctx):
        with db.write() as s:
            request_cancel(s, ctx.run_id, requested_by="alice")
        ctx.delegate([{"agent_id": "echo", "input": "x"}])
        return "never"

    test_kind("cancel-then-delegate", cancelled_then_delegates)
    make_agent(db, "echo")
    make_agent(db, "eager", kind="cancel-then-delegate")
    posted = post(db, make_session(db, agent_id="eager"), "x")
    executors.start()
    wait_for_status(db, posted.run_id, ("cancelled", "interrupted", "failed"), timeout=60)
    assert types(db, posted.run_id) == ["run.queued", "run.started", "run.cancelling",
                                        "run.cancelled"]
    assert runs(db, parent_run_id=posted.run_id) == []


@pytest.mark.slow  # waits for a leaf's 5 s of work
def test_cancel_of_a_middle_node_cancels_only_its_subtree(db, executors):
    sleeper(db, "long-leaf", 30)
    # long enough to be still running once the whole tree is (the middle's children start
    # after it) on a busy machine, short enough not to hold the test up once the middle is
    # cancelled
    sleeper(db, "short-leaf", 5)
    delegator(db, "middle", ["long-leaf", "long-leaf"])
    delegator(db, "top", ["middle", "short-leaf"])
    posted = post(db, make_session(db, agent_id="top"), "q")
    executors.start("exec-a", concurrency=4)
    wait_until(lambda: len(tree_of(db, posted.run_id)) == 5
               and all(n.status == "running" for n in tree_of(db, posted.run_id)), timeout=60,
               message=lambda: f"a running tree of 5: "
                               f"{[(n.agent_id, n.status) for n in tree_of(db, posted.run_id)]}")
    middle = next(n for n in tree_of(db, posted.run_id) if n.agent_id == "middle")
    with db.write() as s:
        assert request_cancel(s, middle.id, requested_by="alice") == "cancelling"
    wait_for_status(db, posted.run_id, "succeeded", timeout=60)
    by_agent = {}
    for node in tree_of(db, posted.run_id):
        by_agent.setdefault(node.agent_id, set()).add(node.status)
        assert_one_terminal_event(db, node.id)
    assert by_agent == {"top": {"succeeded"}, "middle": {"cancelled"},
                        "long-leaf": {"cancelled"}, "short-leaf": {"succeeded"}}
    finished = {e.data["child_run_id"]: e.data["status"]
                for e in events(db, posted.run_id) if e.type == "run.child_finished"}
    assert finished[middle.id] == "cancelled"


def test_cancel_of_a_parent_cancels_its_whole_subtree(db, executors):
    sleeper(db, "leaf", 30)
    delegator(db, "middle", ["leaf"])
    delegator(db, "top", ["middle", "leaf"])
    posted = post(db, make_session(db, agent_id="top"), "q")
    executors.start("exec-a", concurrency=4)
    wait_until(lambda: (nodes := tree_of(db, posted.run_id)) and len(nodes) == 4
               and all(n.status == "running" for n in nodes)
               and all("message.delta" in types(db, n.id) for n in nodes), timeout=15,
               message=lambda: f"a running tree of 4: {[(n.agent_id, n.status) for n in tree_of(db, posted.run_id)]}")
    asked = time.monotonic()
    with db.write() as s:
        assert request_cancel(s, posted.run_id, requested_by="alice") == "cancelling"
    nodes = tree_of(db, posted.run_id)
    wait_terminal(db, [n.id for n in nodes], timeout=60)
    print(f"tree of {len(nodes)} cancelled after {time.monotonic() - asked:.2f}s")
    for node in tree_of(db, posted.run_id):
        assert node.status == "cancelled", node
        terminal = assert_one_terminal_event(db, node.id)
        assert terminal.type == "run.cancelled"
        assert terminal.data["external_stop_confirmed"] is True
        kinds = types(db, node.id)
        assert kinds.count("run.cancelling") == 1
        assert "run.completed" not in kinds and "run.failed" not in kinds
    wait_until(lambda: executors.executors[0].active_run_ids == [], timeout=60)


def test_a_queued_child_of_an_interrupted_parent_is_interrupted_by_the_reconciler(db, executors):
    sleeper(db, "leaf", 30)
    delegator(db, "boss", ["leaf", "leaf"])
    posted = post(db, make_session(db, agent_id="boss"), "x")
    executor = executors.start("solo", concurrency=1)
    # one slot: the parent waits without it, the first child takes it, the second stays queued
    wait_until(lambda: sorted(n.status for n in tree_of(db, posted.run_id))
               == ["queued", "running", "running"], timeout=10)
    ended = executor.stop()
    assert sorted(ended) == sorted(n.id for n in tree_of(db, posted.run_id) if n.status != "queued")
    queued = [n for n in tree_of(db, posted.run_id) if n.status == "queued"]
    assert len(queued) == 1
    assert reconcile_once(db).parent_terminal == 1
    terminal = assert_one_terminal_event(db, queued[0].id)
    assert terminal.data["reason"] == "parent_terminal"
    assert "run.started" not in types(db, queued[0].id)
    assert reconcile_once(db).parent_terminal == 0


# --------------------------------------------------------------------------------------------
# leases, heartbeats, shutdown, restart
# --------------------------------------------------------------------------------------------


def test_a_run_that_cannot_be_interrupted_does_not_hold_up_the_others(db, monkeypatch, caplog):
    """One run whose ending fails with an unexpected error (a bug, a damaged row) is logged and
    passed over: the pass still interrupts every other expired lease behind it."""
    from agentledger.worker import reconciler_loop

    make_agent(db, "echo")
    stuck = post(db, make_session(db), "first").run_id
    claim(db, "gone-1", lease_seconds=1)
    behind = post(db, make_session(db), "second").run_id
    claim(db, "gone-2", lease_seconds=1)
    time.sleep(1.2)
    real = reconciler_loop.interrupt_if_lease_expired

    def failing_for_one(session, run_id):
        if run_id == stuck:
            raise OverflowError("a value the database cannot hold")
        return real(session, run_id)

    monkeypatch.setattr(reconciler_loop, "interrupt_if_lease_expired", failing_for_one)
    assert reconcile_once(db).lease_expired == 1
    assert status(db, behind) == "interrupted" and status(db, stuck) == "running"
    assert f"run {stuck} could not be interrupted" in caplog.text


# A lease longer than a busy machine stalls the executor's monitor (it renews every 0.5–0.75 s),
# and a step three leases long.
ALIVE_LEASE, ALIVE_BEAT = 5, 0.5
ALIVE_STEP = 3 * ALIVE_LEASE


@pytest.mark.slow  # three leases of a sleeping step, on each database
def test_heartbeats_keep_a_long_step_alive(db, executors):
    sleeper(db, "long", ALIVE_STEP)
    posted = post(db, make_session(db, agent_id="long"), "x")
    executors.start("exec-a", lease_seconds=ALIVE_LEASE, heartbeat_seconds=ALIVE_BEAT)
    first_lease = wait_until(lambda: run(db, posted.run_id).lease_expires_at, timeout=60)
    # a reconciler runs the whole time and must find nothing to interrupt
    stop = threading.Event()
    interrupted = []
    late = []  # passes made entirely while the run ran and after its first lease had run out

    def reconcile():
        while not stop.wait(0.3):
            with db.read() as s:
                began = dialect.now(s)
            interrupted.append(reconcile_once(db).lease_expired)
            if began > first_lease and status(db, posted.run_id) == "running":
                late.append(began)

    thread = threading.Thread(target=reconcile)
    thread.start()
    try:
        wait_terminal(db, posted.run_id, timeout=60)
    finally:
        stop.set()
        thread.join()
    assert status(db, posted.run_id) == "succeeded"
    # the reconciler looked while only the renewals kept the run's lease, and found nothing
    assert sum(interrupted) == 0 and late, (interrupted, first_lease)
    row = run(db, posted.run_id)
    # it was renewed: the lease reaches past the step's end, two leases beyond where the
    # claim's ended
    assert row.lease_expires_at > first_lease
    assert row.lease_expires_at > row.started_at + timedelta(seconds=ALIVE_STEP)
    assert "run.interrupted" not in types(db, posted.run_id)


def test_an_expired_lease_ends_the_run_interrupted_and_the_executor_lets_go(db, executors):
    # heartbeats far apart: the one-second lease expires while the agent sleeps
    sleeper(db, "long", 2.5)
    posted = post(db, make_session(db, agent_id="long"), "x")
    executor = executors.start("exec-a", lease_seconds=1, heartbeat_seconds=60)
    wait_for_status(db, posted.run_id, "running")
    wait_until(lambda: reconcile_once(db).lease_expired, timeout=60)
    terminal = assert_one_terminal_event(db, posted.run_id)
    assert terminal.data["reason"] == "lease_expired"
    assert terminal.data["executor_instance_id"] == "exec-a"
    wait_until(lambda: executor.active_run_ids == [], timeout=60)
    time.sleep(0.3)
    # never re-run, never completed after the fact
    kinds = types(db, posted.run_id)
    assert kinds.count("run.started") == 1
    assert kinds[-1] == "run.interrupted"


def test_stop_interrupts_active_runs_with_executor_shutdown(db, executors):
    sleeper(db, "long", 30)
    session_id = make_session(db, agent_id="long")
    held = [post(db, make_session(db, agent_id="long"), "x").run_id for _ in range(2)]
    first = post(db, session_id, "first").run_id
    waiting = post(db, session_id, "second").run_id  # same thread: stays queued
    executor = executors.start("exec-a", concurrency=4)
    wait_until(lambda: all(status(db, r) == "running" for r in [*held, first]), timeout=60)
    began = time.monotonic()
    ended = executor.stop()
    print(f"stop returned after {time.monotonic() - began:.2f}s")
    assert sorted(ended) == sorted([*held, first])
    for run_id in ended:
        terminal = assert_one_terminal_event(db, run_id)
        assert terminal.data == {"reason": "executor_shutdown", "executor_instance_id": "exec-a"}
    assert status(db, waiting) == "queued"
    wait_until(lambda: executor.active_run_ids == [], timeout=60)
    snapshot = {r: len(events(db, r)) for r in [*held, first, waiting]}
    time.sleep(0.5)
    assert {r: len(events(db, r)) for r in snapshot} == snapshot  # nothing written after stop
    # another executor picks up what was still queued
    executors.start("exec-b")
    assert wait_for_status(db, waiting, "running", timeout=60)
    assert run(db, waiting).executor_instance_id == "exec-b"


def test_start_with_the_same_instance_id_interrupts_what_it_left(db, executors):
    sleeper(db, "long", 30)
    make_agent(db, "echo")
    # a previous incarnation of "exec-a" claimed two runs and died without a word
    left = [post(db, make_session(db, agent_id="long"), "x").run_id for _ in range(2)]
    others = post(db, make_session(db, agent_id="long"), "y").run_id
    claimed = claim(db, "exec-a", max_runs=2, lease_seconds=60)
    assert sorted(c.run_id for c in claimed) == sorted(left)
    claim(db, "exec-other", max_runs=1, lease_seconds=60)
    fresh = post(db, make_session(db), "new work").run_id

    executor = executors.create("exec-a")
    leftovers = executor.start()
    assert sorted(leftovers) == sorted(left)
    for run_id in left:
        terminal = assert_one_terminal_event(db, run_id)
        assert terminal.data == {"reason": "service_restart", "executor_instance_id": "exec-a"}
        assert types(db, run_id).count("run.started") == 1  # interrupted, never re-run
    assert status(db, others) == "running"  # another instance's run is not touched
    assert wait_for_status(db, fresh, "succeeded")


def test_a_run_ended_elsewhere_is_dropped_without_another_write(db, executors):
    sleeper(db, "long", 30)
    posted = post(db, make_session(db, agent_id="long"), "x")
    executor = executors.start("exec-a")
    wait_until(lambda: "message.delta" in types(db, posted.run_id), timeout=60)
    with db.write() as s:  # e.g. an operator's tool, or another reconciler
        interrupt_executor_runs(s, "exec-a", reason="service_restart")
    wait_until(lambda: executor.active_run_ids == [], timeout=60)
    assert_one_terminal_event(db, posted.run_id)
    assert types(db, posted.run_id)[-1] == "run.interrupted"


def _event_times(db, run_id: str) -> list[tuple[str, object]]:
    from agentledger.core.schema import RunEvent

    with db.read() as s:
        return [tuple(r) for r in s.execute(select(RunEvent.type, RunEvent.created_at)
                                            .where(RunEvent.run_id == run_id)
                                            .order_by(RunEvent.seq)).all()]


def test_progress_events_emitted_together_share_the_ending_transaction(db, executors, test_kind):
    """Deltas emitted back to back are written with the run's end, in one transaction (one
    time stamp), in the order emitted; the answer is their text."""
    def chatty(ctx):
        for n in range(6):
            ctx.say(f"part {n}. ")
        return None

    run_id = run_with_kind(db, executors, test_kind, "chatty", chatty)
    written = _event_times(db, run_id)
    assert [t for t, _ in written] == ["run.queued", "run.started", *["message.delta"] * 6,
                                       "run.completed"]
    assert len({at for t, at in written[2:]}) == 1
    assert [e.data["text"] for e in events(db, run_id)[2:8]] == [
        f"part {n}. " for n in range(6)]
    assert message_content(db, run(db, run_id).final_message_id) == "".join(
        f"part {n}. " for n in range(6))


def test_a_progress_event_is_in_the_ledger_soon_while_the_agent_works_on(db, executors, test_kind):
    """An emitted delta waits at most APPEND_DELAY (20 ms) for company: an agent that then
    works on does not hold it back. The agent's next step is 30 s away; the delta must be in
    the ledger long before it (how soon is the benchmark's to measure, not this test's: on a
    busy two-core machine a poll of the ledger alone took most of a second)."""
    seen_at: list[float] = []
    release = threading.Event()

    def slow(ctx):
        ctx.say("first words")
        emitted = time.monotonic()
        wait_until(lambda: "message.delta" in types(db, ctx.run_id), timeout=20, interval=0.01)
        seen_at.append(time.monotonic() - emitted)
        release.wait(30)
        return "done"

    test_kind("slow-talker", slow)
    make_agent(db, "slow-talker", kind="slow-talker")
    posted = post(db, make_session(db, agent_id="slow-talker"), "x")
    executors.start()
    try:
        wait_until(lambda: seen_at, timeout=25)
    finally:
        release.set()
    wait_terminal(db, posted.run_id)
    assert seen_at[0] < 10  # not held for the agent's next step, 30 s later
    assert types(db, posted.run_id) == ["run.queued", "run.started", "message.delta",
                                        "run.completed"]


def test_a_refused_progress_event_fails_the_run_after_what_came_before(db, executors, test_kind):
    def sloppy(ctx):
        ctx.say("fine so far")
        ctx.emit("usage", {"input_tokens": -1, "output_tokens": 0, "cost_usd": None})
        return "never"

    evs = events(db, run_with_kind(db, executors, test_kind, "sloppy", sloppy))
    assert [e.type for e in evs] == ["run.queued", "run.started", "message.delta", "run.failed"]
    assert evs[-1].data["error"]["code"] == "validation_error"
    assert "input_tokens" in evs[-1].data["error"]["message"]


# --------------------------------------------------------------------------------------------
# the database failing under a run
# --------------------------------------------------------------------------------------------


def _driver_error(db, run_id: str) -> Exception:
    """What SQLAlchemy raises when the database fails under a statement (the server ended the
    connection, the disk failed): the driver's own error, wrapped with the statement and its
    parameters in the message."""
    from sqlalchemy.exc import OperationalError

    if db.is_postgres:
        import psycopg

        orig = psycopg.errors.AdminShutdown("terminating connection due to administrator command")
    else:
        import sqlite3

        orig = sqlite3.OperationalError("disk I/O error")
    return OperationalError("SELECT agent_run.id, agent_run.status FROM agent_run "
                            "WHERE agent_run.id = %(run_id)s", {"run_id": run_id}, orig)


@pytest.mark.slow  # waits out a 5 s lease
@pytest.mark.parametrize("fault", ["progress", "wrapped_by_agent", "ending", "children"])
def test_a_database_failure_under_a_run_drops_it_for_the_reconciler(
        db, executors, test_kind, monkeypatch, caplog, fault):
    """The executor's own database call failing while the agent runs (writing what the agent
    emitted, creating its children, writing its end) is no fault of the agent: the run is not
    failed with the driver's message (statement and parameters included); the executor lets go
    of it with one line, and the reconciler ends it ``interrupted`` at its lease's expiry. An
    agent that wraps the error in its own is no different."""
    from sqlalchemy.exc import OperationalError

    def talker(ctx):
        for n in range(40 if fault != "ending" else 2):
            try:
                ctx.say(f"{n} ")
            except OperationalError as exc:  # an agent that reports failures its own way
                if fault == "wrapped_by_agent":
                    raise RuntimeError("could not report progress") from exc
                raise
            ctx.sleep(0.05)
        return "done"

    test_kind("talker", talker)
    make_agent(db, "echo")
    if fault == "children":
        delegator(db, "agent", ["echo"])
    else:
        make_agent(db, "agent", kind="talker")
    run_id = post(db, make_session(db, agent_id="agent"), "x").run_id
    # the lease outlasts any stall before the fault; after it, the test waits it out
    executor = executors.create("exec-a", lease_seconds=ALIVE_LEASE, heartbeat_seconds=ALIVE_BEAT)
    backend = executor.backend
    real_append, failed = backend.append, []

    def append(target, events):
        batch = [t for t, _ in events]
        due = (("run.completed" in batch) if fault == "ending"
               else "message.delta" in batch and types(db, target).count("message.delta") >= 2)
        if target == run_id and due and not failed:
            failed.append(batch)
            raise _driver_error(db, target)
        return real_append(target, events)

    def create_children(target, children):
        failed.append(children)
        raise _driver_error(db, target)

    monkeypatch.setattr(backend, "append", append)
    monkeypatch.setattr(backend, "create_children", create_children)
    executor.start()
    wait_until(lambda: failed, timeout=30)
    wait_until(lambda: executor.active_run_ids == [], timeout=30)
    # Let go of, not ended: nobody but the reconciler writes for it any more.
    assert status(db, run_id) == "running"
    wait_until(lambda: reconcile_once(db).lease_expired, timeout=30)
    terminal = assert_one_terminal_event(db, run_id)
    assert terminal.data["reason"] == "lease_expired"
    assert terminal.data["executor_instance_id"] == "exec-a"
    row = run(db, run_id)
    assert row.status == "interrupted" and row.error is None
    kinds = types(db, run_id)
    assert kinds.count("run.started") == 1 and "run.failed" not in kinds  # never re-run
    assert not any("SQL" in str(e.data) or "SELECT" in str(e.data) for e in events(db, run_id))
    if fault == "children":
        assert runs(db, parent_run_id=run_id) == []
    said = [r for r in caplog.records if r.name == "agentledger.executor" and run_id in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert said[0].levelname == "WARNING" and "OperationalError" in said[0].getMessage()
    assert said[0].exc_info is None
    assert not any("SELECT" in r.getMessage() or "[SQL" in r.getMessage() or r.exc_info
                   for r in caplog.records if r.name == "agentledger.executor")


def test_the_server_ending_the_executor_s_connections_fails_no_run(pg_db, test_kind, caplog):
    """PostgreSQL ends the executor's connections while its runs write (an administrator, a
    failover): each run either goes on (the next statement reconnects) or, when its own write
    failed, is let go of and ended ``interrupted`` by the reconciler; none ends ``failed``, and
    no statement's SQL text lands in the ledger or in the executor's lines about a run."""
    import psycopg
    from support.processes import fast_settings

    from agentledger.core.database import Database

    db = pg_db
    make_agent(db, "talker", kind="scripted", params={"steps": [{"say": "x"}, {"sleep": 0.1}] * 30})
    run_ids = [post(db, make_session(db, agent_id="talker"), "x").run_id for _ in range(4)]
    # Its own connections, named: ending them leaves the test's own reads alone.
    own = Database(f"{db.url}?application_name=executor-under-test")
    executor = Executor(own, fast_settings(own.url, lease_seconds=2, heartbeat_seconds=0.5),
                        instance_id="exec-a", concurrency=4)
    executor.start()
    try:
        wait_until(lambda: all(types(db, r).count("message.delta") >= 2 for r in run_ids),
                   timeout=30)
        database = db.engine.url.database
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{database}",
                             autocommit=True) as admin:
            for _ in range(5):
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE application_name = 'executor-under-test'")
                time.sleep(0.3)

        def ended():
            reconcile_once(db)
            return all(status(db, r) in TERMINAL for r in run_ids)

        wait_until(ended, timeout=60)
    finally:
        executor.stop()
        executor.notifier.stop()
        own.dispose()
    for run_id in run_ids:
        row = run(db, run_id)
        terminal = assert_one_terminal_event(db, run_id)
        assert row.status in ("succeeded", "interrupted"), (row.status, row.error)
        if row.status == "interrupted":
            assert terminal.data["reason"] == "lease_expired"
        assert types(db, run_id).count("run.started") == 1
        assert not any("SQL" in str(e.data) for e in events(db, run_id))
    assert not any("[SQL" in r.getMessage() or "agent of run" in r.getMessage()
                   for r in caplog.records
                   if r.name == "agentledger.executor" and any(i in r.getMessage() for i in run_ids))
