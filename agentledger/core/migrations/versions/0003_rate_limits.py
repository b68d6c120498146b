"""per-owner run rate limits

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29

One counter row per owner and minute, shared by every process (no in-process counters).
"""
import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'rate_limit_window',
        sa.Column('owner_id', sa.String(length=200), nullable=False),
        sa.Column('window_start', sa.DateTime(timezone=True), nullable=False),
        sa.Column('count', sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint('owner_id', 'window_start', name=op.f('pk_rate_limit_window')),
    )


def downgrade() -> None:
    op.drop_table('rate_limit_window')
