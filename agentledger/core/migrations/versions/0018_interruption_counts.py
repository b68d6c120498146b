"""interrupted runs counted per reason, kept through archiving

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06

``agentledger_runs_interrupted_total{reason}`` counted the interrupted runs in ``agent_run``,
so ``agentledger archive`` lowered it: a Prometheus counter that went back. The counts now live
in ``run_interruption_count``, added to in the transaction that ends a run interrupted, and
archiving leaves them. Backfilled here from the interrupted runs still stored (runs archived
before this revision are not counted: their rows are gone). Frozen with this revision: raw SQL,
so later changes to the models never change what this upgrade does.
"""
import sqlalchemy as sa
from alembic import op

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'run_interruption_count',
        sa.Column('reason', sa.String(length=40), nullable=False),
        sa.Column('runs', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('reason', name=op.f('pk_run_interruption_count')),
    )
    op.execute(
        "INSERT INTO run_interruption_count (reason, runs) "
        "SELECT end_reason, count(*) FROM agent_run "
        "WHERE status = 'interrupted' AND end_reason IS NOT NULL GROUP BY end_reason"
    )


def downgrade() -> None:
    op.drop_table('run_interruption_count')
