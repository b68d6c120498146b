"""Who is calling? The owner and role behind an API token's hash."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from agentledger.schema import ApiToken


@dataclass(frozen=True)
class Principal:
    token_id: str
    owner_id: str
    role: str

    @property
    def sees_everything(self) -> bool:
        return self.role in ("viewer", "admin")


def principal_for(session: Session, *, token_hash: str | None = None, token_id: str | None = None):
    """The live (not revoked) token's principal, or None."""
    stmt = select(ApiToken.id, ApiToken.owner_id, ApiToken.role).where(ApiToken.revoked_at.is_(None))
    if token_hash is not None:
        stmt = stmt.where(ApiToken.token_hash == token_hash)
    elif token_id is not None:
        stmt = stmt.where(ApiToken.id == token_id)
    else:
        return None
    row = session.execute(stmt).one_or_none()
    return Principal(row.id, row.owner_id, row.role) if row is not None else None
