"""Whether the PostgreSQL server maintains the ledger's tables.

The outcome rollups are updated in place at every run's end, and a new database has no planner
statistics until it is analyzed: both rely on autovacuum (and on ``track_counts``, which it
reads). A server with either off, as some CI-tuned servers ship, still runs the ledger, but its
reads and run endings slow down as the tables grow (measured figures in
``docs/operations.md``). ``serve`` and ``db upgrade`` say so at start rather than leave it to be
found in a profile.
"""

from __future__ import annotations

from sqlalchemy import text

from agentledger.core.database import backend_name, one_off_connection

MAINTENANCE_SETTINGS = ("autovacuum", "track_counts")
AUTOVACUUM_DOC = "docs/operations.md#postgresql-keep-autovacuum-on"


def settings_turned_off(url: str) -> list[str]:
    """The maintenance settings the server has off (none on SQLite, which has no such thing)."""
    if backend_name(url) != "postgresql":
        return []
    with one_off_connection(url) as connection:
        rows = connection.execute(
            text("SELECT name, setting FROM pg_settings WHERE name = ANY(:names)"),
            {"names": list(MAINTENANCE_SETTINGS)}).all()
    found: dict[str, str] = {name: setting for name, setting in rows}
    return [name for name in MAINTENANCE_SETTINGS if found.get(name) == "off"]


def maintenance_warning(url: str) -> str | None:
    """A one-line warning when the server does not maintain the tables, else None."""
    off = settings_turned_off(url)
    if not off:
        return None
    return (f"PostgreSQL's {' and '.join(off)} {'is' if len(off) == 1 else 'are'} off on this "
            "server: dead rows of the outcome rollups are not reclaimed and a new database "
            "gets no planner statistics, so reads and run endings slow down as the tables "
            f"grow; turn it on, or run VACUUM ANALYZE as {AUTOVACUUM_DOC} describes")
