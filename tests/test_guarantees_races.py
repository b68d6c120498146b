"""The guarantees table (docs/guarantees.md), the rows about idempotency, races, claims, crashes, zombies and false alarms.

Each test tries hard to break one promise of the contract and prints the random seed it uses
(``GUARANTEE_SEED`` replays it). Figures (CI defaults; ``SOAK=1`` multiplies the counts):

- idempotency: 100 concurrent identical POSTs with one key against ``agentledger serve`` × 10
  rounds per database → 1 run per round, one run id, 99 ``Idempotent-Replayed: true``, 0 × 5xx;
  50 requests with body A racing 50 with body B under one key → 1 run, A's (or B's) twins
  replay, the others get 409 ``idempotency_conflict``; a transaction aborted after the run
  insert (and after each later insert) leaves nothing, and the retry creates exactly 1 run.
- races: cancel vs complete, cancel vs fail, complete vs lease expiry, cancel vs claim and two
  claimers, on two connections in every order (A then B, B then A, A's transaction held open
  while B starts, the reverse) and truly concurrently with random jitter → exactly one terminal
  event, never ``run.completed``/``run.failed`` after ``run.cancelling``.
- claims (PostgreSQL): 4 ``agentledger worker`` processes × 1,000 queued runs → one
  ``run.started`` per run, all terminal, ≤ 1 model invocation per run.
- crashes: SIGKILL a worker holding 20 runs (lease 3 s, heartbeat 1 s, reconcile 1 s, an
  ``agentledger reconcile`` process and an idle second worker alive) → 20/20 ``lease_expired``
  within 6 s of the kill, 0 re-runs.
- zombies: SIGSTOP a worker past its lease, let the reconciler interrupt its runs, SIGCONT → it
  writes nothing more, logs the loss of each run, drops them and goes on to run new work.
- no false alarms: steps blocking 10 × the lease (3 s: longer than a busy machine stalls a
  process) while heartbeats (0.25 s) continue, the reconciler passing every 0.25 s → 0
  interrupted, the runs succeed.
"""

from __future__ import annotations

import re
import signal
import time
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import event as sa_event
from sqlalchemy import func, select, update
from sqlalchemy.engine import make_url
from support.factories import claim, make_agent, make_session, post
from support.ledger import counts
from support.processes import (
    Api,
    ProcessManager,
    assert_one_terminal_event,
    events,
    make_token,
    run,
    statuses,
    types,
    wait_terminal,
    wait_until,
)
from support.races import (
    ORDERED,
    Interleaving,
    event_counts,
    fire_together,
    interleave,
    seeded,
    status_counts,
    terminal_counts,
)
from support.seeds import soak

from agentledger.core import dialect
from agentledger.core.errors import CancelRequested, IllegalTransition, LeaseLost, RunTerminal
from agentledger.core.schema import AgentRun, RunEvent
from ingest.cancel import request_cancel
from ingest.events import append_events
from ingest.leases import claim_runs
from ingest.reconcile import interrupt_if_lease_expired
from ingest.runs import idempotency_key_hash, post_message, request_checksum
from ingest.sessions import create_session
from queries.chain_verification import verify_chains

_n = soak  # (default, soaked): counts chosen up front, SOAK=1 picks the soaked ones

IDEMPOTENCY_ROUNDS = _n(10, 50)
IDEMPOTENCY_CLIENTS = 100
RACE_TOGETHER = _n(12, 100)  # truly concurrent repetitions per race and database
CLAIM_RUNS = _n(1000, 5000)
CLAIM_WORKERS = 4


def assert_chains_ok(db) -> None:
    with db.read(transaction=True) as s:
        report = verify_chains(s)
    assert report.ok, report.problems


# ============================================================================================
# idempotency
# ============================================================================================


@pytest.fixture
def served(db_url, db, procs):
    """``agentledger serve --no-worker`` with enough threads for 100 requests at once, no rate
    limit, an ``echo`` agent, and an admin token."""
    make_agent(db, "echo")
    server = procs.serve(db_url, args=("--threads", "128"), AGENTLEDGER_RUN_RATE_LIMIT="0")
    token = make_token(db_url, owner="alice", role="user")
    api = Api(server.base_url, token)
    yield server, api, token
    api.close()
    assert "Traceback" not in server.log(), server.log()[-4000:]


