"""Numbers for the 100M-events plan, measured on a loaded bench database (PostgreSQL only).

``python -m bench.storage --db URL [--archive-days N]`` prints, as Markdown:

- table and index sizes of ``run_event``, ``agent_run`` and ``message``, bytes per event, and
  their linear projection to 100M events;
- a time-window read over ``run_event.created_at`` (one hour in the middle of the data) through
  the BRIN index, and the same read with bitmap scans disabled (a sequential scan of the
  table, what it costs without the BRIN);
- with ``--archive-days N``: ``agentledger archive`` of the run trees that ended more than N days
  ago, timed (runs/s, events/s), and the table sizes after it (PostgreSQL reuses the freed
  space; it does not give it back without ``VACUUM FULL``).

It changes nothing unless ``--archive-days`` is given (which deletes what it archives).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from agentledger.core.database import normalize_url
from bench.common import libpq, log

TABLES = ("run_event", "agent_run", "message")
PROJECTED_EVENTS = 100_000_000


# The tables that hold a table's rows: the leaves of its partition tree (``run_event`` is
# partitioned on PostgreSQL), or the table itself when it is a plain one, for which
# ``pg_partition_tree()`` returns no rows at all (PostgreSQL 12 and later). UNION, not UNION
# ALL: a plain table is counted once whichever way a server answers.
_LEAVES = ("SELECT relid FROM pg_partition_tree(%(table)s) WHERE isleaf"
           " UNION SELECT oid FROM pg_class WHERE oid = %(table)s::regclass AND relkind = 'r'")


def _sizes(conn: psycopg.Connection) -> dict:
    """Sizes of each table, summed over the tables that hold its rows (``_LEAVES``)."""
    found = {}
    for table in TABLES:
        rows, heap, indexes, total = conn.execute(
            "SELECT sum(greatest(c.reltuples, 0))::bigint, sum(pg_relation_size(t.relid)),"
            " sum(pg_indexes_size(t.relid)), sum(pg_total_relation_size(t.relid))"
            f" FROM ({_LEAVES}) t JOIN pg_class c ON c.oid = t.relid", {"table": table}
        ).fetchone()
        per_index = conn.execute(
            "SELECT coalesce(p.relname, i.relname), sum(pg_relation_size(i.oid))"
            f" FROM ({_LEAVES}) t JOIN pg_index x ON x.indrelid = t.relid"
            " JOIN pg_class i ON i.oid = x.indexrelid"
            " LEFT JOIN pg_inherits h ON h.inhrelid = i.oid"
            " LEFT JOIN pg_class p ON p.oid = h.inhparent"
            " GROUP BY 1 ORDER BY 2 DESC", {"table": table}
        ).fetchall()
        found[table] = {"rows": rows, "heap": heap, "indexes": indexes, "total": total,
                        "per_index": per_index}
    return found


def _mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MB" if n < 2**30 else f"{n / 2**30:,.1f} GB"


def _window_read(conn: psycopg.Connection, *, brin: bool, repeats: int = 5) -> tuple[float, int, str]:
    start, end = conn.execute(
        "SELECT min(created_at), max(created_at) FROM run_event"
    ).fetchone()
    middle = start + (end - start) / 2
    sql = ("SELECT count(*), count(DISTINCT run_id) FROM run_event"
           " WHERE created_at >= %s AND created_at < %s + interval '1 hour'")
    timings = []
    with conn.transaction():
        if not brin:
            conn.execute("SET LOCAL enable_bitmapscan = off")
            conn.execute("SET LOCAL enable_indexscan = off")
        plan = conn.execute("EXPLAIN " + sql, (middle, middle)).fetchall()
        scan = next((line for (line,) in plan if "Scan" in line), plan[0][0]).strip()
        for _ in range(repeats):
            t = time.perf_counter()
            events, _runs = conn.execute(sql, (middle, middle)).fetchone()
            timings.append(time.perf_counter() - t)
    return statistics.median(timings) * 1000, events, scan


def _archive(url: str, days: float) -> tuple[float, int, int]:
    from agentledger.archive import archive_command
    from agentledger.core.config import Settings

    with psycopg.connect(libpq(url)) as conn:
        runs_before = conn.execute("SELECT count(*) FROM agent_run").fetchone()[0]
        events_before = conn.execute("SELECT count(*) FROM run_event").fetchone()[0]
    out = tempfile.mkdtemp(prefix="agentledger-archive-")
    t = time.perf_counter()
    archive_command(Settings.from_env(database_url=url), older_than_days=days, out=out,
                    batch_size=500, dry_run=False)
    seconds = time.perf_counter() - t
    with psycopg.connect(libpq(url)) as conn:
        runs = runs_before - conn.execute("SELECT count(*) FROM agent_run").fetchone()[0]
        events = events_before - conn.execute("SELECT count(*) FROM run_event").fetchone()[0]
    archived = sum(p.stat().st_size for p in Path(out).glob("*.jsonl.gz"))
    log(f"archive file(s) in {out}: {_mb(archived)}")
    return seconds, runs, events


def _size_table(sizes: dict) -> list[str]:
    events = sizes["run_event"]["rows"] or 1
    lines = ["| table | rows | heap | indexes | total | bytes / event | at 100M events |",
             "|---|---|---|---|---|---|---|"]
    for table in TABLES:
        s = sizes[table]
        lines.append(f"| {table} | {s['rows']:,} | {_mb(s['heap'])} | {_mb(s['indexes'])} | "
                     f"{_mb(s['total'])} | {s['total'] / events:,.0f} | "
                     f"{_mb(s['total'] / events * PROJECTED_EVENTS)} |")
    lines += ["", "| index of run_event | size |", "|---|---|"]
    lines += [f"| {name} | {_mb(size) if size >= 2**20 else f'{size / 1024:,.0f} kB'} |"
              for name, size in sizes["run_event"]["per_index"]]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.storage", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True, help="a loaded bench database (PostgreSQL)")
    p.add_argument("--archive-days", type=float, default=None,
                   help="also archive (and delete) run trees that ended more than N days ago")
    args = p.parse_args(argv)
    url = normalize_url(args.db)
    if not url.startswith("postgresql"):
        raise SystemExit("bench.storage measures PostgreSQL storage; pass a postgresql URL")
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute("ANALYZE run_event")
        conn.execute("ANALYZE agent_run")
        conn.execute("ANALYZE message")
        sizes = _sizes(conn)
        brin_ms, events, brin_plan = _window_read(conn, brin=True)
        scan_ms, _, scan_plan = _window_read(conn, brin=False, repeats=3)
    out = ["## Storage at this size", "", *_size_table(sizes), "",
           "## One hour of events by time (`created_at`), median of repeated runs", "",
           "| access path | plan | ms | events |", "|---|---|---|---|",
           f"| BRIN | `{brin_plan}` | {brin_ms:,.1f} | {events:,} |",
           f"| no index (sequential scan) | `{scan_plan}` | {scan_ms:,.1f} | {events:,} |", ""]
    print("\n".join(out), flush=True)
    out = []
    if args.archive_days is not None:
        log(f"archiving run trees that ended more than {args.archive_days} days ago")
        seconds, runs, archived_events = _archive(url, args.archive_days)
        with psycopg.connect(libpq(url), autocommit=True) as conn:
            conn.execute("ANALYZE run_event")
            after = _sizes(conn)
        out += ["## Retention: `agentledger archive`", "",
                f"{runs:,} runs and {archived_events:,} events archived in {seconds:,.1f} s "
                f"({runs / seconds:,.0f} runs/s, {archived_events / seconds:,.0f} events/s). "
                f"run_event after: {after['run_event']['rows']:,} rows, "
                f"{_mb(after['run_event']['total'])} (the space is reused by new events, "
                "not returned to the file system).", ""]
    if out:
        print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
