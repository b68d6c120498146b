"""outcome rollup shards, and an hourly rollup

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30

Run endings of one agent all upserted the same rollup row, so concurrent endings queued on its
row lock. The key gains a small ``shard`` (0-15, from the run id); readers sum over shards.
Existing rows become shard 0.

``agent_outcome_rollup_hour`` holds the same sums per UTC hour, for the partial days at a
window's edges (which were scanned run by run: up to a whole day of runs), and a partial index
finds the usage events of the runs still scanned without reading their other events.
``message.thread_id`` gets the index its foreign key needs when archiving deletes a child run's
thread (each deletion scanned the message table). ``agent_run.end_reason`` keeps an interrupted
run's reason on the run, so the interruption reads need not join each run to its last event.

Both are (re)built from the runs here when they are empty and ended runs exist (this backfill
was 0004's; it needs the final keys).
"""
import bisect
from datetime import UTC

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

KEY = ['agent_id', 'agent_version', 'day', 'status']
BUCKETS = 64  # agentledger.core.outcome_histogram.BUCKETS at the time of this migration
# agentledger.core.outcome_histogram's column names at the time of this migration
LATENCY_COLUMNS = tuple(f'latency_h{i:02d}' for i in range(BUCKETS))
WAIT_COLUMNS = tuple(f'wait_h{i:02d}' for i in range(BUCKETS))


def upgrade() -> None:
    with op.batch_alter_table('agent_outcome_rollup') as batch:
        batch.add_column(sa.Column('shard', sa.SmallInteger(), server_default=sa.text('0'),
                                   nullable=False))
        batch.drop_constraint('pk_agent_outcome_rollup', type_='primary')
        batch.create_primary_key('pk_agent_outcome_rollup', [*KEY, 'shard'])
    _create_hourly()
    op.create_index('ix_run_event_usage', 'run_event', ['run_id'],
                    sqlite_where=sa.text("type = 'usage'"),
                    postgresql_where=sa.text("type = 'usage'"))
    op.create_index(op.f('ix_message_thread_id'), 'message', ['thread_id'])
    _add_end_reason()
    _backfill()