def runs_with_key(db, owner: str, key: str) -> list[str]:
    with db.read() as s:
        return list(s.execute(select(AgentRun.id).where(
            AgentRun.owner_id == owner,
            AgentRun.idempotency_key_hash == idempotency_key_hash(key))).scalars())


def test_100_concurrent_identical_posts_create_one_run(db, served):
    server, api, token = served
    rng = seeded(f"idempotency-identical-{db.dialect}")
    tally = {"rounds": 0, "replayed": 0, "5xx": 0}
    started = time.monotonic()
    for round_no in range(IDEMPOTENCY_ROUNDS):
        session_id = api.new_session("echo")
        key = f"same-{round_no}-{rng.getrandbits(64):x}"
        path = f"/api/sessions/{session_id}/messages"
        body = {"content": f"round {round_no}"}
        answers = fire_together(server.base_url, token, [
            ("same", path, body, {"Idempotency-Key": key}) for _ in range(IDEMPOTENCY_CLIENTS)])
        tally["5xx"] += sum(a.status >= 500 for a in answers)
        assert [a.status for a in answers] == [202] * IDEMPOTENCY_CLIENTS, \
            [(a.status, a.body) for a in answers if a.status != 202][:3]
        assert len({a.body["run_id"] for a in answers}) == 1, {a.body["run_id"] for a in answers}
        assert len({a.body["message_id"] for a in answers}) == 1
        replayed = [a for a in answers if a.headers.get("Idempotent-Replayed") == "true"]
        assert len(replayed) == IDEMPOTENCY_CLIENTS - 1, len(replayed)
        stored = runs_with_key(db, "alice", key)
        assert stored == [answers[0].body["run_id"]], stored
        assert types(db, stored[0]) == ["run.queued"]
        tally["rounds"] += 1
        tally["replayed"] += len(replayed)
    with db.read() as s:
        assert s.execute(select(func.count()).select_from(AgentRun)).scalar_one() \
            == IDEMPOTENCY_ROUNDS
    print(f"[guarantees] idempotency {db.dialect}: {tally} in {time.monotonic() - started:.1f}s")
    assert tally == {"rounds": IDEMPOTENCY_ROUNDS, "5xx": 0,
                     "replayed": IDEMPOTENCY_ROUNDS * (IDEMPOTENCY_CLIENTS - 1)}


def test_one_key_two_bodies_racing_creates_one_run_and_409s_the_losers(db, served):
    server, api, token = served
    rng = seeded(f"idempotency-two-bodies-{db.dialect}")
    for round_no in range(_n(2, 10)):
        session_id = api.new_session("echo")
        key = f"ab-{round_no}-{rng.getrandbits(64):x}"
        path = f"/api/sessions/{session_id}/messages"
        requests_ = [("A", path, {"content": "body A"}, {"Idempotency-Key": key})] * 50 + \
                    [("B", path, {"content": "body B"}, {"Idempotency-Key": key})] * 50
        rng.shuffle(requests_)
        answers = fire_together(server.base_url, token, requests_)
        stored = runs_with_key(db, "alice", key)
        assert len(stored) == 1, stored
        run_id = stored[0]
        winner = [a for a in answers if a.status == 202]
        losers = [a for a in answers if a.status != 202]
        assert {a.tag for a in winner} in ({"A"}, {"B"}), [(a.tag, a.status) for a in answers]
        assert len(winner) == 50 and len(losers) == 50
        assert {a.body["run_id"] for a in winner} == {run_id}
        assert sum(a.headers.get("Idempotent-Replayed") == "true" for a in winner) == 49
        for a in losers:
            assert a.status == 409 and a.body["error"]["code"] == "idempotency_conflict", a
        with db.read() as s:
            content = s.execute(select(AgentRun.input).where(AgentRun.id == run_id)).scalar_one()
        assert content == f"body {winner[0].tag}"
        print(f"[guarantees] two bodies {db.dialect} round {round_no}: winner {winner[0].tag}, "
              f"50 × 202 (49 replayed), 50 × 409")


