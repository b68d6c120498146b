"""per-agent outcome rollup

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-06

Ended runs summed per (agent, version, UTC day of creation, terminal status), maintained in the
transaction that ends each run, with fixed log-scale histograms of latency and queue wait
(64 buckets each, see agentledger/core/outcome_histogram.py). Existing runs are summed into it by
0007, once the table has its final key.
"""
import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

BUCKETS = 64  # agentledger.core.outcome_histogram.BUCKETS at the time of this migration


def upgrade() -> None:
    histogram = [
        sa.Column(f'{prefix}_h{i:02d}', sa.Integer(), server_default=sa.text('0'), nullable=False)
        for prefix in ('latency', 'wait') for i in range(BUCKETS)
    ]
    op.create_table(
        'agent_outcome_rollup',
        sa.Column('agent_id', sa.String(length=63), nullable=False),
        sa.Column('agent_version', sa.Integer(), nullable=False),
        sa.Column('day', sa.Date(), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('runs', sa.BigInteger(), nullable=False),
        sa.Column('latency_n', sa.BigInteger(), nullable=False),
        sa.Column('latency_sum', sa.Float(), nullable=False),
        sa.Column('latency_min', sa.Float(), nullable=True),
        sa.Column('latency_max', sa.Float(), nullable=True),
        sa.Column('wait_n', sa.BigInteger(), nullable=False),
        sa.Column('wait_sum', sa.Float(), nullable=False),
        sa.Column('wait_min', sa.Float(), nullable=True),
        sa.Column('wait_max', sa.Float(), nullable=True),
        sa.Column('input_tokens', sa.BigInteger(), nullable=False),
        sa.Column('output_tokens', sa.BigInteger(), nullable=False),
        sa.Column('cost_usd', sa.Float(), nullable=False),
        *histogram,
        sa.PrimaryKeyConstraint('agent_id', 'agent_version', 'day', 'status',
                                name=op.f('pk_agent_outcome_rollup')),
    )
    op.create_index(op.f('ix_agent_outcome_rollup_day'), 'agent_outcome_rollup', ['day'])


def downgrade() -> None:
    op.drop_index(op.f('ix_agent_outcome_rollup_day'), table_name='agent_outcome_rollup')
    op.drop_table('agent_outcome_rollup')
