"""agent_run usage totals, recorded when a run ends

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02

``usage_input_tokens``, ``usage_output_tokens`` and ``usage_cost_usd``: a run's tokens and cost
summed from its ``usage`` events, written by the transaction that appends its terminal event
(and by the bulk import). The per-agent outcome reads scan the runs of a window's partial
hours; with the totals on the row they read run rows alone instead of each run's events. The
columns start NULL for every existing run: the reads sum the events of a run whose totals were
never recorded, so nothing has to be rewritten. Three nullable ``ADD COLUMN``s: no table
rewrite on either database, and the triggers on ``agent_run`` stay as they are.
"""
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

COLUMNS = (("usage_input_tokens", "BIGINT"), ("usage_output_tokens", "BIGINT"),
           ("usage_cost_usd", "FLOAT"))


def upgrade() -> None:
    for name, kind in COLUMNS:
        op.execute(f"ALTER TABLE agent_run ADD COLUMN {name} {kind}")


def downgrade() -> None:
    for name, _kind in COLUMNS:
        op.execute(f"ALTER TABLE agent_run DROP COLUMN {name}")