@pytest.mark.parametrize("abort_after", ["agent_run", "message", "run_event"])
def test_transaction_aborted_after_the_run_insert_leaves_nothing_and_the_retry_creates_one(
        db, abort_after):
    """Fault injection: the database connection raises right after the statement that inserts
    into ``abort_after`` inside ``post_message``'s transaction (the run row exists at that
    moment; on PostgreSQL one statement inserts the run, its message and its first event)."""
    make_agent(db, "echo")
    session_id = make_session(db)
    key = f"fault-{uuid.uuid4().hex}"
    path = f"/api/sessions/{session_id}/messages"
    body = {"content": "fault"}
    before = counts(db)

    class Injected(Exception):
        pass

    armed = {"on": True, "fired": 0}

    def after_execute(conn, cursor, statement, parameters, context, executemany):
        if armed["on"] and re.search(rf"\bINSERT INTO {abort_after}\b", statement):
            armed["fired"] += 1
            # the row is there, inside the doomed transaction
            assert conn.exec_driver_sql(f"SELECT count(*) FROM {abort_after}").scalar() > \
                before.get(abort_after, -1)
            raise Injected(f"injected fault after INSERT INTO {abort_after}")

    def attempt():
        with db.write() as s:
            return post_message(s, owner_id="alice", session_id=session_id, idempotency_key=key,
                                checksum=request_checksum(path, body), content="fault")

    sa_event.listen(db.engine, "after_cursor_execute", after_execute)
    try:
        with pytest.raises(Injected):
            attempt()
    finally:
        sa_event.remove(db.engine, "after_cursor_execute", after_execute)
        armed["on"] = False
    assert armed["fired"] == 1
    assert counts(db) == before, "the aborted transaction left rows behind"
    assert runs_with_key(db, "alice", key) == []  # no orphan key either

    first = attempt()
    assert not first.replayed
    again = attempt()
    assert again.replayed and again.run_id == first.run_id
    assert runs_with_key(db, "alice", key) == [first.run_id]
    after = counts(db)
    assert after["agent_run"] == before["agent_run"] + 1
    assert after["message"] == before["message"] + 1
    assert after["run_event"] == before["run_event"] + 1
    assert types(db, first.run_id) == ["run.queued"]
    assert_chains_ok(db)


# ============================================================================================
# races: every interleaving of two connections
# ============================================================================================

W1, W2 = "w1", "w2"
RACES = ["cancel_vs_complete", "cancel_vs_fail", "complete_vs_lease_expiry", "cancel_vs_claim",
         "two_claimers"]


def _new_run(db, session_ids: list[str]) -> str:
    session_id = make_session(db)
    session_ids.append(session_id)
    return post(db, session_id, "race").run_id


def _claim(db, run_id: str, instance: str = W1, lease: float = 300) -> None:
    claimed = claim(db, instance, max_runs=1, lease_seconds=lease)
    assert [c.run_id for c in claimed] == [run_id]


def _set_lease(db, run_id: str, offset_seconds: float) -> None:
    """Move the run's lease deadline to the database's now + offset (a lease about to run out
    or just run out), as a claim with that much lease left would have."""
    with db.write() as s:
        now = dialect.now(s)
        s.execute(update(AgentRun).where(AgentRun.id == run_id)
                  .values(lease_expires_at=now + timedelta(seconds=offset_seconds)))


def _ops(race: str, run_id: str):
    def cancel(s):
        return request_cancel(s, run_id, requested_by="alice")

    def complete(s):
        return append_events(s, run_id, [("message.delta", {"text": "answer"}),
                                          ("run.completed", {})], executor_instance_id=W1).status

    def fail(s):
        return append_events(s, run_id, [("run.failed", {"error": {
            "code": "boom", "message": "the model failed"}})], executor_instance_id=W1).status

    def expire(s):
        return interrupt_if_lease_expired(s, run_id)

    def claimer(instance):
        return lambda s: [c.run_id for c in claim_runs(s, instance, max_runs=1, lease_seconds=300)]

    return {
        "cancel_vs_complete": (cancel, complete),
        "cancel_vs_fail": (cancel, fail),
        "complete_vs_lease_expiry": (complete, expire),
        "cancel_vs_claim": (cancel, claimer(W1)),
        "two_claimers": (claimer(W1), claimer(W2)),
    }[race]


ALLOWED_ERRORS = (CancelRequested, IllegalTransition, LeaseLost, RunTerminal)


