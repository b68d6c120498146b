"""agent_run.redaction_count

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01

How many values ``AGENTLEDGER_REDACT`` replaced in a run's input, context, events and answer
before they were stored (0 for runs written without redaction, and for every existing run).
Shown to admins in the run detail. A plain ``ADD COLUMN`` with a constant default: no table
rewrite on either database, and the triggers on ``agent_run`` stay as they are.
"""
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE agent_run ADD COLUMN redaction_count INTEGER DEFAULT 0 NOT NULL")


def downgrade() -> None:
    op.execute("ALTER TABLE agent_run DROP COLUMN redaction_count")
