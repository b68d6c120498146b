"""Declaring routes once: path, roles, request models and responses.

Each ``@api.route`` both registers the Flask view (with authentication, role check and request
validation done before the view runs) and records an ``Operation`` from which
``/api/openapi.json`` is generated.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flask import Blueprint, g, request
from pydantic import BaseModel, ValidationError

from agentledger.core.errors import Forbidden, InvalidRequest, NotFound, ValidationFailed
from agentledger.core.hashing import is_storable_text
from agentledger.core.json_limits import parse_json_body
from agentledger.core.vocabulary import READER_ROLES, WRITER_ROLES

READERS = READER_ROLES
WRITERS = WRITER_ROLES


@dataclass
class Operation:
    method: str
    path: str
    summary: str
    roles: tuple[str, ...] | None  # None: no authentication
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    responses: dict[int, Any] = field(default_factory=dict)
    errors: tuple[int, ...] = ()
    tag: str = "api"
    extra_content: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # A body the view reads itself (not JSON for a pydantic model): media type -> OpenAPI schema.
    raw_body: dict[str, Any] | None = None
    # The largest body accepted, when it is not the app's (``Settings.max_body_bytes``).
    max_body: int | None = None

    @property
    def openapi_path(self) -> str:
        return re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", self.path)


def _pydantic_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "is not an accepted field"
        elif err["type"] in ("too_long", "too_short") and isinstance(err.get("input"), str):
            # A text field's limit applied after its own validator reads, in pydantic's words,
            # "Value should have at most 500 items after validation".
            bound = err.get("ctx", {}).get("max_length" if err["type"] == "too_long"
                                           else "min_length")
            msg = (f"should have at {'most' if err['type'] == 'too_long' else 'least'} {bound} "
                   f"characters, not {len(err['input'])}")
        parts.append(f"{where}: {msg}")
    return "; ".join(parts)


def read_json_body() -> Any:
    raw = request.get_data(cache=True)
    if not raw.strip():
        raise InvalidRequest("the request needs a JSON body")
    return parse_json_body(raw)


def parse_body(model: type[BaseModel]) -> tuple[BaseModel, dict]:
    payload = read_json_body()
    if not isinstance(payload, dict):
        raise InvalidRequest("the body must be a JSON object")
    try:
        return model.model_validate(payload), payload
    except ValidationError as exc:
        raise ValidationFailed(_pydantic_message(exc)) from exc


def parse_query(model: type[BaseModel]) -> BaseModel:
    for name, value in request.args.items(multi=True):
        if not is_storable_text(name) or not is_storable_text(value):
            raise InvalidRequest(f"query parameter {name!r} contains characters that are not allowed")
    # A parameter the route does not take, or one given twice, is refused rather than ignored:
    # a filter misspelt or sent to the wrong list would otherwise answer with everything.
    for name in request.args:
        if name not in model.model_fields:
            raise InvalidRequest(f"query parameter {name!r} is not one this route takes "
                                 f"(it takes: {', '.join(model.model_fields)})")
        if len(values := request.args.getlist(name)) > 1:
            raise InvalidRequest(f"query parameter {name!r} is given {len(values)} times; "
                                 "give it once")
    try:
        return model.model_validate(request.args.to_dict())
    except ValidationError as exc:
        raise InvalidRequest("query: " + _pydantic_message(exc)) from exc


class ApiRegistry:
    def __init__(self, blueprint: Blueprint, authenticate: Callable[[], Any]):
        self.blueprint = blueprint
        self.authenticate = authenticate
        self.operations: list[Operation] = []

    def route(self, path: str, method: str, *, summary: str, roles=READERS, body=None,
              query=None, responses=None, errors=(), tag="api", extra_content=None,
              headers=None, raw_body=None, max_body=None):
        if body is not None and raw_body is not None:
            raise ValueError("a route has either a pydantic body or a raw body")
        op = Operation(method.upper(), "/api" + path, summary, tuple(roles) if roles else None,
                       body, query, responses or {}, tuple(errors), tag, extra_content,
                       headers or {}, raw_body, max_body)
        self.operations.append(op)

        def decorate(view: Callable) -> Callable:
            def endpoint(**path_args):
                if op.roles is not None:
                    principal = self.authenticate()
                    if principal.role not in op.roles:
                        raise Forbidden(f"the {principal.role} role may not use {op.method} {op.path}")
                    g.principal = principal
                for value in path_args.values():
                    if not is_storable_text(value):
                        raise NotFound("no such object")
                kwargs = dict(path_args)
                if op.query is not None:
                    kwargs["query"] = parse_query(op.query)
                if op.body is not None:
                    if op.max_body is not None:
                        request.max_content_length = op.max_body
                    kwargs["body"], kwargs["raw_body"] = parse_body(op.body)
                return view(**kwargs)

            endpoint.__name__ = view.__name__
            self.blueprint.add_url_rule(path, endpoint=view.__name__, view_func=endpoint,
                                        methods=[op.method])
            return view

        return decorate