def _settle(db, run_id: str) -> None:
    """What the executor does next: confirm a cancel request, finish a run it holds."""
    row = run(db, run_id)
    if row.status == "cancelling":
        with db.write() as s:
            append_events(s, run_id, [("run.cancelled", {"external_stop_confirmed": True})],
                          executor_instance_id=row.executor_instance_id)
    elif row.status == "running":
        try:
            with db.write() as s:
                append_events(s, run_id, [("run.completed", {"content": "settled"})],
                              executor_instance_id=row.executor_instance_id)
        except LeaseLost:  # its lease ran out meanwhile: the reconciler's turn
            time.sleep(0.02)
            with db.write() as s:
                assert interrupt_if_lease_expired(s, run_id)


def _check_race(db, race: str, run_id: str, how: Interleaving, a, b) -> str:
    for out in (a, b):
        assert out.error is None or isinstance(out.error, ALLOWED_ERRORS), \
            f"{race}/{how}: unexpected {out.error!r}"
    if how.name in ("a_holds", "b_holds"):
        # the second transaction waited for the first one's commit (row lock on PostgreSQL,
        # BEGIN IMMEDIATE on SQLite), unless it was a claim that skipped the locked row
        second = b if how.name == "a_holds" else a
        assert second.ended >= how.extra["released_at"] or second.value == [], (race, how, second)
    _settle(db, run_id)
    terminal = assert_one_terminal_event(db, run_id)
    ts = types(db, run_id)
    if "run.cancelling" in ts:
        tail = ts[ts.index("run.cancelling"):]
        assert "run.completed" not in tail and "run.failed" not in tail, (race, how, ts)
    assert ts.count("run.started") <= 1, ts
    if race == "two_claimers":
        won = [o.value for o in (a, b) if o.error is None and o.value]
        assert won == [[run_id]], (how, a, b)  # exactly one claimer got it
    if race == "cancel_vs_claim" and (b.value or []) == [run_id]:
        assert terminal.type == "run.cancelled"
    return terminal.type


@pytest.mark.parametrize("race", RACES)
def test_every_interleaving_of_two_connections_ends_with_one_terminal_event(db, race, soak_loop):
    rng = seeded(f"races-{race}-{db.dialect}")
    make_agent(db, "echo")
    sessions: list[str] = []
    outcomes: dict[str, dict[str, int]] = {}
    leases = ("expired", "live") if race == "complete_vs_lease_expiry" else ("",)
    plan = [Interleaving(name, extra={"lease": lease}) for name in ORDERED for lease in leases] + [
        Interleaving("together", rng.uniform(0, 0.004), rng.uniform(0, 0.004))
        for _ in range(RACE_TOGETHER)]
    for how in plan:
        run_id = _new_run(db, sessions)
        if race not in ("cancel_vs_claim", "two_claimers"):
            _claim(db, run_id)
            if race == "complete_vs_lease_expiry":
                # ordered: the lease ran out just before both act, or is still good for a
                # while; together: it runs out around the moment they meet
                offset = {"expired": -0.01, "live": 5.0}.get(how.extra.get("lease"))
                _set_lease(db, run_id, offset if offset is not None else rng.uniform(-0.005, 0.01))
        op_a, op_b = _ops(race, run_id)
        a, b = interleave(db, how, op_a, op_b)
        name = how.name + (f"/{how.extra['lease']}" if how.extra.get("lease") else "")
        ending = _check_race(db, race, run_id, how, a, b)
        outcomes.setdefault(name, {})
        outcomes[name][ending] = outcomes[name].get(ending, 0) + 1
    print(f"[guarantees] {race} {db.dialect}: {outcomes}")
    assert_chains_ok(db)
    with db.read() as s:
        assert s.execute(select(func.count()).select_from(AgentRun)
                         .where(AgentRun.status.in_(("queued", "running", "cancelling")))
                         ).scalar_one() == 0


# ============================================================================================
# real worker processes
# ============================================================================================


def bulk_runs(db, agent_id: str, count: int, *, owner: str = "alice") -> list[str]:
    """``count`` queued runs, each in its own session, in one transaction (one commit, so every
    worker sees all of them at once)."""
    run_ids = []
    with db.write() as s:
        for i in range(count):
            session_id = create_session(s, owner_id=owner, agent_id=agent_id, title=f"bulk {i}")
            path = f"/api/sessions/{session_id}/messages"
            posted = post_message(s, owner_id=owner, session_id=session_id,
                                  idempotency_key=f"bulk-{i}",
                                  checksum=request_checksum(path, {"content": f"job {i}"}),
                                  content=f"job {i}")
            run_ids.append(posted.run_id)
    return run_ids


