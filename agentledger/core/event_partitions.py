"""``run_event``'s partitions on PostgreSQL: one per calendar month (UTC) of the run id, plus a
default partition.

Run ids are ULIDs (``agentledger.core.ids``): their first ten characters are the millisecond the
run was recorded, so a range of ids is a range of recording time. Partitioning on ``run_id``
keeps the primary key ``(run_id, seq)`` as it was (a key must contain the partition key), puts
all of a run's events in one partition (a run's stream and its hash chain are read from one
partition), and makes the newest partition the only one that grows. A month whose runs have all
been archived is an empty partition, which ``agentledger archive`` drops: its space comes back at
once instead of after a vacuum. The default partition holds ids outside every month (ids of
another layout, or a month not created yet), so an insert never fails for want of a partition.

Partitions are made ahead of time: ``agentledger db upgrade`` and every reconciler (``serve``,
``worker``, ``reconcile``) make the current month and the next ``MONTHS_AHEAD``. SQLite keeps
one table; everything here is a no-op there. See docs/scaling.md.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, text

from agentledger.core.ids import id_floor

log = logging.getLogger("agentledger.core.event_partitions")

TABLE = "run_event"
DEFAULT_PARTITION = "run_event_default"
MONTHS_AHEAD = 2
# Months before this hold no run of this product; ids that decode to earlier times (or to
# nothing) are not ULIDs of ours and stay in the default partition.
EPOCH = datetime(2020, 1, 1, tzinfo=UTC)
_NAME = re.compile(r"^run_event_(\d{6}|default)$")


@dataclass(frozen=True)
class Partition:
    name: str
    lower: str | None  # None: the default partition
    upper: str | None


def is_event_partition(table_name: str) -> bool:
    return bool(_NAME.match(table_name))


def month_start(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def add_months(month: datetime, n: int) -> datetime:
    index = month.year * 12 + month.month - 1 + n
    return month.replace(year=index // 12, month=index % 12 + 1)


def month_partition(month: datetime) -> Partition:
    month = month_start(month)
    return Partition(f"run_event_{month:%Y%m}", id_floor("run", month),
                     id_floor("run", add_months(month, 1)))


def months(first: datetime, last: datetime) -> list[datetime]:
    """Every month from ``first``'s to ``last``'s, both included."""
    month, end, out = month_start(first), month_start(last), []
    while month <= end:
        out.append(month)
        month = add_months(month, 1)
    return out


def is_partitioned(conn: Connection) -> bool:
    if conn.dialect.name != "postgresql":
        return False
    return conn.execute(text(
        "SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(:t)"), {"t": TABLE}
    ).scalar() is True


def partitions(conn: Connection) -> list[Partition]:
    """The partitions that exist, ordered by their lower bound (the default last)."""
    rows = conn.execute(text(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(:t)"),
        {"t": TABLE}).all()
    found = []
    for name, bound in rows:
        values = re.findall(r"'([^']*)'", bound)
        found.append(Partition(name, *values) if len(values) == 2 else Partition(name, None, None))
    return sorted(found, key=lambda p: (p.lower is None, p.lower or ""))


def create_partition(conn: Connection, partition: Partition) -> None:
    conn.exec_driver_sql(
        f"CREATE TABLE {partition.name} PARTITION OF {TABLE} "
        f"FOR VALUES FROM ('{partition.lower}') TO ('{partition.upper}')")


def create_default_partition(conn: Connection) -> None:
    conn.exec_driver_sql(f"CREATE TABLE {DEFAULT_PARTITION} PARTITION OF {TABLE} DEFAULT")


def ensure_partitions(conn: Connection, *, now: datetime | None = None,
                      months_ahead: int = MONTHS_AHEAD) -> list[str]:
    """Create the partitions of the current month and the next ``months_ahead`` that are
    missing; the names created. A month whose ids already sit in the default partition (nothing
    made it in time) is left there and logged: those rows stay correct where they are."""
    if not is_partitioned(conn):
        return []
    now = now or datetime.now(UTC)
    have = {p.name for p in partitions(conn)}
    wanted = [month_partition(m) for m in months(now, add_months(month_start(now), months_ahead))]
    created = []
    for partition in wanted:
        if partition.name in have:
            continue
        in_default = conn.execute(text(
            f"SELECT 1 FROM {DEFAULT_PARTITION} WHERE run_id >= :lo AND run_id < :hi LIMIT 1"),
            {"lo": partition.lower, "hi": partition.upper}).first()
        if in_default is not None:
            log.warning("run_event: events of %s are in %s already; not creating the partition",
                        partition.name, DEFAULT_PARTITION)
            continue
        # Attaching a partition locks the parent briefly; never queue behind long readers.
        conn.exec_driver_sql("SET LOCAL lock_timeout = '2s'")
        create_partition(conn, partition)
        created.append(partition.name)
    if created:
        log.info("run_event: created partition(s) %s", ", ".join(created))
    return created


def drop_empty_partitions(conn: Connection, *, now: datetime | None = None) -> list[str]:
    """Drop month partitions that ended before the current month and hold no event: every run
    recorded in that month has been archived. Their ids can no longer be made, and an id of
    that range arriving anyway (a clock far behind) lands in the default partition."""
    if not is_partitioned(conn):
        return []
    current = id_floor("run", month_start(now or datetime.now(UTC)))
    dropped = []
    for partition in partitions(conn):
        if partition.upper is None or partition.upper > current:
            continue
        if conn.exec_driver_sql(f"SELECT 1 FROM {partition.name} LIMIT 1").first() is not None:
            continue
        conn.exec_driver_sql("SET LOCAL lock_timeout = '2s'")
        conn.exec_driver_sql(f"ALTER TABLE {TABLE} DETACH PARTITION {partition.name}")
        conn.exec_driver_sql(f"DROP TABLE {partition.name}")
        dropped.append(partition.name)
    if dropped:
        log.info("run_event: dropped empty partition(s) %s", ", ".join(dropped))
    return dropped
