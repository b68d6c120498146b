"""Who is calling? The owner and role behind an API token's hash."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import bindparam, select

from agentledger.core.schema import ApiToken


@dataclass(frozen=True)
class Principal:
    token_id: str
    owner_id: str
    role: str

    @property
    def sees_everything(self) -> bool:
        return self.role in ("viewer", "admin")


def principal_lookup(*, token_hash: str | None = None, token_id: str | None = None):
    """(statement, parameters) of the principal look-up, for ``Database.read_row``; it is one
    statement, so the API runs it without a transaction on every request."""
    if token_hash is not None:
        return _BY_HASH, {"value": token_hash}
    if token_id is not None:
        return _BY_ID, {"value": token_id}
    return None


def principal_from_row(row) -> Principal | None:
    return Principal(row.id, row.owner_id, row.role) if row is not None else None


# Built once: this runs on every authenticated request (revocation must take effect at once,
# so the answer itself is never cached).
_LIVE = select(ApiToken.id, ApiToken.owner_id, ApiToken.role).where(ApiToken.revoked_at.is_(None))
_BY_HASH = _LIVE.where(ApiToken.token_hash == bindparam("value"))
_BY_ID = _LIVE.where(ApiToken.id == bindparam("value"))