def test_four_workers_claim_each_of_1000_runs_exactly_once(pg_url, pg_db, procs):
    db = pg_db
    seeded("claims")  # no randomness here; printed for uniformity
    make_agent(db, "echo")
    env = {"AGENTLEDGER_LEASE_SECONDS": "30", "AGENTLEDGER_HEARTBEAT_SECONDS": "5",
           "AGENTLEDGER_RECONCILE_SECONDS": "2"}
    workers = [procs.start(f"claimer-{i}", ["worker", "--instance-id", f"claimer-{i}",
                                             "--concurrency", "8"], procs.environment(pg_url, **env))
               for i in range(CLAIM_WORKERS)]
    for proc in workers:
        proc.wait_for_log(rf"worker {proc.name} executing")
    started = time.monotonic()
    run_ids = bulk_runs(db, "echo", CLAIM_RUNS)
    created = time.monotonic() - started

    def all_done():
        tally = status_counts(db, run_ids)
        return tally.get("succeeded", 0) + tally.get("failed", 0) + tally.get("cancelled", 0) \
            + tally.get("interrupted", 0) == CLAIM_RUNS

    wait_until(all_done, timeout=60 + CLAIM_RUNS // 10, interval=0.5,
               message=lambda: f"all runs terminal: {status_counts(db, run_ids)}\n{procs.logs()}")
    elapsed = time.monotonic() - started
    assert status_counts(db, run_ids) == {"succeeded": CLAIM_RUNS}
    starts = event_counts(db, run_ids, "run.started")
    deltas = event_counts(db, run_ids, "message.delta")
    ends = terminal_counts(db, run_ids)
    assert sorted(set(starts.values())) == [1], {r: n for r, n in starts.items() if n != 1}
    assert max(deltas.values()) <= 1, {r: n for r, n in deltas.items() if n > 1}
    assert sorted(set(ends.values())) == [1]
    with db.read() as s:
        per_worker = dict(s.execute(select(AgentRun.executor_instance_id, func.count())
                                    .where(AgentRun.id.in_(run_ids))
                                    .group_by(AgentRun.executor_instance_id)).all())
    assert set(per_worker) <= {p.name for p in workers}
    print(f"[guarantees] claims: {CLAIM_RUNS} runs created in {created:.1f}s, all terminal "
          f"{elapsed:.1f}s after; run.started per run = 1; message.delta per run ≤ 1; "
          f"by worker {per_worker}")
    for proc in workers:
        assert proc.alive(), proc.log()[-3000:]
        assert "Traceback" not in proc.log(), proc.log()[-3000:]


LEASE, HEARTBEAT, RECONCILE = 3, 1, 1
FAST = {"AGENTLEDGER_LEASE_SECONDS": str(LEASE), "AGENTLEDGER_HEARTBEAT_SECONDS": str(HEARTBEAT),
        "AGENTLEDGER_RECONCILE_SECONDS": str(RECONCILE)}
# The short lease is for the worker a test stops or kills; a worker whose runs must succeed
# leases for longer than a busy machine stalls it (its reconciler still passes every second).
SAFE_LEASE = 15
SAFE = {**FAST, "AGENTLEDGER_LEASE_SECONDS": str(SAFE_LEASE)}


def reconciler_process(procs: ProcessManager, db_url: str, **env: str):
    proc = procs.start("reconcile", ["reconcile"], procs.environment(db_url, **env))
    proc.wait_for_log(r"reconciling every")
    return proc


def sleeper(db, agent_id: str, steps: list[dict]) -> None:
    make_agent(db, agent_id, kind="scripted", params={"steps": steps})


