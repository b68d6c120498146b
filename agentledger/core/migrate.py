"""Applying the Alembic migrations (``agentledger db upgrade``; ``python app.py`` does it too)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from agentledger.core.database import normalize_url, one_off_connection

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return cfg


def _run(url: str, step, revision: str) -> None:
    cfg = alembic_config(url)
    with one_off_connection(url, begin=True) as connection:
        cfg.attributes["connection"] = connection
        step(cfg, revision)


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database to ``revision``; running it again is a no-op."""
    _run(url, command.upgrade, revision)


def ensure_event_partitions(url: str) -> list[str]:
    """PostgreSQL: make this month's and the coming months' ``run_event`` partitions."""
    from agentledger.core.event_partitions import ensure_partitions

    with one_off_connection(url, begin=True) as connection:
        return ensure_partitions(connection)


def downgrade(url: str, revision: str) -> None:
    """Take the database back to ``revision`` (for repairs and the migration tests)."""
    _run(url, command.downgrade, revision)


def current_revision(url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with one_off_connection(url) as connection:
        return MigrationContext.configure(connection).get_current_revision()
