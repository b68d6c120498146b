"""OTLP span buffer

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

Spans received by ``POST /api/otel/v1/traces`` are stored as they arrive (one row per
``(trace_id, span_id)``, so a re-export adds nothing), whichever server receives them; a
trace's runs are written from these rows once its agent spans have arrived. ``run_id`` names the
run a span was recorded in (NULL while it waits). ``otlp_conversation`` maps an owner's
conversation id (``gen_ai.conversation.id`` / ``session.id``) to its chat session.
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        'otlp_span',
        sa.Column('trace_id', sa.String(length=32), nullable=False),
        sa.Column('span_id', sa.String(length=16), nullable=False),
        sa.Column('parent_span_id', sa.String(length=16), nullable=True),
        sa.Column('owner_id', sa.String(length=200), nullable=False),
        sa.Column('service_name', sa.String(length=200), nullable=False),
        sa.Column('name', sa.Text(), nullable=False),
        sa.Column('start_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('end_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('status_code', sa.SmallInteger(), nullable=False),
        sa.Column('status_message', sa.Text(), nullable=True),
        sa.Column('attributes', JSON_DOC, nullable=False),
        sa.Column('received_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('run_id', sa.String(length=40), nullable=True),
        sa.PrimaryKeyConstraint('trace_id', 'span_id', name=op.f('pk_otlp_span')),
    )
    op.create_index(op.f('ix_otlp_span_received_at'), 'otlp_span', ['received_at'])
    op.create_index(op.f('ix_otlp_span_run_id_received_at'), 'otlp_span',
                    ['run_id', 'received_at'])
    op.create_table(
        'otlp_conversation',
        sa.Column('owner_id', sa.String(length=200), nullable=False),
        sa.Column('conversation_id', sa.String(length=255), nullable=False),
        sa.Column('session_id', sa.String(length=40), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('owner_id', 'conversation_id', name=op.f('pk_otlp_conversation')),
    )


def downgrade() -> None:
    op.drop_table('otlp_conversation')
    op.drop_index(op.f('ix_otlp_span_run_id_received_at'), table_name='otlp_span')
    op.drop_index(op.f('ix_otlp_span_received_at'), table_name='otlp_span')
    op.drop_table('otlp_span')
