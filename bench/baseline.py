"""The raw psycopg baseline: the same SQL work as the project's paths, with nothing around it.

Writes
- run creation: one transaction = ``INSERT agent_run … ON CONFLICT (owner_id,
  idempotency_key_hash) DO NOTHING RETURNING id``, the user message, and event ``run.queued``
  (seq 1, hash chained from the genesis hash), exactly the rows ``POST …/messages`` writes;
- gapless appends: one transaction = a compare-and-set bump of the run's head
  (``UPDATE agent_run SET last_event_seq = last_event_seq + n, last_event_hash = … WHERE id = …
  AND last_event_seq = … RETURNING last_event_seq``; a miss re-reads the head) and the events
  (``INSERT`` for one, ``COPY`` for a batch), hash-chained like the ledger's so
  ``agentledger verify`` still holds on the bench database.

Reads: hand-written SQL returning the same rows as each ``queries`` function (PostgreSQL only).
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from agentledger.core.hashing import GENESIS_HASH, event_hash
from agentledger.core.ids import new_id

# ---- writes ----------------------------------------------------------------------------------


class RawRunCreator:
    """One client's connection; ``create()`` is one idempotent run creation transaction."""

    def __init__(self, dsn: str, *, owner: str, session_id: str, thread_id: str, agent_id: str,
                 snapshot: dict[str, Any]):
        self.conn = psycopg.connect(dsn)
        self.owner, self.session_id, self.thread_id = owner, session_id, thread_id
        self.agent_id, self.snapshot = agent_id, snapshot
        self.pack = {"items": [], "pack_hash": hashlib.sha256(b"[]").hexdigest()}
        self.n = 0

    def create(self) -> str:
        self.n += 1
        key = f"raw-{self.owner}-{self.n}-{new_id('k')}"
        key_hash = hashlib.sha256(("idempotency-key\n" + key).encode()).hexdigest()
        content = f"raw bench {self.n}"
        checksum = hashlib.sha256(json.dumps({"content": content}).encode()).hexdigest()
        run_id, message_id = new_id("run"), new_id("msg")
        now = datetime.now(UTC)
        data = {"agent_id": self.agent_id, "session_id": self.session_id, "parent_run_id": None}
        chain = event_hash(GENESIS_HASH, run_id, 1, "run.queued", data, now)
        with self.conn.transaction():
            inserted = self.conn.execute(
                "INSERT INTO agent_run (id, thread_id, session_id, root_run_id, parent_run_id,"
                " owner_id, agent_id, agent_version, status, agent_execution_snapshot,"
                " context_pack_snapshot, input, user_message_id, last_event_seq, last_event_hash,"
                " idempotency_key_hash, request_checksum, created_at)"
                " VALUES (%s, %s, %s, %s, NULL, %s, %s, %s, 'queued', %s, %s, %s, %s, 1, %s, %s, %s, %s)"
                " ON CONFLICT (owner_id, idempotency_key_hash) DO NOTHING RETURNING id",
                (run_id, self.thread_id, self.session_id, run_id, self.owner, self.agent_id,
                 self.snapshot["version"], Jsonb(self.snapshot), Jsonb(self.pack), content,
                 message_id, chain, key_hash, checksum, now),
            ).fetchone()
            if inserted is None:  # pragma: no cover - keys are unique here
                return run_id
            self.conn.execute(
                "INSERT INTO message (id, session_id, thread_id, owner_id, role, content, run_id,"
                " created_at) VALUES (%s, %s, %s, %s, 'user', %s, %s, %s)",
                (message_id, self.session_id, self.thread_id, self.owner, content, run_id, now))
            self.conn.execute(
                "INSERT INTO run_event (run_id, seq, type, data, created_at, hash)"
                " VALUES (%s, 1, 'run.queued', %s, %s, %s)",
                (run_id, Jsonb(data), now, chain))
        return run_id

    def close(self) -> None:
        self.conn.close()


