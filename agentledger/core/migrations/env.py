"""Alembic environment: runs migrations on the connection handed over by ``agentledger.core.migrate``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, text

from agentledger.core.schema import Base, exists_on

config = context.config
target_metadata = Base.metadata


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        include_object=lambda obj, *_: exists_on(obj, connection.dialect.name),
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Many processes may start at once; one migrates, the others wait and find it done.
            connection.execute(text("SELECT pg_advisory_xact_lock(724311)"))
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    url = config.get_main_option("sqlalchemy.url")
    assert url, "sqlalchemy.url is not set"
    engine = create_engine(url)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()
