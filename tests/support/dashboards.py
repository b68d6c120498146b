"""Shared pieces of the dashboard tests: an app with dashboards on a test database, logged-in
test clients per role, and a way to call a Dash callback over HTTP like the browser does."""

from __future__ import annotations

from typing import Any

from agentledger.core.config import Settings
from agentledger.core.database import Database
from ingest.tokens import create_token

ROLES = ("viewer", "admin", "user", "executor")


def make_app(db: Database):
    from agentledger.app_factory import create_app

    settings = Settings(database_url=db.url, secret_key="dashboard-tests-secret")
    return create_app(settings, database=db)


def tokens(db: Database) -> dict[str, str]:
    found = {}
    with db.write() as s:
        for role in ROLES:
            found[role] = create_token(s, owner_id=f"{role}-owner", role=role)[1]
    return found


def logged_in(app, token: str):
    client = app.test_client()
    reply = client.get(f"/login?token={token}")
    assert reply.status_code == 303, reply.data
    return client


def csrf_headers(client) -> dict[str, str]:
    """What Dash's renderer sends with every callback: the ``_csrf_token`` cookie as a header."""
    cookie = client.get_cookie("_csrf_token")
    return {"X-CSRFToken": cookie.value} if cookie is not None else {}


def dash_request(output: list[tuple[str, str]], inputs: list[tuple[str, str, Any]],
                 state: list[tuple[str, str, Any]] = (), changed: list[str] = ()) -> dict:
    """The body the Dash renderer POSTs to ``/_dash-update-component``."""
    outputs = [{"id": i, "property": p} for i, p in output]
    return {
        "output": ".." + "...".join(f"{i}.{p}" for i, p in output) + ".." if len(output) > 1
        else f"{output[0][0]}.{output[0][1]}",
        "outputs": outputs if len(outputs) > 1 else outputs[0],
        "inputs": [{"id": i, "property": p, "value": v} for i, p, v in inputs],
        "state": [{"id": i, "property": p, "value": v} for i, p, v in state],
        "changedPropIds": list(changed),
    }


def texts(component: Any) -> list[str]:
    """Every string in a serialised Dash component tree (what the page would show as text)."""
    found: list[str] = []
    if isinstance(component, str):
        found.append(component)
    elif isinstance(component, list):
        for item in component:
            found += texts(item)
    elif isinstance(component, dict):
        for key, value in component.items():
            if key in ("children", "props") or isinstance(value, (list, dict)):
                found += texts(value)
    return found


def call(client, output, inputs, state=(), changed=()) -> dict:
    """POST one callback like the browser does; returns ``{component id: {prop: value}}``."""
    reply = client.post("/_dash-update-component", headers=csrf_headers(client),
                        json=dash_request(output, inputs, state, changed))
    assert reply.status_code == 200, reply.data[:500]
    return reply.get_json()["response"]
