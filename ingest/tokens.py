"""API tokens. Only a sha256 of each token is stored; the token is shown once, at creation."""

from __future__ import annotations

import secrets
from typing import cast

from sqlalchemy import insert, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from agentledger.core import dialect
from agentledger.core.errors import NotFound, ValidationFailed
from agentledger.core.hashing import token_hash
from agentledger.core.ids import new_id
from agentledger.core.schema import ApiToken
from agentledger.core.vocabulary import ROLES

TOKEN_PREFIX = "al_"


def create_token(session: Session, *, owner_id: str, role: str) -> tuple[str, str]:
    """Returns (token id, the token itself)."""
    if role not in ROLES:
        raise ValidationFailed(f"role must be one of {', '.join(ROLES)}")
    owner_id = owner_id.strip()
    # Printable: an owner id is shown in lists and logs, and filtered on exactly (a newline or
    # a control character in it would read as something else there).
    if not owner_id or len(owner_id) > 200 or not owner_id.isprintable():
        raise ValidationFailed("owner must be 1 to 200 printable characters")
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
    if cast(CursorResult, done).rowcount != 1:
        raise NotFound(f"no active token {token_id}")
