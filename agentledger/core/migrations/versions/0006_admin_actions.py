"""admin action log

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29

An append-only record of administrative actions (tokens, agents, cancels, session deletions):
who, what, when. Triggers refuse UPDATE and DELETE, as for run_event.
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        'admin_action',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('actor', sa.String(length=200), nullable=False),
        sa.Column('actor_role', sa.String(length=16), nullable=False),
        sa.Column('action', sa.String(length=40), nullable=False),
        sa.Column('target_type', sa.String(length=20), nullable=False),
        sa.Column('target_id', sa.String(length=200), nullable=False),
        sa.Column('detail', JSON_DOC, nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_admin_action')),
    )
    op.create_index(op.f('ix_admin_action_at'), 'admin_action', ['at'])
    op.create_index(op.f('ix_admin_action_action_at'), 'admin_action', ['action', 'at'])
    if op.get_bind().dialect.name == "postgresql":
        op.execute("CREATE TRIGGER admin_action_append_only BEFORE UPDATE OR DELETE ON admin_action "
                   "FOR EACH ROW EXECUTE FUNCTION agentledger_refuse('admin_action is append-only')")
    else:
        for verb in ("UPDATE", "DELETE"):
            op.execute(f"CREATE TRIGGER admin_action_no_{verb.lower()} BEFORE {verb} ON admin_action "
                       f"BEGIN SELECT RAISE(ABORT, 'admin_action is append-only: {verb} refused'); END")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS admin_action_append_only ON admin_action")
    else:
        op.execute("DROP TRIGGER IF EXISTS admin_action_no_update")
        op.execute("DROP TRIGGER IF EXISTS admin_action_no_delete")
    op.drop_index(op.f('ix_admin_action_action_at'), table_name='admin_action')
    op.drop_index(op.f('ix_admin_action_at'), table_name='admin_action')
    op.drop_table('admin_action')
