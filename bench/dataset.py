"""The data set: reuse a database that already holds enough runs, else load one.

Loading goes through the project's own path, ``agentledger.demo.seed`` (what
``agentledger demo seed --runs N`` runs): agents with versions, sessions, delegation trees, every
terminal status, ~10 events per run, over 30 days. When ``agentledger.demo.bulk_seed`` (the
COPY-based ``ingest.bulk_import`` that ``demo seed`` uses for large N) exists, the bench calls it
for any N. The report says which path loaded the data and its rate (runs, all rows, and events
per second of wall time, counted in the database before and after).
"""

from __future__ import annotations

import importlib.util
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import text

from agentledger.core.config import Settings
from agentledger.core.database import Database, normalize_url
from agentledger.core.migrate import upgrade
from bench.common import create_pg_database, is_postgres, log, postgres_server_cpu_seconds

TABLES = ("agent_run", "message", "run_event", "chat_session", "conversation_thread")
DAYS = 30


@dataclass
class LoadResult:
    reused: bool
    path: str
    seconds: float | None
    runs: int
    events: int
    rows_added: int
    runs_added: int
    events_added: int
    # CPU seconds the load took: this process with its preparing workers, and PostgreSQL's
    # processes on this machine (None when the database is not a local PostgreSQL)
    importer_cpu: float | None = None
    database_cpu: float | None = None

    def cpu_us_per_event(self) -> tuple[float | None, float | None]:
        if not self.events_added:
            return None, None
        importer, database = (None if cpu is None else round(cpu / self.events_added * 1e6, 1)
                              for cpu in (self.importer_cpu, self.database_cpu))
        return importer, database

    @property
    def rows_per_second(self) -> float | None:
        return round(self.rows_added / self.seconds, 1) if self.seconds else None

    @property
    def events_per_second(self) -> float | None:
        return round(self.events_added / self.seconds, 1) if self.seconds else None

    @property
    def runs_per_second(self) -> float | None:
        return round(self.runs_added / self.seconds, 1) if self.seconds else None


def counts(db: Database) -> dict[str, int]:
    with db.read() as s:
        return {t: int(s.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()) for t in TABLES}


def bulk_import_available() -> bool:
    if importlib.util.find_spec("ingest.bulk_import") is None:
        return False
    from agentledger import demo

    return hasattr(demo, "bulk_seed")


def prepare(url: str, *, reload: bool) -> None:
    """Create (or, with ``reload``, recreate) the database and migrate it."""
    if is_postgres(url):
        create_pg_database(url, drop=reload)
    else:
        from agentledger.core.config import sqlite_path

        path = sqlite_path(normalize_url(url))
        if reload and path is not None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
    upgrade(url)


def ensure(url: str, runs: int, *, reload: bool, seed: int = 42) -> LoadResult:
    """At least ``runs`` runs in the database (root runs plus their delegated children)."""
    prepare(url, reload=reload)
    db = Database(url)
    try:
        before = counts(db)
    finally:
        db.dispose()
    bulk = bulk_import_available()
    path = "agentledger.demo.bulk_seed → ingest.bulk_import (COPY)" if bulk else \
        "agentledger.demo.seed (ingest functions, one transaction per run)"
    if before["agent_run"] >= runs:
        log(f"reusing the data set: {before['agent_run']} runs, {before['run_event']} events")
        return LoadResult(True, path, None, before["agent_run"], before["run_event"], 0, 0, 0)
    # The seed counts root runs; about a third of the roots delegate, so ask for fewer roots.
    missing = runs - before["agent_run"]
    roots = max(1, int(missing / 1.4))
    log(f"loading ~{missing} runs ({roots} root runs) through {path}")
    from agentledger import demo

    settings = Settings(database_url=url)
    load = demo.bulk_seed if bulk else demo.seed
    start, importer, database = time.perf_counter(), _own_cpu(), postgres_server_cpu_seconds(url)
    load(settings, runs=roots, days=DAYS, seed=seed + before["agent_run"], progress=os.isatty(2))
    seconds = time.perf_counter() - start
    importer = _own_cpu() - importer
    database_after = postgres_server_cpu_seconds(url)
    database = None if database is None or database_after is None else database_after - database
    db = Database(url)
    try:
        after = counts(db)
    finally:
        db.dispose()
    added = sum(after.values()) - sum(before.values())
    result = LoadResult(False, path, seconds, after["agent_run"], after["run_event"], added,
                        after["agent_run"] - before["agent_run"],
                        after["run_event"] - before["run_event"], importer, database)
    per_importer, per_database = result.cpu_us_per_event()
    log(f"loaded {result.runs_added} runs / {result.events_added} events in {seconds:.1f}s: "
        f"{result.runs_per_second} runs/s, {result.events_per_second} events/s; CPU per event: "
        f"importer {per_importer} µs, PostgreSQL {per_database} µs")
    return result


def _own_cpu() -> float:
    """User + system CPU of this process and of its children that have ended (the import's
    preparing workers are joined before it returns)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def analyze(url: str) -> None:
    """Before the phases: fresh planner statistics, visibility maps and no dead rows (what
    autovacuum keeps, when it is on and has caught up), then a checkpoint, so that the reads
    measured next do not share the disk with dirty pages being written out."""
    if not is_postgres(url):
        return
    import psycopg

    from bench.common import libpq

    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
