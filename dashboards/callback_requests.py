"""What a Dash callback request (``POST /_dash-update-component``) must look like to be run.

Dash reads the body as its renderer writes it and fails on anything else with a ``KeyError`` or
``TypeError`` deep inside (a 500 and a logged traceback), or with werkzeug's HTML 400 when the
body is not JSON. ``check_callback_request`` runs first: the body must be a JSON object that names
the outputs of a registered callback and sends exactly the inputs and state that callback declares
(same ids, same properties, in order). Anything else raises ``InvalidRequest``, which the app's
error handler answers with the usual JSON envelope (400 ``invalid_request``); nothing is logged
as an error and no callback runs.

The values themselves are the callbacks' to read: any JSON may come (a tampered store, a
hand-made request), and each page's callback takes what it can use of it (``dashboards.params``)
and ignores the rest. Dash's own page router is the exception, checked here: it reads the
location as the browser has it, and fails inside Dash on anything else.
"""

from __future__ import annotations

import json
from typing import Any

from agentledger.core.errors import InvalidRequest

_WILDCARDS = (["MATCH"], ["ALL"], ["ALLSMALLER"])
_SHOWN = 120  # characters of a sent output id quoted back in a message
# The location component of Dash's page router (``dash.page_container``): a path from "/", and
# a query string (or nothing).
_ROUTER_LOCATION = "_pages_location"


def check_callback_request(body: Any, callback_map: dict[str, dict[str, Any]]) -> None:
    """Raise ``InvalidRequest`` unless ``body`` is a well-formed request for a callback in
    ``callback_map`` (Dash's own map: output id → the callback's declared dependencies)."""
    if not isinstance(body, dict):
        raise InvalidRequest("a callback request is a JSON object (Content-Type: application/json)")
    output = body.get("output")
    if not isinstance(output, str) or not output:
        raise InvalidRequest("'output' must name the outputs of a callback")
    declared = callback_map.get(output)
    if declared is None:
        raise InvalidRequest(f"no callback has the output {output[:_SHOWN]!r}")
    if "callback" not in declared:
        # A clientside callback: the browser runs it, the server has no function to call.
        raise InvalidRequest(f"the callback of {output[:_SHOWN]!r} runs in the browser")
    for key in ("inputs", "state"):
        _check_dependencies(key, body.get(key, []), declared[key])
    _check_location(body.get("inputs", []))
    if not declared.get("no_output"):
        _check_outputs(body.get("outputs"), declared["output"])
    changed = body.get("changedPropIds", [])
    if not isinstance(changed, list) or not all(isinstance(c, str) for c in changed):
        raise InvalidRequest("'changedPropIds' must be a list of strings")
    for prop_id in changed:
        _check_changed(prop_id)


def _check_location(inputs: list[Any]) -> None:
    for item in inputs:
        if not isinstance(item, dict) or item["id"] != _ROUTER_LOCATION:
            continue  # a list: the components of an ALL pattern
        value = item.get("value")
        if item["property"] == "pathname" and not (isinstance(value, str)
                                                   and value.startswith("/")):
            raise InvalidRequest("a page's path is a string that starts with '/'")
        if item["property"] == "search" and not (value is None or isinstance(value, str)):
            raise InvalidRequest("a page's query string is a string")


def _check_changed(prop_id: str) -> None:
    """``<component id>.<property>``, a pattern id as its JSON object: what Dash's callback
    context parses (``ctx.triggered_id``), where anything else fails inside the callback."""
    component, _, prop = prop_id.rpartition(".")
    if not component or not prop:
        raise InvalidRequest("'changedPropIds' entries are <component id>.<property>")
    if component.startswith("{"):
        try:
            parsed = json.loads(component)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise InvalidRequest("'changedPropIds' names a pattern id that is not a JSON object")


def _check_dependencies(key: str, sent: Any, declared: list[dict[str, Any]]) -> None:
    if not isinstance(sent, list) or len(sent) != len(declared):
        raise InvalidRequest(f"'{key}' must list the callback's {len(declared)} {key} in order")
    for item, dependency in zip(sent, declared, strict=True):
        if not _matches(item, dependency["id"], dependency["property"]):
            raise InvalidRequest(f"'{key}' does not match the callback's {key}")


def _check_outputs(sent: Any, declared: Any) -> None:
    """Dash's renderer sends a list for a callback declared with several outputs, else one."""
    if isinstance(declared, list):
        if not isinstance(sent, list) or len(sent) != len(declared):
            raise InvalidRequest(f"'outputs' must list the callback's {len(declared)} outputs")
        pairs = list(zip(sent, declared, strict=True))
    else:
        pairs = [(sent, declared)]
    for item, output in pairs:
        if not _matches(item, output.component_id_str(), output.component_property):
            raise InvalidRequest("'outputs' does not match the callback's outputs")


def _matches(item: Any, declared_id: str, declared_property: str) -> bool:
    """One sent dependency (``{"id", "property", "value"?}``) against a declared one. A pattern
    id (``{"type": …, "index": ["ALL"]}`` as JSON) takes the matching components: one object for
    MATCH, a list of them for ALL and ALLSMALLER."""
    if not declared_id.startswith("{"):
        return _is_dependency(item, declared_property) and item["id"] == declared_id
    pattern = json.loads(declared_id)
    several = any(v in (["ALL"], ["ALLSMALLER"]) for v in pattern.values())
    if several != isinstance(item, list):
        return False
    items = item if several else [item]
    return all(
        _is_dependency(i, declared_property) and isinstance(i["id"], dict)
        and set(i["id"]) == set(pattern)
        and all(v in _WILDCARDS or i["id"][k] == v for k, v in pattern.items())
        for i in items
    )


def _is_dependency(item: Any, declared_property: str) -> bool:
    # Dash appends "@<hash>" to the property of an output that several callbacks may set.
    return (isinstance(item, dict) and isinstance(item.get("id"), str | dict)
            and isinstance(item.get("property"), str)
            and item["property"].split("@")[0] == declared_property.split("@")[0])
