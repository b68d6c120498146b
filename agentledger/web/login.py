"""Browser login: ``/login`` (a form for a token, or ``?token=…``) sets the session cookie."""

from __future__ import annotations

from html import escape
from urllib.parse import urlparse

from flask import Blueprint, Response, redirect, request, session

from agentledger.web.principal import SESSION_TOKEN_KEY, principal_from_token
from agentledger.web.security import issue_csrf_token

web_auth = Blueprint("web_auth", __name__)

_FORM = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>agentledger login</title>
<style>body{{font-family:system-ui,sans-serif;max-width:28rem;margin:4rem auto;padding:0 1rem}}
input{{width:100%;padding:.5rem;margin:.5rem 0;box-sizing:border-box}}.err{{color:#b00020}}</style>
</head><body><h1>agentledger</h1><p>Paste an API token (role viewer or admin for the dashboards).</p>
{error}<form method="post" action="/login"><input type="hidden" name="next" value="{next}">
<input type="password" name="token" placeholder="al_…" autofocus aria-label="API token">
<button type="submit">Log in</button></form></body></html>"""


def _safe_next(target: str | None) -> str:
    # Only same-site relative paths: never an open redirect to another host.
    if not target or not target.startswith("/") or target.startswith("//"):
        return "/"
    parsed = urlparse(target)
    return target if not parsed.netloc and not parsed.scheme else "/"


def _form(error: str = "", status: int = 200, next_url: str = "/") -> Response:
    body = _FORM.format(error=f'<p class="err">{escape(error)}</p>' if error else "",
                        next=escape(next_url))
    return Response(body, status=status, mimetype="text/html")


def _login(token: str, next_url: str):
    principal = principal_from_token(token.strip())
    if principal is None:
        return _form("That token is not valid.", 401, next_url)
    session.clear()
    session[SESSION_TOKEN_KEY] = principal.token_id
    session.permanent = True
    response = redirect(next_url, code=303)
    issue_csrf_token(response)
    return response


@web_auth.get("/login")
def login_page():
    next_url = _safe_next(request.args.get("next"))
    token = request.args.get("token")
    if token:
        return _login(token, next_url)
    return _form(next_url=next_url)


@web_auth.post("/login")
def login_submit():
    next_url = _safe_next(request.form.get("next"))
    return _login(request.form.get("token", ""), next_url)


@web_auth.route("/logout", methods=["GET", "POST"])
def logout():
    session.clear()
    return redirect("/login", code=303)
