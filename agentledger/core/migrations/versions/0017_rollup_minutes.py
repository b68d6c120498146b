"""a minute outcome rollup for the last two days

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04

``agent_outcome_rollup_minute`` holds the outcome rollups' sums per UTC minute of creation, for
the partial hours at a window's edges, which were scanned run by run: a one-hour window
starting in a busy hour read every run of it (105,000 runs, 105-129 ms on the bench's data).
Minutes are kept for two days (``agentledger.core.rollup_periods``); the reconciler loop
deletes older ones.

Readers use it for windows starting within the last two days, so it is backfilled here from
the ended runs created in that span: their usage totals come from the run row, or from their
``usage`` events for a run that ended before those totals existed. Frozen with this revision:
raw SQL and a copy of the bucket rule, so later changes to the models or the write path never
change what this upgrade does. On the bench's 1.39M runs (≈ 90,000 of them in two days) the
upgrade took a few seconds.
"""
import bisect
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None

TABLE = 'agent_outcome_rollup_minute'
KEPT = timedelta(days=2)  # agentledger.core.rollup_periods.MINUTE_ROLLUP_KEPT at this revision
BUCKETS = 64  # agentledger.core.outcome_histogram at this revision: 10 ms, then 2^(1/3) apart
_EDGES = tuple(0.01 * (2 ** (1 / 3)) ** i for i in range(BUCKETS - 1))
_ENDED = ('succeeded', 'failed', 'cancelled', 'interrupted')
_SUMS = ('runs', 'latency_n', 'latency_sum', 'wait_n', 'wait_sum', 'input_tokens',
         'output_tokens', 'cost_usd', 'runs_without_cost')


def upgrade() -> None:
    histogram = [
        sa.Column(f'{prefix}_h{i:02d}', sa.Integer(), server_default=sa.text('0'), nullable=False)
        for prefix in ('latency', 'wait') for i in range(BUCKETS)
    ]
    op.create_table(
        TABLE,
        sa.Column('agent_id', sa.String(length=63), nullable=False),
        sa.Column('agent_version', sa.Integer(), nullable=False),
        sa.Column('minute', sa.DateTime(timezone=True), nullable=False),
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
        sa.Column('runs_without_cost', sa.BigInteger(), server_default=sa.text('0'),
                  nullable=False),
        *histogram,
        sa.PrimaryKeyConstraint('agent_id', 'agent_version', 'minute', 'status', 'shard',
                                name=op.f('pk_agent_outcome_rollup_minute')),
    )
    op.create_index(op.f('ix_agent_outcome_rollup_minute_minute'), TABLE, ['minute'])
    op.create_index('ix_agent_outcome_rollup_minute_unfolded', TABLE, ['minute'],
                    sqlite_where=sa.text('shard <> 0'), postgresql_where=sa.text('shard <> 0'))
    _backfill(datetime.now(UTC) - KEPT)


def _backfill(since: datetime) -> None:
    bind = op.get_bind()
    sqlite = bind.dialect.name == 'sqlite'
    runs = sa.table('agent_run', sa.column('id'), sa.column('agent_id'),
                    sa.column('agent_version'), sa.column('status'),
                    sa.column('usage_input_tokens'), sa.column('usage_output_tokens'),
                    sa.column('usage_cost_usd'),
                    *(sa.column(c, sa.DateTime(timezone=True))
                      for c in ('created_at', 'started_at', 'finished_at')))
    events = sa.table('run_event', sa.column('run_id'), sa.column('type'),
                      sa.column('data', sa.JSON()))
    # SQLite keeps these times as naive UTC text; PostgreSQL as timestamptz
    bound = since.replace(tzinfo=None) if sqlite else since
    rows: dict[tuple, dict] = {}
    after = ''
    while True:
        chunk = bind.execute(
            sa.select(runs).where(runs.c.status.in_(_ENDED), runs.c.created_at >= bound,
                                  runs.c.id > after)
            .order_by(runs.c.id).limit(5000)).all()
        if not chunk:
            break
        unrecorded = [r.id for r in chunk if r.usage_input_tokens is None]
        usage: dict[str, list] = {}
        if unrecorded:
            for run_id, data in bind.execute(
                    sa.select(events.c.run_id, events.c.data)
                    .where(events.c.run_id.in_(unrecorded), events.c.type == 'usage')):
                usage.setdefault(run_id, []).append(data if isinstance(data, dict) else {})
        for r in chunk:
            created = _utc(r.created_at)
            minute = created.replace(second=0, microsecond=0)
            row = rows.setdefault((r.agent_id, r.agent_version, minute, r.status), _new_row())
            _add(row, r, created, usage.get(r.id, ()))
        after = chunk[-1].id
    _insert(rows, sqlite)


