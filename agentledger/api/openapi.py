"""The OpenAPI 3.1 document, generated from the route registry and its pydantic models."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from agentledger import __version__
from agentledger.api.operations import Operation
from agentledger.api.responses import ErrorResponse

ERROR_TEXT = {
    400: "Unreadable request (invalid_request, idempotency_key_required)",
    401: "No valid token (unauthenticated)",
    403: "Role not allowed (forbidden)",
    404: "No such object, or not yours (not_found)",
    409: "Conflict with the current state",
    413: "Body too large (payload_too_large)",
    415: "Content-Type not accepted (unsupported_media_type)",
    422: "Body fields invalid (validation_error, unknown_agent, not_an_assistant_message, "
         "framework_unavailable)",
    414: "Request URL too long (invalid_request)",
    429: "Too many requests (rate_limited)",
    431: "Request headers too large (invalid_request)",
    503: "The database could not be used (database_unavailable), or the read replica was lost "
         "during the read (replica_unavailable); retry after Retry-After",
}


def _models(operations: list[Operation]) -> list[tuple[type[BaseModel], JsonSchemaMode]]:
    seen: dict[type[BaseModel], JsonSchemaMode] = {ErrorResponse: "serialization"}
    for op in operations:
        if op.body is not None:
            seen[op.body] = "validation"
        for model in op.responses.values():
            if isinstance(model, type) and issubclass(model, BaseModel):
                seen.setdefault(model, "serialization")
    return list(seen.items())


def _query_parameters(model: type[BaseModel], defs: dict) -> list[dict[str, Any]]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    params = []
    for name, prop in schema.get("properties", {}).items():
        params.append({"name": name, "in": "query", "required": name in schema.get("required", []),
                       "schema": prop})
    for key, value in schema.get("$defs", {}).items():
        defs.setdefault(key, value)
    return params


def build_openapi(operations: list[Operation]) -> dict[str, Any]:
    mapping, top = models_json_schema(_models(operations), ref_template="#/components/schemas/{model}")
    components = dict(top.get("$defs", {}))
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        item: dict[str, Any] = {
            "summary": op.summary,
            "operationId": f"{op.method.lower()}_{op.openapi_path.strip('/').replace('/', '_').replace('{', '').replace('}', '')}",
            "tags": [op.tag],
            "responses": {},
        }
        params = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in _path_names(op.openapi_path)
        ]
        if op.query is not None:
            params += _query_parameters(op.query, components)
        for header, description in op.headers.items():
            params.append({"name": header, "in": "header", "required": False,
                           "description": description, "schema": {"type": "string"}})
        if params:
            item["parameters"] = params
        if op.roles is not None:
            item["security"] = [{"bearer": []}, {"cookie": []}]
            item["x-roles"] = list(op.roles)
        else:
            item["security"] = []
        if op.body is not None:
            item["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": mapping[(op.body, "validation")]}},
            }
        elif op.raw_body is not None:
            item["requestBody"] = {
                "required": True,
                "content": {kind: {"schema": schema} for kind, schema in op.raw_body.items()},
            }
        for status, model in op.responses.items():
            if model is None:
                item["responses"][str(status)] = {"description": "No content"}
                continue
            content = {"application/json": {"schema": mapping[(model, "serialization")]}}
            if op.extra_content and status in op.extra_content:
                content.update(op.extra_content[status])
            item["responses"][str(status)] = {"description": "Success", "content": content}
        error_ref = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
        codes = set(op.errors) | ({400, 413} if op.body or op.raw_body else set()) | (
            {400} if op.query else set())
        codes |= {414, 431}  # any request: over-long URL or headers (agentledger.web.request_limits)
        if op.roles is not None:
            codes |= {401, 403}
        if op.roles is not None or op.path == "/api/health":
            # These read the database (an authenticated request its token at least): 503 when
            # it cannot be used (agentledger.web.error_envelope), or when the read replica is
            # lost in the middle of a read (agentledger.core.database.ReplicaGate).
            codes.add(503)
        for status in sorted(codes):
            item["responses"][str(status)] = {"description": ERROR_TEXT[status], "content": error_ref}
        paths.setdefault(op.openapi_path, {})[op.method.lower()] = item
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "agentledger API",
            "version": __version__,
            "description": "Audit ledger for AI-agent runs. Errors are always "
            '{"error": {"code", "message"}}.',
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "cookie": {"type": "apiKey", "in": "cookie", "name": "agentledger_session"},
            },
        },
    }


def _path_names(path: str) -> list[str]:
    import re

    return re.findall(r"{([a-z_]+)}", path)
