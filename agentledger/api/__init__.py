"""The HTTP API (CONTRACT §5): a Flask blueprint whose routes are declared in ``routes_*``."""

from __future__ import annotations

from flask import Blueprint, Response

from agentledger.api.operations import ApiRegistry
from agentledger.web.principal import authenticate

blueprint = Blueprint("api", __name__, url_prefix="/api")
api = ApiRegistry(blueprint, authenticate)


@blueprint.after_request
def _no_content_has_no_type(response: Response) -> Response:
    # Flask types every response text/html; a 204 (a deleted session, a stream already at its
    # end) has no body to be of any type.
    if response.status_code == 204:
        response.headers.pop("Content-Type", None)
    return response


def load_routes() -> None:
    """Import the route modules (each registers itself on ``api`` when imported)."""
    from agentledger.api import (  # noqa: F401
        routes_admin,
        routes_agents,
        routes_dashboards,
        routes_executor,
        routes_memory,
        routes_meta,
        routes_otlp,
        routes_runs,
        routes_sessions,
    )


load_routes()
