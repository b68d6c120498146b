"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Tables, indexes, and the triggers that make run_event append-only and run snapshots,
agent versions frozen. Column types are spelled out here (not imported from the models) so the
migration stays what it was when it shipped.
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

UTC_TIME = sa.DateTime(timezone=True)
JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('agent',
    sa.Column('id', sa.String(length=63), nullable=False),
    sa.Column('latest_version', sa.Integer(), nullable=False),
    sa.Column('created_at', UTC_TIME, nullable=False),
    sa.Column('updated_at', UTC_TIME, nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_agent'))
    )
    op.create_table('api_token',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('owner_id', sa.String(length=200), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('created_at', UTC_TIME, nullable=False),
    sa.Column('revoked_at', UTC_TIME, nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_token')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_api_token_token_hash'))
    )
    op.create_table('context_blob',
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('content', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('sha256', name=op.f('pk_context_blob'))
    )
    op.create_table('conversation_thread',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('owner_id', sa.String(length=200), nullable=False),
    sa.Column('created_at', UTC_TIME, nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_conversation_thread'))
    )
    op.create_table('agent_version',
    sa.Column('agent_id', sa.String(length=63), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('kind', sa.String(length=63), nullable=False),
    sa.Column('model', sa.String(length=200), nullable=True),
    sa.Column('instructions', sa.Text(), nullable=True),
    sa.Column('tools', JSON_DOC, nullable=False),
    sa.Column('params', JSON_DOC, nullable=False),
    sa.Column('content_hash', sa.String(length=64), nullable=False),
    sa.Column('created_at', UTC_TIME, nullable=False),
    sa.ForeignKeyConstraint(['agent_id'], ['agent.id'], name=op.f('fk_agent_version_agent_id_agent')),
    sa.PrimaryKeyConstraint('agent_id', 'version', name=op.f('pk_agent_version'))
    )
    op.create_table('chat_session',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('owner_id', sa.String(length=200), nullable=False),
    sa.Column('title', sa.String(length=500), nullable=True),
    sa.Column('agent_id', sa.String(length=63), nullable=False),
    sa.Column('thread_id', sa.String(length=40), nullable=False),
    sa.Column('created_at', UTC_TIME, nullable=False),
    sa.Column('updated_at', UTC_TIME, nullable=False),
    sa.Column('deleted_at', UTC_TIME, nullable=True),
    sa.ForeignKeyConstraint(['agent_id'], ['agent.id'], name=op.f('fk_chat_session_agent_id_agent')),
    sa.ForeignKeyConstraint(['thread_id'], ['conversation_thread.id'], name=op.f('fk_chat_session_thread_id_conversation_thread')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_chat_session')),
    sa.UniqueConstraint('thread_id', name=op.f('uq_chat_session_thread_id'))
    )
    with op.batch_alter_table('chat_session', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_chat_session_owner_id_created_at'), ['owner_id', 'created_at'], unique=False)

    op.create_table('agent_run',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('thread_id', sa.String(length=40), nullable=False),
    sa.Column('session_id', sa.String(length=40), nullable=True),
    sa.Column('root_run_id', sa.String(length=40), nullable=False),
    sa.Column('parent_run_id', sa.String(length=40), nullable=True),
    sa.Column('owner_id', sa.String(length=200), nullable=False),
    sa.Column('agent_id', sa.String(length=63), nullable=False),
    sa.Column('agent_version', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('agent_execution_snapshot', JSON_DOC, nullable=False),
    sa.Column('context_pack_snapshot', JSON_DOC, nullable=False),
    sa.Column('input', sa.Text(), nullable=False),
    sa.Column('user_message_id', sa.String(length=40), nullable=True),
    sa.Column('last_event_seq', sa.Integer(), nullable=False),
    sa.Column('last_event_hash', sa.String(length=64), nullable=False),
    sa.Column('executor_instance_id', sa.String(length=200), nullable=True),
    sa.Column('lease_expires_at', UTC_TIME, nullable=True),
    sa.Column('last_heartbeat_at', UTC_TIME, nullable=True),
    sa.Column('idempotency_key_hash', sa.String(length=64), nullable=True),
    sa.Column('request_checksum', sa.String(length=64), nullable=True),
    sa.Column('final_message_id', sa.String(length=40), nullable=True),
    sa.Column('error', JSON_DOC, nullable=True),
    sa.Column('created_at', UTC_TIME, nullable=False),
    sa.Column('started_at', UTC_TIME, nullable=True),
    sa.Column('finished_at', UTC_TIME, nullable=True),
    sa.ForeignKeyConstraint(['agent_id'], ['agent.id'], name=op.f('fk_agent_run_agent_id_agent')),
    sa.ForeignKeyConstraint(['parent_run_id'], ['agent_run.id'], name=op.f('fk_agent_run_parent_run_id_agent_run')),
    sa.ForeignKeyConstraint(['session_id'], ['chat_session.id'], name=op.f('fk_agent_run_session_id_chat_session')),
    sa.ForeignKeyConstraint(['thread_id'], ['conversation_thread.id'], name=op.f('fk_agent_run_thread_id_conversation_thread')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_agent_run')),
    sa.UniqueConstraint('owner_id', 'idempotency_key_hash', name=op.f('uq_agent_run_owner_id_idempotency_key_hash'))
    )
    with op.batch_alter_table('agent_run', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_agent_run_agent_id_created_at'), ['agent_id', 'created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_agent_run_created_at'), ['created_at'], unique=False)
        batch_op.create_index('ix_agent_run_live_lease', ['status', 'lease_expires_at'], unique=False, sqlite_where=sa.text("status IN ('queued', 'running', 'cancelling')"), postgresql_where=sa.text("status IN ('queued', 'running', 'cancelling')"))
        batch_op.create_index(batch_op.f('ix_agent_run_parent_run_id'), ['parent_run_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_agent_run_root_run_id'), ['root_run_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_agent_run_session_id'), ['session_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_agent_run_thread_id_created_at'), ['thread_id', 'created_at'], unique=False)
        batch_op.create_index('uq_agent_run_one_active_per_thread', ['thread_id'], unique=True, sqlite_where=sa.text("status IN ('running', 'cancelling')"), postgresql_where=sa.text("status IN ('running', 'cancelling')"))

    op.create_table('message',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('session_id', sa.String(length=40), nullable=True),
    sa.Column('thread_id', sa.String(length=40), nullable=False),
    sa.Column('owner_id', sa.String(length=200), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('content', sa.Text(), nullable=False),
    sa.Column('run_id', sa.String(length=40), nullable=False),
    sa.Column('created_at', UTC_TIME, nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['agent_run.id'], name=op.f('fk_message_run_id_agent_run')),
    sa.ForeignKeyConstraint(['session_id'], ['chat_session.id'], name=op.f('fk_message_session_id_chat_session')),
    sa.ForeignKeyConstraint(['thread_id'], ['conversation_thread.id'], name=op.f('fk_message_thread_id_conversation_thread')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_message'))
    )
    with op.batch_alter_table('message', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_message_run_id'), ['run_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_message_session_id_created_at'), ['session_id', 'created_at'], unique=False)
        batch_op.create_index('uq_message_assistant_run', ['run_id'], unique=True, sqlite_where=sa.text("role = 'assistant'"), postgresql_where=sa.text("role = 'assistant'"))

    op.create_table('run_event',
    sa.Column('run_id', sa.String(length=40), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('type', sa.String(length=40), nullable=False),
    sa.Column('data', JSON_DOC, nullable=False),
    sa.Column('created_at', UTC_TIME, nullable=False),
    sa.Column('hash', sa.String(length=64), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['agent_run.id'], name=op.f('fk_run_event_run_id_agent_run')),
    sa.PrimaryKeyConstraint('run_id', 'seq', name=op.f('pk_run_event'))
    )
    _create_triggers()


def downgrade() -> None:
    _drop_triggers()
    op.drop_table('run_event')
    with op.batch_alter_table('message', schema=None) as batch_op:
        batch_op.drop_index('uq_message_assistant_run', sqlite_where=sa.text("role = 'assistant'"), postgresql_where=sa.text("role = 'assistant'"))
        batch_op.drop_index(batch_op.f('ix_message_session_id_created_at'))
        batch_op.drop_index(batch_op.f('ix_message_run_id'))

    op.drop_table('message')
    with op.batch_alter_table('agent_run', schema=None) as batch_op:
        batch_op.drop_index('uq_agent_run_one_active_per_thread', sqlite_where=sa.text("status IN ('running', 'cancelling')"), postgresql_where=sa.text("status IN ('running', 'cancelling')"))
        batch_op.drop_index(batch_op.f('ix_agent_run_thread_id_created_at'))
        batch_op.drop_index(batch_op.f('ix_agent_run_session_id'))
        batch_op.drop_index(batch_op.f('ix_agent_run_root_run_id'))
        batch_op.drop_index(batch_op.f('ix_agent_run_parent_run_id'))
        batch_op.drop_index('ix_agent_run_live_lease', sqlite_where=sa.text("status IN ('queued', 'running', 'cancelling')"), postgresql_where=sa.text("status IN ('queued', 'running', 'cancelling')"))
        batch_op.drop_index(batch_op.f('ix_agent_run_created_at'))
        batch_op.drop_index(batch_op.f('ix_agent_run_agent_id_created_at'))

    op.drop_table('agent_run')
    with op.batch_alter_table('chat_session', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_chat_session_owner_id_created_at'))

    op.drop_table('chat_session')
    op.drop_table('agent_version')
    op.drop_table('conversation_thread')
    op.drop_table('context_blob')
    op.drop_table('api_token')
    op.drop_table('agent')


# Triggers: the database itself refuses to rewrite history, whatever code or person tries.
_SNAPSHOT_COLUMNS = ("agent_execution_snapshot", "context_pack_snapshot")

_SQLITE_TRIGGERS = {
    "run_event_no_update": "BEFORE UPDATE ON run_event BEGIN "
    "SELECT RAISE(ABORT, 'run_event is append-only: UPDATE refused'); END",
    "run_event_no_delete": "BEFORE DELETE ON run_event BEGIN "
    "SELECT RAISE(ABORT, 'run_event is append-only: DELETE refused'); END",
    "agent_run_snapshots_frozen": "BEFORE UPDATE OF agent_execution_snapshot, context_pack_snapshot "
    "ON agent_run WHEN NEW.agent_execution_snapshot IS NOT OLD.agent_execution_snapshot "
    "OR NEW.context_pack_snapshot IS NOT OLD.context_pack_snapshot BEGIN "
    "SELECT RAISE(ABORT, 'run snapshots are immutable'); END",
    "agent_version_no_update": "BEFORE UPDATE ON agent_version BEGIN "
    "SELECT RAISE(ABORT, 'agent versions are immutable'); END",
    "agent_version_no_delete": "BEFORE DELETE ON agent_version BEGIN "
    "SELECT RAISE(ABORT, 'agent versions are immutable'); END",
}

_PG_FUNCTIONS = """
CREATE OR REPLACE FUNCTION agentledger_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION '% on % refused: %', TG_OP, TG_TABLE_NAME, TG_ARGV[0]
    USING ERRCODE = 'insufficient_privilege';
END $$;
"""

_PG_TRIGGERS = {  # name: (table, definition)
    "run_event_append_only": ("run_event", "BEFORE UPDATE OR DELETE ON run_event FOR EACH ROW "
    "EXECUTE FUNCTION agentledger_refuse('run_event is append-only')"),
    "agent_run_snapshots_frozen": ("agent_run", "BEFORE UPDATE ON agent_run FOR EACH ROW WHEN ("
    "NEW.agent_execution_snapshot IS DISTINCT FROM OLD.agent_execution_snapshot OR "
    "NEW.context_pack_snapshot IS DISTINCT FROM OLD.context_pack_snapshot) "
    "EXECUTE FUNCTION agentledger_refuse('run snapshots are immutable')"),
    "agent_version_immutable": ("agent_version", "BEFORE UPDATE OR DELETE ON agent_version "
    "FOR EACH ROW EXECUTE FUNCTION agentledger_refuse('agent versions are immutable')"),
}


def _create_triggers() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_FUNCTIONS)
        for name, (_table, body) in _PG_TRIGGERS.items():
            op.execute(f"CREATE TRIGGER {name} {body}")
    else:
        for name, body in _SQLITE_TRIGGERS.items():
            op.execute(f"CREATE TRIGGER {name} {body}")


def _drop_triggers() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for name, (table, _body) in _PG_TRIGGERS.items():
            op.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
        op.execute("DROP FUNCTION IF EXISTS agentledger_refuse()")
    else:
        for name in _SQLITE_TRIGGERS:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
