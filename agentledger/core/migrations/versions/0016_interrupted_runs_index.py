"""interrupted runs, indexed with what their reads count

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03

The interruption trend (interrupted runs per day and reason, the ``/interrupted`` page and its
API twin) found its runs through ``(status, finished_at)`` and then read every one of their
rows for the reason: on 1.39M runs, a 30-day trend read 76,000 heap pages (≈ 470 ms). A partial
index of the interrupted runs by ``finished_at`` that carries the reason, agent and executor
(``INCLUDE`` on PostgreSQL; a plain partial index on SQLite) answers it with an index-only scan.
Building it reads ``agent_run`` once under the lock ``CREATE INDEX`` takes (writes to
``agent_run`` wait): the whole upgrade took 5 s on the bench's 1.39M runs. An index of that
name built beforehand (``CREATE INDEX CONCURRENTLY``, docs/operations.md) is kept.
"""
import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None

WHERE = sa.text("status = 'interrupted'")


def upgrade() -> None:
    # IF NOT EXISTS: a large deployment may have built it beforehand, CONCURRENTLY
    # (docs/operations.md), to keep writes going while it builds.
    op.create_index('ix_agent_run_interrupted', 'agent_run', ['finished_at'],
                    postgresql_include=['end_reason', 'agent_id', 'executor_instance_id'],
                    sqlite_where=WHERE, postgresql_where=WHERE, if_not_exists=True)


def downgrade() -> None:
    op.drop_index('ix_agent_run_interrupted', table_name='agent_run')
