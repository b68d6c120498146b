"""Who may open the dashboards: a Flask ``before_request`` guard for every non-API path.

Pages and Dash's own endpoints (``/_dash-layout``, ``/_dash-dependencies``,
``/_dash-update-component``, component bundles, assets) need a login with role ``viewer`` or
``admin``. A browser without a session is sent to ``/login?next=…``; a script (or a Dash callback)
without one gets ``401 unauthenticated``; any other role gets ``403 forbidden``. The API keeps its
own authentication, and ``/login`` / ``/logout`` stay open.
"""

from __future__ import annotations

from html import escape
from urllib.parse import quote

from flask import Response, current_app, redirect, request
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from agentledger.core.vocabulary import DASHBOARD_ROLES
from agentledger.web.error_envelope import error_response
from agentledger.web.principal import current_principal

_OPEN_PATHS = ("/login", "/logout")
# Paths whose view checks access itself (``/metrics``: a bearer token, or none when public).
_OWN_ACCESS_PATHS = ("/metrics",)

_FORBIDDEN_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>agentledger: forbidden</title><style>body{{font-family:system-ui,sans-serif;max-width:34rem;
margin:4rem auto;padding:0 1rem}}</style></head><body><h1>Forbidden</h1>
<p>You are logged in as <b>{owner}</b> with role <b>{role}</b>. The dashboards are for the roles
viewer and admin.</p><p><a href="/logout">Log out</a> and log in with another token.</p></body></html>"""


def _is_api(path: str) -> bool:
    return path == "/api" or path.startswith("/api/")


def _is_page_request() -> bool:
    """A browser navigating to a page (as opposed to Dash's XHRs, bundles and assets)."""
    path = request.path
    return (
        request.method in ("GET", "HEAD")
        and not path.startswith("/_")
        and not path.startswith("/assets/")
    )


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def api_methods(path: str) -> list[str]:
    """The methods the API itself serves on ``path`` (the dashboards' catch-all excluded)."""
    adapter = current_app.url_map.bind("")
    allowed = []
    for method in _METHODS:
        try:
            found, _ = adapter.match(path, method=method, return_rule=True)
        except HTTPException:
            continue
        if _is_api(found.rule):
            allowed.append(method)
    return allowed


def _api_routing() -> Response | None:
    """Keep the dashboards' catch-all route (``/<path:path>``, GET) out of the API's answers:
    an unknown API path is a JSON 404; a method the API does not serve on a real path is a JSON
    405 with the API's ``Allow`` (not the catch-all's GET), and ``OPTIONS`` answers 204 with
    that same ``Allow``."""
    rule = request.url_rule
    if rule is not None and _is_api(rule.rule) and request.method != "OPTIONS":
        return None
    if rule is None and not isinstance(request.routing_exception, MethodNotAllowed):
        return None  # a plain 404 (or a redirect): the API's error handler answers it
    allowed = api_methods(request.path)
    if not allowed:
        return error_response(404, "not_found", f"no route {request.path}")
    allow = ", ".join([*allowed, "OPTIONS"])
    if request.method == "OPTIONS":
        return Response(status=204, headers={"Allow": allow})
    return error_response(405, "method_not_allowed",
                          f"{request.method} is not allowed on {request.path}", {"Allow": allow})


def guard() -> Response | None:
    path = request.path
    if _is_api(path):
        return _api_routing()
    if path in _OPEN_PATHS or path in _OWN_ACCESS_PATHS:
        return None
    principal = current_principal()
    if principal is None:
        if _is_page_request():
            target = request.full_path.rstrip("?") if request.query_string else path
            return redirect(f"/login?next={quote(target, safe='/')}", code=303)
        return error_response(401, "unauthenticated", "log in at /login to use the dashboards")
    if principal.role not in DASHBOARD_ROLES:
        if _is_page_request():
            body = _FORBIDDEN_PAGE.format(owner=escape(principal.owner_id),
                                          role=escape(principal.role))
            return Response(body, status=403, mimetype="text/html")
        return error_response(
            403, "forbidden", f"role {principal.role} cannot use the dashboards (viewer or admin)"
        )
    return None
