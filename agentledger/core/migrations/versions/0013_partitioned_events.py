"""run_event partitioned by month of run id on PostgreSQL

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01

The events move into a table partitioned by range of ``run_id`` (one partition per month of the
id's time, plus a default; see ``agentledger.core.event_partitions`` and docs/scaling.md). The
conversion copies every event in primary-key order in batches, printing progress when there is
history to move, then compares the row counts before the old table is dropped; the primary key,
foreign key and indexes are built after the copy (faster than maintaining them row by row), and
the append-only trigger is put back on the new table. It all runs in the migration's one
transaction: a failure leaves the database as it was. The table is locked for the whole copy, so
writers and event readers wait: stop the servers and workers first (docs/operations.md has the
measured rate). The downgrade converts back to one plain table the same way. SQLite: nothing.
"""
from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime

from alembic import op
from sqlalchemy import Connection, text

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

OLD = "run_event_before_rebuild"
COLUMNS = "run_id, seq, type, data, created_at, hash"


def event_copy_batch() -> int:
    """Events per copy statement (progress is printed after each): ``AGENTLEDGER_EVENT_COPY_BATCH``,
    read when the migration runs, not when it is loaded. Every command has checked its range at
    start (``agentledger.core.config``), so a value here is a whole number from 1."""
    return int(os.environ.get("AGENTLEDGER_EVENT_COPY_BATCH") or 200_000)
# The layout as it was when this migration shipped (agentledger.core.event_partitions keeps
# making partitions the same way afterwards): months of ULID time, ids before 2020 or of another
# layout in the default partition, two months ahead.
EPOCH = datetime(2020, 1, 1, tzinfo=UTC)
MONTHS_AHEAD = 2
_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name == "postgresql" and not _is_partitioned(conn):
        _rebuild(conn, partitioned=True)


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name == "postgresql" and _is_partitioned(conn):
        _rebuild(conn, partitioned=False)


def _rebuild(conn: Connection, *, partitioned: bool) -> None:
    sql = conn.exec_driver_sql
    sql(f"ALTER TABLE run_event RENAME TO {OLD}")
    sql(f"ALTER TABLE {OLD} RENAME CONSTRAINT pk_run_event TO pk_{OLD}")
    sql(f"ALTER TABLE {OLD} RENAME CONSTRAINT fk_run_event_run_id_agent_run TO fk_{OLD}")
    sql(f"ALTER INDEX ix_run_event_usage RENAME TO ix_{OLD}_usage")
    sql(f"ALTER INDEX ix_run_event_created_at_brin RENAME TO ix_{OLD}_brin")
    sql("CREATE TABLE run_event (run_id VARCHAR(40) NOT NULL, seq INTEGER NOT NULL, "
        "type VARCHAR(40) NOT NULL, data JSONB NOT NULL, created_at TIMESTAMP WITH TIME ZONE "
        "NOT NULL, hash VARCHAR(64) NOT NULL)" + (" PARTITION BY RANGE (run_id)" if partitioned else ""))
    if partitioned:
        for month in _months_to_create(conn):
            _create_partition(conn, month)
        sql("CREATE TABLE run_event_default PARTITION OF run_event DEFAULT")
    total = conn.execute(text(f"SELECT count(*) FROM {OLD}")).scalar_one()
    copied = _copy(conn, total)
    moved = conn.execute(text("SELECT count(*) FROM run_event")).scalar_one()
    if not copied == moved == total:
        raise RuntimeError(f"run_event conversion: {total} events before, {moved} after; "
                           "nothing was changed")
    sql(f"DROP TABLE {OLD}")
    sql("ALTER TABLE run_event ADD CONSTRAINT pk_run_event PRIMARY KEY (run_id, seq)")
    sql("ALTER TABLE run_event ADD CONSTRAINT fk_run_event_run_id_agent_run "
        "FOREIGN KEY (run_id) REFERENCES agent_run (id)")
    sql("CREATE INDEX ix_run_event_usage ON run_event (run_id) WHERE type = 'usage'")
    sql("CREATE INDEX ix_run_event_created_at_brin ON run_event USING brin (created_at)")
    sql("CREATE TRIGGER run_event_append_only BEFORE UPDATE OR DELETE ON run_event "
        "FOR EACH ROW EXECUTE FUNCTION agentledger_event_guard()")
    sql("ANALYZE run_event")
    if total >= event_copy_batch():
        _say(f"run_event: {total:,} events converted; counts match")