def test_sigkilled_worker_holding_20_runs_ends_them_lease_expired_and_never_reruns(db_url, db, procs):
    seeded(f"crashes-{db.dialect}")
    sleeper(db, "sleeper", [{"say": "working "}, {"sleep": 60}, {"say": "never"}])
    victim = procs.worker(db_url, "victim", concurrency=20, **FAST)
    run_ids = bulk_runs(db, "sleeper", 20)
    wait_until(lambda: all("message.delta" in types(db, r) for r in run_ids), timeout=30,
               message=lambda: f"20 runs working: {statuses(db, run_ids)}\n{procs.logs()}")
    assert {run(db, r).executor_instance_id for r in run_ids} == {"victim"}
    # another process reconciling, and an idle worker that would love to re-run anything
    reconciler_process(procs, db_url, **FAST)
    bystander = procs.worker(db_url, "bystander", concurrency=20, **SAFE)

    victim.kill_group(signal.SIGKILL)
    killed = time.monotonic()
    wait_terminal(db, run_ids, timeout=60)
    elapsed = time.monotonic() - killed
    reasons = []
    for run_id in run_ids:
        terminal = assert_one_terminal_event(db, run_id)
        assert terminal.type == "run.interrupted", types(db, run_id)
        reasons.append(terminal.data["reason"])
        assert types(db, run_id) == ["run.queued", "run.started", "message.delta",
                                     "run.interrupted"]  # 0 re-runs
    assert reasons == ["lease_expired"] * 20
    print(f"[guarantees] crashes {db.dialect}: 20/20 interrupted (lease_expired) "
          f"{elapsed:.2f}s after SIGKILL; 0 re-runs")
    # the bystander really was alive and able to work: it runs a new run right away
    sleeper(db, "quick", [{"say": "hi"}])
    [fresh] = bulk_runs(db, "quick", 1, owner="bob")
    wait_terminal(db, [fresh], timeout=60)
    assert run(db, fresh).executor_instance_id == "bystander"
    assert run(db, fresh).status == "succeeded"
    assert bystander.alive()