def _utc(moment):
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _new_row() -> dict:
    row: dict = dict.fromkeys(_SUMS, 0)
    row.update(latency_min=None, latency_max=None, wait_min=None, wait_max=None,
               latency_h={}, wait_h={})
    return row


def _add(row: dict, r, created: datetime, usage) -> None:
    row['runs'] += 1
    if r.usage_input_tokens is not None:
        tokens_in, tokens_out, cost = r.usage_input_tokens, r.usage_output_tokens, r.usage_cost_usd
    else:
        tokens_in = sum(int(d.get('input_tokens') or 0) for d in usage)
        tokens_out = sum(int(d.get('output_tokens') or 0) for d in usage)
        costs = [d.get('cost_usd') for d in usage]
        cost = None if None in costs else sum(float(c) for c in costs)
    row['input_tokens'] += int(tokens_in or 0)
    row['output_tokens'] += int(tokens_out or 0)
    if cost is None:  # an unpriced call: the run's cost is unknown, not zero
        row['runs_without_cost'] += 1
    else:
        row['cost_usd'] += float(cost)
    if r.started_at is None:
        return
    started = _utc(r.started_at)
    finished = _utc(r.finished_at) if r.finished_at is not None else created
    for name, value in (('latency', (finished - started).total_seconds()),
                        ('wait', (started - created).total_seconds())):
        row[f'{name}_n'] += 1
        row[f'{name}_sum'] += value
        low, high = row[f'{name}_min'], row[f'{name}_max']
        row[f'{name}_min'] = value if low is None or value < low else low
        row[f'{name}_max'] = value if high is None or value > high else high
        bucket = bisect.bisect_right(_EDGES, value)
        row[f'{name}_h'][bucket] = row[f'{name}_h'].get(bucket, 0) + 1


def _insert(rows: dict, sqlite: bool) -> None:
    if not rows:
        return
    buckets = [f'{p}_h{i:02d}' for p in ('latency', 'wait') for i in range(BUCKETS)]
    columns = ['agent_id', 'agent_version', 'minute', 'status', 'shard', *_SUMS,
               'latency_min', 'latency_max', 'wait_min', 'wait_max', *buckets]
    table = sa.table(TABLE, *(sa.column(c, sa.DateTime(timezone=True)) if c == 'minute'
                              else sa.column(c) for c in columns))
    values = []
    for (agent_id, version, minute, status), row in sorted(rows.items()):
        item = {'agent_id': agent_id, 'agent_version': version, 'status': status, 'shard': 0,
                'minute': minute.replace(tzinfo=None) if sqlite else minute,
                **{c: row[c] for c in _SUMS}}
        item.update({c: row[c] for c in ('latency_min', 'latency_max', 'wait_min', 'wait_max')})
        for p in ('latency', 'wait'):
            item.update({f'{p}_h{i:02d}': row[f'{p}_h'].get(i, 0) for i in range(BUCKETS)})
        item['latency_sum'], item['wait_sum'] = float(item['latency_sum']), float(item['wait_sum'])
        item['cost_usd'] = float(item['cost_usd'])
        values.append(item)
    for i in range(0, len(values), 500):
        op.get_bind().execute(sa.insert(table), values[i:i + 500])


def downgrade() -> None:
    op.drop_index('ix_agent_outcome_rollup_minute_unfolded', table_name=TABLE)
    op.drop_index(op.f('ix_agent_outcome_rollup_minute_minute'), table_name=TABLE)
    op.drop_table(TABLE)