def _months_to_create(conn: Connection) -> list[datetime]:
    """From the month of the oldest recorded run id to ``MONTHS_AHEAD`` after this one."""
    now = datetime.now(UTC)
    month = last = _add_months(_month(now), MONTHS_AHEAD)
    oldest = conn.execute(text(
        f"SELECT min(run_id) FROM {OLD} WHERE run_id >= :epoch AND run_id < :end"),
        {"epoch": _id_floor(EPOCH), "end": _id_floor(_add_months(last, 1))}).scalar()
    first = _month(_id_time(oldest)) if oldest else _month(now)
    found = []
    while month >= min(first, _month(now)):
        found.append(month)
        month = _add_months(month, -1)
    return found[::-1]


def _is_partitioned(conn: Connection) -> bool:
    return conn.execute(text(
        "SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass('run_event')")).scalar() is True


def _create_partition(conn: Connection, month: datetime) -> None:
    conn.exec_driver_sql(
        f"CREATE TABLE run_event_{month:%Y%m} PARTITION OF run_event FOR VALUES "
        f"FROM ('{_id_floor(month)}') TO ('{_id_floor(_add_months(month, 1))}')")


def _month(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def _add_months(month: datetime, n: int) -> datetime:
    index = month.year * 12 + month.month - 1 + n
    return month.replace(year=index // 12, month=index % 12 + 1)


def _id_floor(moment: datetime) -> str:
    """The smallest run id made at ``moment``: ``run_`` and 10 Crockford characters of ms."""
    ms, chars = int(moment.timestamp() * 1000), []
    for _ in range(10):
        chars.append(_CROCKFORD[ms & 31])
        ms >>= 5
    return "run_" + "".join(reversed(chars))


def _id_time(run_id: str) -> datetime:
    ms = 0
    for char in run_id[4:14]:
        ms = ms * 32 + _CROCKFORD.index(char)
    return datetime.fromtimestamp(ms / 1000, UTC)


def _copy(conn: Connection, total: int) -> int:
    """Copy every event in primary-key order, ``AGENTLEDGER_EVENT_COPY_BATCH`` at a time
    (keyset pages on the old primary key), saying how far it got when there is more than one
    batch."""
    batch = event_copy_batch()
    started, copied, after = time.monotonic(), 0, None
    while True:
        upper = conn.execute(text(
            f"SELECT run_id, seq FROM {OLD} WHERE {_after(after)} "
            "ORDER BY run_id, seq OFFSET :n LIMIT 1"),
            {"n": batch - 1, **_key("a", after)}).first()
        bound = "" if upper is None else " AND (run_id, seq) <= (:b_run, :b_seq)"
        copied += conn.execute(text(
            f"INSERT INTO run_event ({COLUMNS}) SELECT {COLUMNS} FROM {OLD} "
            f"WHERE {_after(after)}{bound}"), {**_key("a", after), **_key("b", upper)}).rowcount
        if total >= batch:
            _say(f"run_event: {copied:,} of {total:,} events copied "
                 f"({100 * copied // max(total, 1)} %), {time.monotonic() - started:.0f} s")
        if upper is None:
            return copied
        after = tuple(upper)


def _after(key) -> str:
    return "TRUE" if key is None else "(run_id, seq) > (:a_run, :a_seq)"


def _key(name: str, key) -> dict:
    return {} if key is None else {f"{name}_run": key[0], f"{name}_seq": key[1]}


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
