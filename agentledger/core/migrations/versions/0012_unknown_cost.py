"""runs whose cost is unknown, in the outcome rollups

Revision ID: 0012
Revises: 0010
Create Date: 2026-12-01

A ``usage`` event's ``cost_usd`` may be null (no price known for the model). The rollups keep
the known cost in ``cost_usd`` and count the runs with an unpriced call in
``runs_without_cost``, so that a sum never reports an unknown cost as zero. Every stored usage
event had a number until now, so existing rows start at 0.
"""
from alembic import op

revision = '0012'
down_revision = '0010'
branch_labels = None
depends_on = None

TABLES = ('agent_outcome_rollup', 'agent_outcome_rollup_hour')


def upgrade() -> None:
    for table in TABLES:
        op.execute(f'ALTER TABLE {table} ADD COLUMN runs_without_cost BIGINT DEFAULT 0 NOT NULL')


def downgrade() -> None:
    for table in TABLES:
        op.execute(f'ALTER TABLE {table} DROP COLUMN runs_without_cost')
