"""Who is calling: a bearer token, or the login cookie set by ``/login`` for browsers."""

from __future__ import annotations

from flask import g, request, session

from agentledger.core.errors import Unauthenticated
from agentledger.core.hashing import token_hash
from agentledger.web.app_state import state
from queries.principals import Principal, principal_from_row, principal_lookup

SESSION_TOKEN_KEY = "token_id"


def _principal(**key: str) -> Principal | None:
    return principal_from_row(state().db.read_row(*principal_lookup(**key)))


def principal_from_token(token: str) -> Principal | None:
    return _principal(token_hash=token_hash(token))


def current_principal() -> Principal | None:
    """The caller, or None when the request carries no valid credentials."""
    if "principal" in g:
        return g.principal
    found = None
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            found = principal_from_token(token.strip())
    elif session.get(SESSION_TOKEN_KEY):
        found = _principal(token_id=session[SESSION_TOKEN_KEY])
    if found is not None:
        g.principal = found
        if found.role == "executor":
            # An executor follows runs it drives (its children, its cancels): the primary.
            state().db.pin_primary()
    return found


def authenticate() -> Principal:
    found = current_principal()
    if found is None:
        if request.headers.get("Authorization"):
            raise Unauthenticated("the token is not valid (unknown or revoked)")
        raise Unauthenticated("send Authorization: Bearer <token>, or log in at /login")
    return found
