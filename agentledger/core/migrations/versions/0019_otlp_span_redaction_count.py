"""otlp_span.redaction_count

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06

How many values ``AGENTLEDGER_REDACT`` replaced in a span (attributes, name, status message,
service name) as the receiver stored it. A run recorded from spans counts the replacements of
the spans it was built from in its ``agent_run.redaction_count``; before this, the receiver
redacted before storing and the run was built from text with nothing left to replace, so such a
run said 0 whatever was replaced. Spans stored before this revision count 0. A plain ``ADD
COLUMN`` with a constant default: no table rewrite on either database.
"""
from alembic import op

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE otlp_span ADD COLUMN redaction_count INTEGER DEFAULT 0 NOT NULL")


def downgrade() -> None:
    op.execute("ALTER TABLE otlp_span DROP COLUMN redaction_count")
