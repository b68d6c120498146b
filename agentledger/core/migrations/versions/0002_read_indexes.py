"""indexes for the read side

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

The dashboards' questions that the first schema had no index for: runs that ended in a window,
by status (interrupted runs, executors seen lately, outcomes), and answers in a window (message
search, newest first).
"""
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_agent_run_status_finished_at', 'agent_run', ['status', 'finished_at'])
    op.create_index('ix_message_role_created_at', 'message', ['role', 'created_at'])


def downgrade() -> None:
    op.drop_index('ix_message_role_created_at', table_name='message')
    op.drop_index('ix_agent_run_status_finished_at', table_name='agent_run')