class RawAppender:
    """One client's connection appending ``message.delta`` events to its own runs."""

    def __init__(self, dsn: str, run_ids: list[str]):
        self.conn = psycopg.connect(dsn)
        self.heads: dict[str, tuple[int, str]] = {}
        self.run_ids = run_ids
        self.turn = 0
        for run_id in run_ids:
            self._reread(run_id)
        self.conn.commit()

    def _reread(self, run_id: str) -> None:
        seq, head = self.conn.execute(
            "SELECT last_event_seq, last_event_hash FROM agent_run WHERE id = %s", (run_id,)
        ).fetchone()
        self.heads[run_id] = (seq, head)

    def append(self, n: int) -> None:
        run_id = self.run_ids[self.turn % len(self.run_ids)]
        self.turn += 1
        while True:
            seq, head = self.heads[run_id]
            now = datetime.now(UTC)
            rows = []
            for i in range(1, n + 1):
                data = {"text": f"raw delta {seq + i} "}
                head = event_hash(head, run_id, seq + i, "message.delta", data, now)
                rows.append((run_id, seq + i, "message.delta", Jsonb(data), now, head))
            with self.conn.transaction():
                bumped = self.conn.execute(
                    "UPDATE agent_run SET last_event_seq = last_event_seq + %s, last_event_hash = %s"
                    " WHERE id = %s AND last_event_seq = %s RETURNING last_event_seq",
                    (n, head, run_id, seq)).fetchone()
                if bumped is not None:
                    if n == 1:
                        self.conn.execute(
                            "INSERT INTO run_event (run_id, seq, type, data, created_at, hash)"
                            " VALUES (%s, %s, %s, %s, %s, %s)", rows[0])
                    else:
                        with self.conn.cursor().copy(
                            "COPY run_event (run_id, seq, type, data, created_at, hash) FROM STDIN"
                        ) as copy:
                            for row in rows:
                                copy.write_row(row)
            if bumped is not None:
                self.heads[run_id] = (seq + n, head)
                return
            self._reread(run_id)  # someone else appended: retry on the new head
            self.conn.commit()

    def close(self) -> None:
        self.conn.close()


class RawLifecycle(RawRunCreator):
    """One client's connection living trivial runs through with the minimal statements, the
    baseline of the end-to-end runs/s: the creation above (run, user message, ``run.queued``),
    then a claim of the oldest queued run of the agent (``FOR UPDATE SKIP LOCKED``, the run row
    to running with its lease, ``run.started``), one ``message.delta`` (head compare-and-set and
    the event), and the completion (head and status, the assistant message, ``run.completed``,
    and one upsert into each outcome rollup, day, hour and minute): four transactions,
    hash-chained."""

    def live_one(self) -> None:
        self.create()
        with self.conn.transaction():
            claimed = self.conn.execute(
                "SELECT id, last_event_hash, session_id, thread_id, created_at FROM agent_run "
                "WHERE status = 'queued' AND agent_id = %s ORDER BY created_at "
                "LIMIT 1 FOR UPDATE SKIP LOCKED", (self.agent_id,)).fetchone()
            if claimed is None:  # another client took ours: it lives that one through
                return
            run_id, head, session_id, thread_id, created = claimed
            now = datetime.now(UTC)
            lease = now + timedelta(seconds=30)
            data = {"executor_instance_id": "raw", "lease_expires_at": lease.isoformat()}
            head = event_hash(head, run_id, 2, "run.started", data, now)
            self.conn.execute(
                "UPDATE agent_run SET status = 'running', started_at = %s, executor_instance_id"
                " = 'raw', lease_expires_at = %s, last_heartbeat_at = %s, last_event_seq = 2,"
                " last_event_hash = %s WHERE id = %s", (now, lease, now, head, run_id))
            self._event(run_id, 2, "run.started", data, now, head)
        now = datetime.now(UTC)
        data = {"text": "raw"}
        head = event_hash(head, run_id, 3, "message.delta", data, now)
        with self.conn.transaction():
            self.conn.execute(
                "UPDATE agent_run SET last_event_seq = 3, last_event_hash = %s"
                " WHERE id = %s AND last_event_seq = 2", (head, run_id))
            self._event(run_id, 3, "message.delta", data, now, head)
        now = datetime.now(UTC)
        message_id = new_id("msg")
        data = {"final_message_id": message_id}
        head = event_hash(head, run_id, 4, "run.completed", data, now)
        latency, wait = (now - created).total_seconds(), 0.0
        with self.conn.transaction():
            self.conn.execute(
                "UPDATE agent_run SET status = 'succeeded', finished_at = %s, final_message_id"
                " = %s, lease_expires_at = NULL, last_event_seq = 4, last_event_hash = %s"
                " WHERE id = %s AND last_event_seq = 3", (now, message_id, head, run_id))
            self.conn.execute(
                "INSERT INTO message (id, session_id, thread_id, owner_id, role, content, run_id,"
                " created_at) VALUES (%s, %s, %s, %s, 'assistant', 'raw', %s, %s)",
                (message_id, session_id, thread_id, self.owner, run_id, now))
            self._event(run_id, 4, "run.completed", data, now, head)
            shard = self.n % 16
            for table, key_column, key in (
                ("agent_outcome_rollup", "day", created.astimezone(UTC).date()),
                ("agent_outcome_rollup_hour", "hour", created.astimezone(UTC).replace(minute=0, second=0,
                                                                       microsecond=0)),
                ("agent_outcome_rollup_minute", "minute",
                 created.astimezone(UTC).replace(second=0, microsecond=0))):
                self.conn.execute(
                    f"INSERT INTO {table} (agent_id, agent_version, {key_column}, status, shard,"
                    " runs, latency_n, latency_sum, latency_min, latency_max, wait_n, wait_sum,"
                    " wait_min, wait_max, input_tokens, output_tokens, cost_usd, latency_h05,"
                    " wait_h00) VALUES (%s, %s, %s, 'succeeded', %s, 1, 1, %s, %s, %s, 1, %s,"
                    " %s, %s, 0, 0, 0, 1, 1) ON CONFLICT (agent_id, agent_version,"
                    f" {key_column}, status, shard) DO UPDATE SET runs = {table}.runs + 1,"
                    f" latency_n = {table}.latency_n + 1, latency_sum = {table}.latency_sum +"
                    f" excluded.latency_sum, latency_max = greatest({table}.latency_max,"
                    f" excluded.latency_max), wait_n = {table}.wait_n + 1, latency_h05 ="
                    f" {table}.latency_h05 + 1, wait_h00 = {table}.wait_h00 + 1",
                    (self.agent_id, self.snapshot["version"], key, shard, latency, latency,
                     latency, wait, wait, wait))

    def _event(self, run_id: str, seq: int, type_: str, data: dict, at: datetime,
               chain: str) -> None:
        self.conn.execute(
            "INSERT INTO run_event (run_id, seq, type, data, created_at, hash)"
            " VALUES (%s, %s, %s, %s, %s, %s)", (run_id, seq, type_, Jsonb(data), at, chain))


