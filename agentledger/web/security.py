"""Browser-facing protections: CSRF for cookie sessions, security headers, Content-Security-Policy.

CSRF uses the double-submit pattern Dash already speaks: at login the server keeps a random
token in the signed session and sets it in the readable ``_csrf_token`` cookie; Dash's renderer
sends that cookie back as ``X-CSRFToken`` on every callback. Any unsafe request (POST, PUT, PATCH,
DELETE) authenticated by the session cookie alone must carry the matching header; bearer-token
requests (scripts, executors) are not exposed to CSRF and need none.
"""

from __future__ import annotations

import hmac
import secrets

from flask import Flask, Response, current_app, request, session

from agentledger.web.error_envelope import error_response
from agentledger.web.principal import SESSION_TOKEN_KEY

CSRF_SESSION_KEY = "csrf"
CSRF_COOKIE = "_csrf_token"
CSRF_HEADER = "X-CSRFToken"
UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
EXEMPT_PATHS = ("/login",)


def issue_csrf_token(response: Response) -> None:
    """Called at login: a fresh token in the session and in the readable cookie."""
    token = secrets.token_urlsafe(32)
    session[CSRF_SESSION_KEY] = token
    response.set_cookie(CSRF_COOKIE, token, samesite="Lax", httponly=False, path="/",
                        secure=bool(current_app.config.get("SESSION_COOKIE_SECURE")) or request.is_secure)


def _csrf_guard() -> Response | None:
    if request.method not in UNSAFE or request.path in EXEMPT_PATHS:
        return None
    if request.headers.get("Authorization") or not session.get(SESSION_TOKEN_KEY):
        return None  # bearer-token or anonymous requests: authentication decides
    expected = session.get(CSRF_SESSION_KEY, "")
    sent = request.headers.get(CSRF_HEADER, "")
    if not expected or not sent or not hmac.compare_digest(expected, sent):
        return error_response(403, "forbidden",
                              "cookie-authenticated requests must send the X-CSRFToken header")
    return None


def _content_security_policy(app: Flask) -> str:
    dash_app = app.extensions.get("agentledger_dash")
    # Dash returns them quoted already ("'sha256-…'").
    hashes = " ".join(dash_app.csp_hashes()) if dash_app else ""
    return "; ".join([
        "default-src 'self'",
        # Dash's inline bootstrap scripts are allowed by their hashes; nothing else inline.
        f"script-src 'self' {hashes}".strip(),
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ])


def install_security(app: Flask) -> None:
    """Register the CSRF check (first of all before-request hooks) and the response headers."""
    app.before_request_funcs.setdefault(None, []).insert(0, _csrf_guard)
    policy: list[str] = []

    @app.after_request
    def _headers(response: Response) -> Response:
        if not policy:
            policy.append(_content_security_policy(app))
        response.headers.setdefault("Content-Security-Policy", policy[0])
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        response.headers.setdefault("X-Frame-Options", "DENY")
        return response
