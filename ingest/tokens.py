"""API tokens. Only a sha256 of each token is stored; the token is shown once, at creation."""

from __future__ import annotations

import secrets

from sqlalchemy import insert, update
from sqlalchemy.orm import Session

from agentledger import dialect
from agentledger.errors import NotFound, ValidationFailed
from agentledger.hashing import sha256_hex
from agentledger.ids import new_id
from agentledger.schema import ApiToken

ROLES = ("user", "viewer", "executor", "admin")
TOKEN_PREFIX = "al_"


def token_hash(token: str) -> str:
    return sha256_hex("api-token\n" + token)


def create_token(session: Session, *, owner_id: str, role: str) -> tuple[str, str]:
    """Returns (token id, the token itself)."""
    if role not in ROLES:
        raise ValidationFailed(f"role must be one of {', '.join(ROLES)}")
    owner_id = owner_id.strip()
    if not owner_id or len(owner_id) > 200:
        raise ValidationFailed("owner must be 1 to 200 characters")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token_id = new_id("tok")
    session.execute(
        insert(ApiToken).values(
            id=token_id,
            token_hash=token_hash(token),
            owner_id=owner_id,
            role=role,
            created_at=dialect.now(session),
        )
    )
    return token_id, token


def revoke_token(session: Session, token_id: str) -> None:
    done = session.execute(
        update(ApiToken)
        .where(ApiToken.id == token_id, ApiToken.revoked_at.is_(None))
        .values(revoked_at=dialect.now(session))
    )
    if done.rowcount != 1:
        raise NotFound(f"no active token {token_id}")