# ---- reads -----------------------------------------------------------------------------------

_RUN_COLUMNS = (
    "id, session_id, thread_id, root_run_id, parent_run_id, owner_id, agent_id, status,"
    " agent_execution_snapshot, context_pack_snapshot, last_event_seq, executor_instance_id,"
    " lease_expires_at, final_message_id, error, created_at, started_at, finished_at"
)


def _rows(conn: psycopg.Connection, sql: str, params: tuple = ()) -> list[tuple]:
    return conn.execute(sql, params).fetchall()


def provenance(conn, message_id: str):
    found = _rows(conn, f"SELECT m.id, m.role, m.content, m.created_at, m.session_id, m.run_id,"
                        f" {', '.join('r.' + c.strip() for c in _RUN_COLUMNS.split(','))}"
                        " FROM message m JOIN agent_run r ON r.id = m.run_id WHERE m.id = %s",
                  (message_id,))
    if found and found[0][4]:
        _rows(conn, "SELECT id, owner_id, title, agent_id, created_at, updated_at, deleted_at"
                    " FROM chat_session WHERE id = %s", (found[0][4],))
    return found


def run(conn, run_id: str):
    return _rows(conn, f"SELECT {_RUN_COLUMNS} FROM agent_run WHERE id = %s", (run_id,))


def events_page(conn, run_id: str, limit: int = 100):
    _rows(conn, "SELECT status, last_event_seq FROM agent_run WHERE id = %s", (run_id,))
    return _rows(conn, "SELECT seq, type, data, created_at FROM run_event WHERE run_id = %s"
                       " AND seq > 0 ORDER BY seq LIMIT %s", (run_id, limit))


def tree(conn, run_id: str):
    return _rows(conn, "SELECT id, parent_run_id, agent_id, agent_execution_snapshot, status,"
                       " created_at, started_at, finished_at FROM agent_run WHERE root_run_id ="
                       " (SELECT root_run_id FROM agent_run WHERE id = %s)"
                       " ORDER BY created_at, id", (run_id,))


def run_list(conn, agent_id: str, status: str, since: datetime, limit: int = 50):
    return _rows(conn, f"SELECT {_RUN_COLUMNS} FROM agent_run WHERE status = %s AND agent_id = %s"
                       " AND created_at >= %s ORDER BY created_at DESC, id DESC LIMIT %s",
                 (status, agent_id, since, limit + 1))


def status_timeline(conn, since: datetime, limit: int = 300):
    _rows(conn, "SELECT count(*) FROM agent_run WHERE created_at >= %s", (since,))
    return _rows(conn, "SELECT id, root_run_id, parent_run_id, agent_id, agent_version, owner_id,"
                       " status, created_at, started_at, finished_at,"
                       " agent_execution_snapshot->>'name' FROM agent_run WHERE created_at >= %s"
                       " ORDER BY created_at DESC, id DESC LIMIT %s", (since, limit))


