"""Applying the Alembic migrations (``agentledger db upgrade``; ``python app.py`` does it too)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from agentledger.core.database import normalize_url, one_off_connection
from agentledger.core.lock_waits import lock_waits_told

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return cfg


def _run(url: str, step, revision: str) -> None:
    cfg = alembic_config(url)
    with one_off_connection(url, begin=True) as connection:
        _refuse_unknown_revision(cfg, connection, url)
        cfg.attributes["connection"] = connection
        with lock_waits_told(connection, url):
            step(cfg, revision)


def _refuse_unknown_revision(cfg: Config, connection, url: str) -> None:
    """``StartupError`` when the database is at a revision this package has no migration for:
    a newer agentledger migrated it and this one is older (a package rollback). Alembic would
    stop with a traceback ("Can't locate revision"); nothing here can migrate it back."""
    from alembic.script import ScriptDirectory
    from sqlalchemy import inspect, text

    from agentledger import __version__
    from agentledger.core.config import StartupError, shown_url

    if not inspect(connection).has_table("alembic_version"):
        return  # never migrated
    # Read directly: alembic's MigrationContext logs two INFO lines whenever it is made, which
    # ``serve`` would print above the one line that says what is wrong.
    heads = connection.execute(text("SELECT version_num FROM alembic_version")).scalars()
    script = ScriptDirectory.from_config(cfg)
    known = {revision.revision for revision in script.walk_revisions()}
    for current in heads:
        if current not in known:
            raise StartupError(
                f"the database at {shown_url(url)} (AGENTLEDGER_DATABASE_URL) is at schema "
                f"revision {current}, newer than this agentledger {__version__} knows (its "
                f"newest is {', '.join(script.get_heads())}): upgrade agentledger to the "
                "version that migrated it")


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database to ``revision``; running it again is a no-op."""
    _run(url, command.upgrade, revision)


def ensure_event_partitions(url: str) -> list[str]:
    """PostgreSQL: make this month's and the coming months' ``run_event`` partitions."""
    from agentledger.core.event_partitions import ensure_partitions

    with one_off_connection(url, begin=True) as connection, lock_waits_told(connection, url):
        return ensure_partitions(connection)


def downgrade(url: str, revision: str) -> None:
    """Take the database back to ``revision`` (for repairs and the migration tests)."""
    _run(url, command.downgrade, revision)


def current_revision(url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with one_off_connection(url) as connection:
        return MigrationContext.configure(connection).get_current_revision()
