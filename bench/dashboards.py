"""Each dashboard page: server time of the Dash callbacks a first page load sends.

A browser opening a page loads the shell (``/_dash-layout``), then its ``dcc.Location`` sets the
path, which fires Dash's page router (``_pages_content.children``); the page's layout arrives and
every callback whose inputs are all in it (and that is not ``prevent_initial_call``) fires, in
dependency order (a callback whose input is another pending callback's output waits for it).
This module replays exactly that over HTTP with a viewer's login cookie, from the app's own
callback map (``/_dash-dependencies``), and times each POST to ``/_dash-update-component``.
A page's time is the sum of its router and initial callbacks (sequential: the browser runs
independent ones in parallel, so this is an upper bound of the server time).
"""

from __future__ import annotations

import time
from typing import Any

import requests

from bench.common import Row, Sizes, log, percentile

TARGET_MS = 300.0


def _outputs(spec: str) -> list[tuple[str, str]]:
    if spec.startswith(".."):
        parts = spec.strip(".").split("...")
    else:
        parts = [spec]
    return [tuple(p.rsplit(".", 1)) for p in parts]  # type: ignore[misc]


def _walk(node: Any, found: dict[str, dict]) -> None:
    """Every component with an id in a serialised layout: id → its props (live dict)."""
    if isinstance(node, list):
        for item in node:
            _walk(item, found)
    elif isinstance(node, dict):
        props = node.get("props")
        if isinstance(props, dict) and "type" in node:
            if isinstance(props.get("id"), str):
                found[props["id"]] = props
                props.setdefault("__type", node["type"])
            for value in props.values():
                if isinstance(value, (list, dict)):
                    _walk(value, found)


def _payload(dep: dict, props: dict[str, dict], changed: list[str]) -> dict:
    outputs = [{"id": i, "property": p} for i, p in _outputs(dep["output"])]
    return {
        "output": dep["output"],
        "outputs": outputs if len(outputs) > 1 else outputs[0],
        "inputs": [{"id": x["id"], "property": x["property"],
                    "value": props.get(x["id"], {}).get(x["property"])} for x in dep["inputs"]],
        "state": [{"id": x["id"], "property": x["property"],
                   "value": props.get(x["id"], {}).get(x["property"])} for x in dep["state"]],
        "changedPropIds": changed,
    }


def _post(http: requests.Session, base: str, body: dict) -> tuple[float, dict | None]:
    start = time.perf_counter()
    reply = http.post(f"{base}/_dash-update-component", json=body)
    elapsed = time.perf_counter() - start
    if reply.status_code == 204:
        return elapsed, None
    if reply.status_code != 200:
        raise RuntimeError(f"callback {body['output'][:60]}: {reply.status_code} {reply.text[:300]}")
    return elapsed, reply.json().get("response", {})


def load_page(http: requests.Session, base: str, deps: list[dict], path: str) -> dict[str, Any]:
    """One first load of ``path``: the callbacks sent and their times (seconds)."""
    shell = http.get(f"{base}/_dash-layout").json()
    props: dict[str, dict] = {}
    _walk(shell, props)
    props.setdefault("_pages_location", {}).update(pathname=path, search="", href=base + path)
    router = next(d for d in deps if d["output"].startswith(".._pages_content.children"))
    elapsed, response = _post(http, base, _payload(
        router, props, ["_pages_location.pathname", "_pages_location.search"]))
    times = [("router", elapsed)]
    page: dict[str, dict] = {}
    _walk((response or {}).get("_pages_content", {}).get("children"), page)
    for component in page.values():
        if component.get("__type") == "Location":
            component.update(pathname=path, search="", href=base + path, hash="")
    props.update(page)
    pending = [d for d in deps
               if not d.get("prevent_initial_call") and not d.get("clientside_function")
               and d is not router and all(x["id"] in page for x in d["inputs"])]
    while pending:
        waiting = {(i, p) for d in pending for i, p in _outputs(d["output"])}
        ready = [d for d in pending
                 if not any((x["id"], x["property"]) in waiting for x in d["inputs"])] or pending[:1]
        for dep in ready:
            pending.remove(dep)
            elapsed, response = _post(http, base, _payload(dep, props, []))
            times.append((dep["output"].strip(".").split(".")[0], elapsed))
            for cid, values in (response or {}).items():
                props.setdefault(cid, {}).update(values)
    return {"callbacks": len(times), "seconds": sum(t for _, t in times),
            "slowest": max(times, key=lambda t: t[1])}


def measure(base_url: str, viewer_token: str, pages: dict[str, str], sizes: Sizes) -> list[Row]:
    http = requests.Session()
    reply = http.get(f"{base_url}/login?token={viewer_token}", allow_redirects=False)
    if reply.status_code not in (302, 303):
        raise RuntimeError(f"login failed: {reply.status_code}")
    # Dash's renderer sends the readable CSRF cookie back as a header on every callback.
    csrf = http.cookies.get("_csrf_token")
    if csrf:
        http.headers["X-CSRFToken"] = csrf
    deps = http.get(f"{base_url}/_dash-dependencies").json()
    rows = []
    for label, path in pages.items():
        log(f"dashboard {path} ×{sizes.dashboard_loads}")
        loads = [load_page(http, base_url, deps, path) for _ in range(sizes.dashboard_loads + 1)][1:]
        total = percentile([x["seconds"] for x in loads], 0.5) * 1000
        slowest = max(loads, key=lambda x: x["slowest"][1])["slowest"]
        rows.append(Row(
            "dashboards", f"page {label}: initial callbacks", "ms",
            round(total, 1), None, None,
            {"callbacks": loads[0]["callbacks"], "loads": len(loads),
             "max_ms": round(max(x["seconds"] for x in loads) * 1000, 1),
             "slowest_callback": [slowest[0], round(slowest[1] * 1000, 1)]},
            f"≤ {TARGET_MS:.0f} ms", "pass" if total <= TARGET_MS else "miss",
            f"{loads[0]['callbacks']} callbacks (router included), median of {len(loads)} "
            f"first loads; slowest: {slowest[0]} {slowest[1] * 1000:.0f} ms"))
    return rows


def page_paths(message_id: str, run_id: str) -> dict[str, str]:
    """Page (as the table names it) → the path loaded."""
    return {"/": "/", "/messages": "/messages", "/messages/<message_id>": f"/messages/{message_id}",
            "/runs": "/runs", "/runs/<run_id>": f"/runs/{run_id}", "/timeline": "/timeline",
            "/interrupted": "/interrupted", "/leases": "/leases", "/agents": "/agents",
            "/audit": "/audit"}