def interrupted(conn, since: datetime, limit: int = 50):
    return _rows(conn, """
        SELECT r.id, r.root_run_id, r.parent_run_id, r.agent_id, r.agent_version, r.owner_id,
               r.executor_instance_id, r.lease_expires_at, r.last_heartbeat_at, r.created_at,
               r.started_at, r.finished_at, r.last_event_seq,
               r.agent_execution_snapshot->>'name', e.data->>'reason',
               b.seq, b.type, b.created_at, p.status
        FROM agent_run r
        JOIN run_event e ON e.run_id = r.id AND e.seq = r.last_event_seq
        LEFT JOIN run_event b ON b.run_id = r.id AND b.seq = r.last_event_seq - 1
        LEFT JOIN agent_run p ON p.id = r.parent_run_id
        WHERE r.status = 'interrupted' AND r.finished_at >= %s
        ORDER BY r.finished_at DESC, r.id DESC LIMIT %s""", (since, limit + 1))


def lease_health(conn, limit: int = 200):
    now = conn.execute("SELECT now()").fetchone()[0]
    risk = now + timedelta(seconds=30)
    since = now - timedelta(minutes=15)
    _rows(conn, """
        SELECT count(*) FILTER (WHERE status = 'queued'),
               count(*) FILTER (WHERE status IN ('running','cancelling') AND lease_expires_at >= %s),
               count(*) FILTER (WHERE status IN ('running','cancelling') AND lease_expires_at >= %s
                                AND lease_expires_at <= %s),
               count(*) FILTER (WHERE status IN ('running','cancelling') AND lease_expires_at < %s),
               min(lease_expires_at) FILTER (WHERE status IN ('running','cancelling')
                                             AND lease_expires_at < %s)
        FROM agent_run WHERE status IN ('queued','running','cancelling')""",
          (now, now, risk, now, now))
    _rows(conn, "SELECT id, root_run_id, agent_id, agent_version, status, executor_instance_id,"
                " lease_expires_at, last_heartbeat_at, started_at, agent_execution_snapshot->>'name'"
                " FROM agent_run WHERE status IN ('running','cancelling')"
                " ORDER BY lease_expires_at, id LIMIT %s", (limit + 1,))
    return _rows(conn, """
        SELECT executor_instance_id, count(*) FILTER (WHERE status IN ('running','cancelling')),
               count(*) FILTER (WHERE status NOT IN ('running','cancelling')),
               max(last_heartbeat_at), max(finished_at)
        FROM (SELECT executor_instance_id, status, last_heartbeat_at, finished_at FROM agent_run
              WHERE status IN ('running','cancelling')
              UNION ALL
              SELECT executor_instance_id, status, last_heartbeat_at, finished_at FROM agent_run
              WHERE status IN ('succeeded','failed','cancelled','interrupted')
                AND finished_at >= %s AND executor_instance_id IS NOT NULL) c
        GROUP BY executor_instance_id ORDER BY executor_instance_id LIMIT 500""", (since,))


def outcomes(conn, since: datetime):
    """Per agent and version by scanning the window: counts, means, usage sums, percentiles."""
    _rows(conn, """
        SELECT agent_id, agent_version, status, count(*),
               sum(extract(epoch FROM finished_at - started_at)),
               count(finished_at - started_at),
               sum(extract(epoch FROM started_at - created_at)), count(started_at - created_at)
        FROM agent_run WHERE created_at >= %s
        GROUP BY agent_id, agent_version, status""", (since,))
    _rows(conn, """
        SELECT r.agent_id, r.agent_version, sum((e.data->>'input_tokens')::int),
               sum((e.data->>'output_tokens')::int), sum((e.data->>'cost_usd')::float)
        FROM agent_run r JOIN run_event e ON e.run_id = r.id AND e.type = 'usage'
        WHERE r.created_at >= %s GROUP BY r.agent_id, r.agent_version""", (since,))
    return _rows(conn, """
        SELECT agent_id, agent_version,
               percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP
                 (ORDER BY extract(epoch FROM finished_at - started_at)),
               percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP
                 (ORDER BY extract(epoch FROM started_at - created_at))
        FROM agent_run WHERE created_at >= %s AND started_at IS NOT NULL
          AND status IN ('succeeded','failed','cancelled','interrupted')
        GROUP BY ROLLUP (agent_id, agent_version)""", (since,))
