"""the outcome rollups' unfolded shard rows, indexed

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03

Run endings spread over sixteen shard rows per rollup key; the reconciler loop now folds the
shard rows of days and hours that are over into shard 0 (``ingest.rollup.fold_shards``), so a
month's read sums one row per key and day instead of up to sixteen. A partial index on each
table (``WHERE shard <> 0``) lets every pass find the rows still to fold without reading the
folded history. Both tables hold a row per agent version, status, period and shard (thousands,
not millions): the plain ``CREATE INDEX`` takes a moment. The existing shard rows are folded by
the first pass after the upgrade, not here.
"""
import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None

INDEXES = (('ix_agent_outcome_rollup_unfolded', 'agent_outcome_rollup', 'day'),
           ('ix_agent_outcome_rollup_hour_unfolded', 'agent_outcome_rollup_hour', 'hour'))


def upgrade() -> None:
    for name, table, column in INDEXES:
        op.create_index(name, table, [column], sqlite_where=sa.text('shard <> 0'),
                        postgresql_where=sa.text('shard <> 0'))


def downgrade() -> None:
    for name, table, _column in INDEXES:
        op.drop_index(name, table_name=table)
