"""the database holds the state machine's ground: seven statuses, and no move without an event

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

``agent_run.status`` may hold only the seven statuses of the state machine, and an ``UPDATE``
that changes ``status`` must advance ``last_event_seq`` in the same statement: every transition
appends its event, so a run moved without one (by any code path, or by hand-written SQL) is
refused by the database itself.

PostgreSQL: a CHECK constraint and a trigger. SQLite cannot add a CHECK constraint without
rebuilding the table (which would drop its other triggers), so there the same rule is two
triggers (insert and update) beside the event-advance trigger.
"""
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

# Spelled out here, not imported: a migration is a frozen snapshot of the schema it makes.
_STATUSES = "('queued', 'running', 'cancelling', 'succeeded', 'failed', 'cancelled', 'interrupted')"
_ADVANCE = 'a status change must append its event (advance last_event_seq)'
_UNKNOWN = 'status must be one of the seven run statuses'


def upgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        op.execute(f'ALTER TABLE agent_run ADD CONSTRAINT ck_agent_run_status '
                   f'CHECK (status IN {_STATUSES})')
        op.execute(
            'CREATE TRIGGER agent_run_status_advances BEFORE UPDATE OF status ON agent_run '
            'FOR EACH ROW WHEN (NEW.status IS DISTINCT FROM OLD.status '
            'AND NEW.last_event_seq <= OLD.last_event_seq) '
            f"EXECUTE FUNCTION agentledger_refuse('{_ADVANCE}')")
        return
    for verb, when in (('INSERT', f'NEW.status NOT IN {_STATUSES}'),
                       ('UPDATE OF status', f'NEW.status NOT IN {_STATUSES}')):
        name = 'agent_run_status_known_' + verb.split()[0].lower()
        op.execute(f"CREATE TRIGGER {name} BEFORE {verb} ON agent_run WHEN {when} BEGIN "
                   f"SELECT RAISE(ABORT, '{_UNKNOWN}'); END")
    op.execute('CREATE TRIGGER agent_run_status_advances BEFORE UPDATE OF status ON agent_run '
               'WHEN NEW.status IS NOT OLD.status AND NEW.last_event_seq <= OLD.last_event_seq '
               f"BEGIN SELECT RAISE(ABORT, '{_ADVANCE}'); END")


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        op.execute('DROP TRIGGER IF EXISTS agent_run_status_advances ON agent_run')
        op.execute('ALTER TABLE agent_run DROP CONSTRAINT IF EXISTS ck_agent_run_status')
        return
    for name in ('agent_run_status_known_insert', 'agent_run_status_known_update',
                 'agent_run_status_advances'):
        op.execute(f'DROP TRIGGER IF EXISTS {name}')