def _locks_free(db, run_ids) -> bool:
    """No transaction of the stopped process holds what the reconciler needs (SQLite's write
    lock; PostgreSQL row locks of these runs)."""
    if db.is_postgres:
        import psycopg
        libpq = make_url(db.url).set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(libpq, autocommit=False) as conn:
            try:
                conn.execute("SET lock_timeout = '200ms'")
                conn.execute("SELECT id FROM agent_run WHERE id = ANY(%s) FOR UPDATE NOWAIT",
                             (list(run_ids),))
                return True
            except psycopg.errors.LockNotAvailable:
                return False
            finally:
                conn.rollback()
    import sqlite3
    path = db.url.split("sqlite:///", 1)[1]
    conn = sqlite3.connect(path, timeout=0.2, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


def stop_cleanly(proc, db, run_ids, attempts: int = 20) -> None:
    """SIGSTOP the process at a moment it holds no lock (else a stopped process would block
    every other writer until SIGCONT: a property of the databases, not of the ledger)."""
    for _ in range(attempts):
        proc.kill_group(signal.SIGSTOP)
        time.sleep(0.05)
        if _locks_free(db, run_ids):
            return
        proc.kill_group(signal.SIGCONT)
        time.sleep(0.1)
    raise AssertionError("could not stop the worker outside a transaction")


def test_stopped_worker_resumed_after_its_runs_were_interrupted_writes_nothing(db_url, db, procs):
    rng = seeded(f"zombies-{db.dialect}")
    runs_n = 5
    # streams small deltas all the time, so a resumed thread is about to write at any moment
    steps = []
    for i in range(60):
        steps += [{"say": f"part {i} "}, {"sleep": round(rng.uniform(0.05, 0.25), 3)}]
    sleeper(db, "chatty", steps)
    zombie = procs.worker(db_url, "zombie", concurrency=runs_n, **FAST)
    reconciler_process(procs, db_url, **FAST)
    run_ids = bulk_runs(db, "chatty", runs_n)
    wait_until(lambda: all(types(db, r).count("message.delta") >= 2 for r in run_ids), timeout=60,
               message=lambda: f"runs streaming: {statuses(db, run_ids)}\n{procs.logs()}")

    stop_cleanly(zombie, db, run_ids)
    stopped = time.monotonic()
    seqs_at_stop = {r: len(events(db, r)) for r in run_ids}
    wait_terminal(db, run_ids, timeout=LEASE + 4 * RECONCILE + 5)
    interrupted_after = time.monotonic() - stopped
    # its last heartbeat was at most HEARTBEAT before the stop; the lease ran its full length
    assert interrupted_after >= LEASE - HEARTBEAT - 0.5, interrupted_after
    heads = {}
    for run_id in run_ids:
        terminal = assert_one_terminal_event(db, run_id)
        assert terminal.type == "run.interrupted" and terminal.data["reason"] == "lease_expired"
        heads[run_id] = len(events(db, run_id))
        assert heads[run_id] == seqs_at_stop[run_id] + 1  # nothing but the interruption
    log_before = zombie.log()

    zombie.kill_group(signal.SIGCONT)
    resumed = time.monotonic()

    def dropped_all():
        log = zombie.log()[len(log_before):]
        return all(re.search(rf"(dropping run {r}\b|run {r}: lease lost)", log) for r in run_ids)

    wait_until(dropped_all, timeout=60, message=lambda: f"the zombie to drop every run:\n"
                                                        f"{zombie.log()[-4000:]}")
    # it frees its slots: with concurrency = runs_n it can only run new work if it let go of all
    sleeper(db, "quick", [{"say": "fresh"}])
    fresh = bulk_runs(db, "quick", runs_n, owner="bob")
    wait_terminal(db, fresh, timeout=60)
    assert set(statuses(db, fresh).values()) == {"succeeded"}
    assert {run(db, r).executor_instance_id for r in fresh} == {"zombie"}
    time.sleep(0.5)
    late = {r: len(events(db, r)) - heads[r] for r in run_ids}
    assert late == dict.fromkeys(run_ids, 0), late  # 100 % of late writes refused
    tail = zombie.log()[len(log_before):]
    refused_in_db = len(re.findall(r"dropping run \S+: run \S+ has ended", tail))
    print(f"[guarantees] zombies {db.dialect}: interrupted {interrupted_after:.1f}s after SIGSTOP; "
          f"after SIGCONT {runs_n}/{runs_n} runs dropped in {time.monotonic() - resumed:.1f}s "
          f"({refused_in_db} by a refused write), 0 events appended after run.interrupted")
    with db.read() as s:
        assert s.execute(select(func.count()).select_from(RunEvent).where(
            RunEvent.run_id.in_(run_ids), RunEvent.type == "run.interrupted")).scalar_one() == runs_n
    # and at the transaction level, its instance id can write nothing to those runs any more
    for run_id in run_ids:
        with pytest.raises(LeaseLost), db.write() as s:
            append_events(s, run_id, [("message.delta", {"text": "late"})],
                          executor_instance_id="zombie")
    assert zombie.alive()


# No false alarms: a lease long enough that no stall of a busy machine outlasts it (renewals
# land every 0.25–0.5 s: the heartbeat, then the monitor's next quarter-second look), heartbeats
# and reconciler passes as frequent as before, and a step 10 leases long.
ALARM_LEASE, ALARM_BEAT = 3, 0.25
ALARM_STEP = 10 * ALARM_LEASE


def test_step_blocking_10_leases_with_heartbeats_is_never_interrupted(db_url, db, procs):
    seeded(f"no-false-alarms-{db.dialect}")
    env = {"AGENTLEDGER_LEASE_SECONDS": str(ALARM_LEASE),
           "AGENTLEDGER_HEARTBEAT_SECONDS": str(ALARM_BEAT),
           "AGENTLEDGER_RECONCILE_SECONDS": str(ALARM_BEAT)}
    sleeper(db, "slow", [{"say": "thinking "}, {"sleep": ALARM_STEP}, {"say": "done"}])
    worker = procs.worker(db_url, "steady", concurrency=4, **env)
    reconciler_process(procs, db_url, **env)
    run_ids = bulk_runs(db, "slow", 4)
    started = time.monotonic()
    wait_terminal(db, run_ids, timeout=120)
    elapsed = time.monotonic() - started
    assert statuses(db, run_ids) == dict.fromkeys(run_ids, "succeeded"), \
        {r: types(db, r) for r in run_ids}
    for run_id in run_ids:
        assert assert_one_terminal_event(db, run_id).type == "run.completed"
        assert "run.interrupted" not in types(db, run_id)
    for row in (run(db, r) for r in run_ids):  # the ledger's own clock: each run blocked
        assert (row.finished_at - row.started_at).total_seconds() >= ALARM_STEP, row
    assert "lease lost" not in worker.log() and "dropping run" not in worker.log()
    with db.read() as s:
        beats = s.execute(select(func.count()).select_from(AgentRun).where(
            AgentRun.id.in_(run_ids), AgentRun.last_heartbeat_at > AgentRun.started_at)).scalar_one()
    assert beats == len(run_ids)
    print(f"[guarantees] no false alarms {db.dialect}: 4 runs blocked {ALARM_STEP} s (10 × the "
          f"{ALARM_LEASE} s lease), 0 interrupted, all succeeded after {elapsed:.1f}s")

