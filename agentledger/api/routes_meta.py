"""Health and the OpenAPI document (no authentication)."""

from __future__ import annotations

from flask import jsonify
from sqlalchemy import text

from agentledger.api import api
from agentledger.api.request_scope import state
from agentledger.api.responses import Health


@api.route("/health", "GET", summary="Liveness and database kind", roles=None,
           responses={200: Health}, tag="meta")
def health():
    with state().db.read() as s:
        s.execute(text("SELECT 1"))
    return jsonify({"status": "ok", "database": state().db.dialect})


@api.route("/openapi.json", "GET", summary="This OpenAPI 3 document", roles=None,
           responses={200: None}, tag="meta")
def openapi_document():
    from agentledger.api.openapi import build_openapi

    return jsonify(build_openapi(api.operations))
