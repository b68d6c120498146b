"""agent_run.last_append_key_hash, last_append_checksum, last_append_first_seq

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07

An executor's append may carry an ``Idempotency-Key``; the run remembers its latest keyed
append (the key's hash, the request's checksum, the first seq it wrote), so that the same
append sent again after its answer was lost is answered, not written twice. Nullable columns
without a default: a plain ``ADD COLUMN``, no table rewrite on either database.
"""
from alembic import op

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None

_COLUMNS = (("last_append_key_hash", "VARCHAR(64)"), ("last_append_checksum", "VARCHAR(64)"),
            ("last_append_first_seq", "INTEGER"))


def upgrade() -> None:
    for name, kind in _COLUMNS:
        op.execute(f"ALTER TABLE agent_run ADD COLUMN {name} {kind}")


def downgrade() -> None:
    for name, _kind in reversed(_COLUMNS):
        op.execute(f"ALTER TABLE agent_run DROP COLUMN {name}")