def _create_hourly() -> None:
    histogram = [
        sa.Column(f'{prefix}_h{i:02d}', sa.Integer(), server_default=sa.text('0'), nullable=False)
        for prefix in ('latency', 'wait') for i in range(BUCKETS)
    ]
    op.create_table(
        'agent_outcome_rollup_hour',
        sa.Column('agent_id', sa.String(length=63), nullable=False),
        sa.Column('agent_version', sa.Integer(), nullable=False),
        sa.Column('hour', sa.DateTime(timezone=True), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('shard', sa.SmallInteger(), server_default=sa.text('0'), nullable=False),
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
        sa.PrimaryKeyConstraint('agent_id', 'agent_version', 'hour', 'status', 'shard',
                                name=op.f('pk_agent_outcome_rollup_hour')),
    )
    op.create_index(op.f('ix_agent_outcome_rollup_hour_hour'), 'agent_outcome_rollup_hour',
                    ['hour'])


def _add_end_reason() -> None:
    """``agent_run.end_reason``: an interrupted run's reason, copied from its last event."""
    op.add_column('agent_run', sa.Column('end_reason', sa.String(length=40), nullable=True))
    if op.get_bind().dialect.name == 'postgresql':
        op.execute(sa.text(
            "UPDATE agent_run SET end_reason = e.data ->> 'reason' FROM run_event e"
            " WHERE e.run_id = agent_run.id AND e.seq = agent_run.last_event_seq"
            " AND agent_run.status = 'interrupted'"))
    else:
        op.execute(sa.text(
            "UPDATE agent_run SET end_reason = (SELECT json_extract(e.data, '$.reason')"
            " FROM run_event e WHERE e.run_id = agent_run.id AND e.seq = agent_run.last_event_seq)"
            " WHERE status = 'interrupted'"))


def _backfill() -> None:
    """Sum the runs that ended before the rollup existed (a no-op on a new database).

    Frozen with this revision: raw SQL and a copy of the bucket rule as it was here, so later
    changes to the models or the write path never change what this upgrade does."""
    bind = op.get_bind()
    rolled_up = bind.execute(sa.text('SELECT count(*) FROM agent_outcome_rollup_hour')).scalar()
    ended = bind.execute(sa.text(f'SELECT count(*) FROM agent_run WHERE status IN {_ENDED}')).scalar()
    if not ended or rolled_up:
        return
    op.execute(sa.text('DELETE FROM agent_outcome_rollup'))
    runs = sa.table('agent_run', sa.column('id'), sa.column('agent_id'),
                    sa.column('agent_version'), sa.column('status'),
                    *(sa.column(c, sa.DateTime(timezone=True))
                      for c in ('created_at', 'started_at', 'finished_at')))
    events = sa.table('run_event', sa.column('run_id'), sa.column('seq'), sa.column('type'),
                      sa.column('data', sa.JSON()))
    days: dict[tuple, dict] = {}
    hours: dict[tuple, dict] = {}
    after = ''
    while True:
        chunk = bind.execute(
            sa.select(runs).where(runs.c.status.in_(_ENDED_LIST), runs.c.id > after)
            .order_by(runs.c.id).limit(5000)).all()
        if not chunk:
            break
        usage: dict[str, list] = {}
        for run_id, data in bind.execute(
            sa.select(events.c.run_id, events.c.data)
            .where(events.c.run_id.in_([r.id for r in chunk]), events.c.type == 'usage')):
            usage.setdefault(run_id, []).append(data if isinstance(data, dict) else {})
        for r in chunk:
            created = _utc(r.created_at)
            started = _utc(r.started_at) if r.started_at is not None else None
            finished = _utc(r.finished_at) if r.finished_at is not None else created
            for rows, period in ((days, created.date()),
                                 (hours, created.replace(minute=0, second=0, microsecond=0))):
                row = rows.setdefault((r.agent_id, r.agent_version, period, r.status), _new_row())
                _add(row, started, finished, created, usage.get(r.id, ()))
        after = chunk[-1].id
    _insert('agent_outcome_rollup', 'day', days, sa.Date())
    _insert('agent_outcome_rollup_hour', 'hour', hours, sa.DateTime(timezone=True))


_ENDED_LIST = ('succeeded', 'failed', 'cancelled', 'interrupted')
_ENDED = "('succeeded', 'failed', 'cancelled', 'interrupted')"
_SUMS = ('runs', 'latency_n', 'latency_sum', 'wait_n', 'wait_sum', 'input_tokens',
         'output_tokens', 'cost_usd')
# The histogram's bucket rule at this revision: bucket 0 below 10 ms, then edges growing by 2^(1/3).
_FIRST_EDGE, _RATIO = 0.01, 2 ** (1 / 3)
_EDGES = tuple(_FIRST_EDGE * _RATIO**i for i in range(BUCKETS - 1))


def _bucket(seconds: float) -> int:
    return bisect.bisect_right(_EDGES, seconds)


def _utc(moment):
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _new_row() -> dict:
    row: dict = dict.fromkeys(_SUMS, 0)
    row.update(latency_min=None, latency_max=None, wait_min=None, wait_max=None,
               latency_h={}, wait_h={})
    return row


def _add(row: dict, started, finished, created, usage) -> None:
    row['runs'] += 1
    for d in usage:
        row['input_tokens'] += int(d.get('input_tokens') or 0)
        row['output_tokens'] += int(d.get('output_tokens') or 0)
        row['cost_usd'] += float(d.get('cost_usd') or 0)
    if started is None:
        return
    for name, value in (('latency', (finished - started).total_seconds()),
                        ('wait', (started - created).total_seconds())):
        row[f'{name}_n'] += 1
        row[f'{name}_sum'] += value
        low, high = row[f'{name}_min'], row[f'{name}_max']
        row[f'{name}_min'] = value if low is None or value < low else low
        row[f'{name}_max'] = value if high is None or value > high else high
        histogram = row[f'{name}_h']
        histogram[_bucket(value)] = histogram.get(_bucket(value), 0) + 1


def _insert(table_name: str, period: str, rows: dict, period_type) -> None:
    if not rows:
        return
    buckets = [f'{p}_h{i:02d}' for p in ('latency', 'wait') for i in range(BUCKETS)]
    columns = ['agent_id', 'agent_version', period, 'status', 'shard', *_SUMS,
               'latency_min', 'latency_max', 'wait_min', 'wait_max', *buckets]
    table = sa.table(table_name, *(sa.column(c, period_type) if c == period else sa.column(c)
                                   for c in columns))
    values = []
    for (agent_id, version, when, status), row in sorted(rows.items()):
        if period == 'hour' and op.get_bind().dialect.name == 'sqlite':
            when = when.replace(tzinfo=None)  # naive UTC text, as the models store it
        item = {'agent_id': agent_id, 'agent_version': version, period: when, 'status': status,
                'shard': 0, **{c: row[c] for c in _SUMS}}
        item.update({c: row[c] for c in ('latency_min', 'latency_max', 'wait_min', 'wait_max')})
        for p in ('latency', 'wait'):
            item.update({f'{p}_h{i:02d}': row[f'{p}_h'].get(i, 0) for i in range(BUCKETS)})
        item['latency_sum'], item['wait_sum'] = float(item['latency_sum']), float(item['wait_sum'])
        item['cost_usd'] = float(item['cost_usd'])
        values.append(item)
    for i in range(0, len(values), 500):
        op.get_bind().execute(sa.insert(table), values[i:i + 500])


def downgrade() -> None:
    with op.batch_alter_table('agent_run') as batch:
        batch.drop_column('end_reason')
    op.drop_index(op.f('ix_message_thread_id'), table_name='message')
    op.drop_index('ix_run_event_usage', table_name='run_event')
    op.drop_index(op.f('ix_agent_outcome_rollup_hour_hour'), table_name='agent_outcome_rollup_hour')
    op.drop_table('agent_outcome_rollup_hour')
    # Fold the shards into one row per key first: no ended run may drop out of the counts.
    buckets = [f'{p}_h{i:02d}' for p in ('latency', 'wait') for i in range(BUCKETS)]
    sums = [*_SUMS, *buckets]
    lows, highs = ['latency_min', 'wait_min'], ['latency_max', 'wait_max']
    columns = [*KEY, *sums, *lows, *highs]
    merged = ', '.join([*KEY, *(f'sum({c}) AS {c}' for c in sums),
                        *(f'min({c}) AS {c}' for c in lows), *(f'max({c}) AS {c}' for c in highs)])
    op.execute(sa.text(f'CREATE TEMPORARY TABLE rollup_merged AS SELECT {merged} '
                       f'FROM agent_outcome_rollup GROUP BY {", ".join(KEY)}'))
    op.execute(sa.text('DELETE FROM agent_outcome_rollup'))
    with op.batch_alter_table('agent_outcome_rollup') as batch:
        batch.drop_constraint('pk_agent_outcome_rollup', type_='primary')
        batch.create_primary_key('pk_agent_outcome_rollup', KEY)
        batch.drop_column('shard')
    listed = ', '.join(columns)
    op.execute(sa.text(f'INSERT INTO agent_outcome_rollup ({listed}) '
                       f'SELECT {listed} FROM rollup_merged'))
    op.execute(sa.text('DROP TABLE rollup_merged'))
