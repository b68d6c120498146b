"""retention: archived runs, triggers that allow deleting only archived runs' events, BRIN

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29

``agentledger archive`` moves old, finished run trees to compressed JSONL files. The run_event
triggers now let a DELETE through only for runs recorded in ``archived_run`` in the same
transaction; every other UPDATE or DELETE is still refused by the database. On PostgreSQL a BRIN
index on run_event.created_at keeps time-range scans cheap at 100M rows for a few pages of index.
"""
import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

_PG_REFUSE_UNLESS_ARCHIVED = """
CREATE OR REPLACE FUNCTION agentledger_event_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' AND EXISTS (SELECT 1 FROM archived_run WHERE run_id = OLD.run_id) THEN
    RETURN OLD;
  END IF;
  RAISE EXCEPTION '% on run_event refused: run_event is append-only', TG_OP
    USING ERRCODE = 'insufficient_privilege';
END $$;
"""


def upgrade() -> None:
    op.create_table(
        'archived_run',
        sa.Column('run_id', sa.String(length=40), nullable=False),
        sa.Column('root_run_id', sa.String(length=40), nullable=False),
        sa.Column('archive_file', sa.String(length=500), nullable=False),
        sa.Column('last_event_seq', sa.Integer(), nullable=False),
        sa.Column('last_event_hash', sa.String(length=64), nullable=False),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('archived_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('run_id', name=op.f('pk_archived_run')),
    )
    op.create_index(op.f('ix_archived_run_root_run_id'), 'archived_run', ['root_run_id'])
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_REFUSE_UNLESS_ARCHIVED)
        op.execute("DROP TRIGGER IF EXISTS run_event_append_only ON run_event")
        op.execute("CREATE TRIGGER run_event_append_only BEFORE UPDATE OR DELETE ON run_event "
                   "FOR EACH ROW EXECUTE FUNCTION agentledger_event_guard()")
        op.execute("CREATE INDEX ix_run_event_created_at_brin ON run_event "
                   "USING brin (created_at)")
    else:
        op.execute("DROP TRIGGER IF EXISTS run_event_no_delete")
        op.execute("CREATE TRIGGER run_event_no_delete BEFORE DELETE ON run_event "
                   "WHEN NOT EXISTS (SELECT 1 FROM archived_run WHERE run_id = OLD.run_id) "
                   "BEGIN SELECT RAISE(ABORT, 'run_event is append-only: DELETE refused'); END")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX IF EXISTS ix_run_event_created_at_brin")
        op.execute("DROP TRIGGER IF EXISTS run_event_append_only ON run_event")
        op.execute("CREATE TRIGGER run_event_append_only BEFORE UPDATE OR DELETE ON run_event "
                   "FOR EACH ROW EXECUTE FUNCTION agentledger_refuse('run_event is append-only')")
        op.execute("DROP FUNCTION IF EXISTS agentledger_event_guard()")
    else:
        op.execute("DROP TRIGGER IF EXISTS run_event_no_delete")
        op.execute("CREATE TRIGGER run_event_no_delete BEFORE DELETE ON run_event BEGIN "
                   "SELECT RAISE(ABORT, 'run_event is append-only: DELETE refused'); END")
    op.drop_index(op.f('ix_archived_run_root_run_id'), table_name='archived_run')
    op.drop_table('archived_run')
