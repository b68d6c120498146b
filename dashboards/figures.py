"""Pure figure builders: plain data (what ``queries`` returns) in, ``go.Figure`` out.

No database, no Dash, no request: each function can be called (and tested) with hand-made rows.
The run-tree builders return Cytoscape elements and a stylesheet, also plain data.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

import plotly.graph_objects as go

STATUS_COLORS = {
    "queued": "#adb5bd",
    "running": "#0d6efd",
    "cancelling": "#6f42c1",
    "succeeded": "#198754",
    "failed": "#dc3545",
    "cancelled": "#6c757d",
    "interrupted": "#fd7e14",
}
STATUS_ORDER = ("succeeded", "failed", "cancelled", "interrupted", "running", "cancelling", "queued")
REASON_COLORS = {
    "lease_expired": "#fd7e14",
    "parent_terminal": "#6f42c1",
    "service_restart": "#0dcaf0",
    "executor_shutdown": "#d63384",
}
QUEUED_PHASE = "#ced4da"
_LAYOUT = dict(
    template="plotly_white",
    margin=dict(l=10, r=10, t=30, b=10),
    legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0),
    font=dict(size=12),
)


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def empty_figure(message: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(**_LAYOUT, height=220,
                      xaxis=dict(visible=False), yaxis=dict(visible=False))
    fig.add_annotation(text=message, showarrow=False, font=dict(size=14, color="#6c757d"))
    return fig


def status_over_time(rows: list[dict[str, Any]], bucket_seconds: int) -> go.Figure:
    """Stacked bars: runs created per time bucket, split by their status now."""
    if not rows:
        return empty_figure("No runs were created in this window.")
    by_status: dict[str, dict[str, int]] = defaultdict(dict)
    for row in rows:
        by_status[row["status"]][row["bucket"]] = row["count"]
    fig = go.Figure()
    for status in STATUS_ORDER:
        if status not in by_status:
            continue
        points = sorted(by_status[status].items())
        fig.add_bar(
            name=status,
            x=[_time(b) for b, _ in points],
            y=[n for _, n in points],
            marker_color=STATUS_COLORS[status],
            offset=0,
            width=bucket_seconds * 1000 * 0.9,
            hovertemplate="%{x}<br>%{y} " + status + "<extra></extra>",
        )
    fig.update_layout(**_LAYOUT, barmode="stack", height=320, bargap=0.1,
                      yaxis_title="runs created", xaxis_title=None)
    return fig


def timeline(rows: list[dict[str, Any]], *, align: str = "start") -> go.Figure:
    """Gantt: one bar per run, a grey *queued* phase then a *running* phase coloured by how the
    run ended (blue while it still runs); runs that never started end with a cross.

    ``align="start"`` puts every run's creation at 0 (compare durations); ``"clock"`` uses wall
    clock time (see overlap and concurrency).
    """
    if not rows:
        return empty_figure("No runs match these filters in this window.")
    labels = [f"{r['agent_name'] or r['agent_id']} · {r['run_id'][-8:]}" for r in rows]
    relative = align == "start"

    def position(row: dict[str, Any], moment: str | None):
        if moment is None:
            return None
        if relative:
            return (_time(moment) - _time(row["created_at"])).total_seconds()
        return _time(moment)

    def length(start: str | None, end: str | None) -> float | None:
        if start is None or end is None:
            return None
        seconds = (_time(end) - _time(start)).total_seconds()
        return seconds if relative else seconds * 1000  # date axes measure bar lengths in ms

    fig = go.Figure()
    fig.add_bar(
        name="queued",
        y=labels,
        base=[position(r, r["created_at"]) for r in rows],
        x=[length(r["created_at"], r["queued_until"]) for r in rows],
        orientation="h",
        marker_color=QUEUED_PHASE,
        customdata=[[r["run_id"], r["status"], r["queued_seconds"]] for r in rows],
        hovertemplate="%{customdata[0]}<br>queued %{customdata[2]:.2f} s<extra></extra>",
    )
    ran_by_status: dict[str, list[int]] = defaultdict(list)
    never_started: dict[str, list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        if row["started_at"] is not None:
            ran_by_status[row["status"]].append(i)
        elif row["finished_at"] is not None:
            never_started[row["status"]].append(i)
    for status in STATUS_ORDER:
        picked = ran_by_status.get(status)
        if not picked:
            continue
        fig.add_bar(
            name=f"ran → {status}",
            y=[labels[i] for i in picked],
            base=[position(rows[i], rows[i]["started_at"]) for i in picked],
            x=[length(rows[i]["started_at"], rows[i]["running_until"]) for i in picked],
            orientation="h",
            marker_color=STATUS_COLORS[status],
            customdata=[[rows[i]["run_id"], status, rows[i]["running_seconds"]] for i in picked],
            hovertemplate="%{customdata[0]}<br>ran %{customdata[2]:.2f} s → %{customdata[1]}"
                          "<extra></extra>",
        )
    for status, picked in never_started.items():
        fig.add_scatter(
            name=f"{status} before start",
            y=[labels[i] for i in picked],
            x=[position(rows[i], rows[i]["finished_at"]) for i in picked],
            mode="markers",
            marker=dict(symbol="x", size=10, color=STATUS_COLORS.get(status, "#000")),
            customdata=[[rows[i]["run_id"], status, rows[i]["queued_seconds"]] for i in picked],
            hovertemplate="%{customdata[0]}<br>%{customdata[1]} before it started"
                          "<extra></extra>",
        )
    if not relative:  # seconds-long runs on a days-long axis: a dot shows where each one is
        fig.add_scatter(
            name="created", y=labels, x=[_time(r["created_at"]) for r in rows], mode="markers",
            marker=dict(size=5, color="#495057"), showlegend=False, hoverinfo="skip",
        )
    fig.update_layout(
        **{**_LAYOUT,
           # The legend sits above the top axis, at the top of the figure however tall it is.
           "legend": dict(orientation="h", yref="container", y=1, yanchor="top", x=0),
           "margin": dict(l=10, r=10, t=90, b=10)},
        barmode="overlay",
        height=max(280, 22 * len(rows) + 130),
        xaxis=dict(title="seconds since created" if relative else None,
                   type="linear" if relative else "date", side="top"),
        yaxis=dict(autorange="reversed", categoryorder="array", categoryarray=labels),
    )
    return fig


def interruption_trend(rows: list[dict[str, Any]], bucket_seconds: int) -> go.Figure:
    """Stacked bars: interrupted runs per day, by reason."""
    if not rows:
        return empty_figure("No interrupted runs in this window.")
    fig = go.Figure()
    reasons = sorted({r["reason"] for r in rows})
    for reason in reasons:
        points = [r for r in rows if r["reason"] == reason]
        fig.add_bar(
            name=reason,
            x=[_time(r["bucket"]) for r in points],
            y=[r["count"] for r in points],
            marker_color=REASON_COLORS.get(reason, "#6c757d"),
            offset=0,
            width=bucket_seconds * 1000 * 0.9,
        )
    fig.update_layout(**_LAYOUT, barmode="stack", height=300, yaxis_title="interrupted runs")
    return fig


def lease_countdown(leases: list[dict[str, Any]], at_risk_seconds: int) -> go.Figure:
    """Horizontal bars: seconds left on each live lease; red when at risk, dark when expired."""
    if not leases:
        return empty_figure("No run holds a lease right now.")
    labels = [f"{x['run_id'][-8:]} · {x['executor_instance_id']}" for x in leases]
    colors = [
        "#212529" if x["expired"] else "#dc3545" if x["at_risk"] else "#198754" for x in leases
    ]
    fig = go.Figure(go.Bar(
        y=labels,
        x=[x["seconds_left"] for x in leases],
        orientation="h",
        marker_color=colors,
        customdata=[[x["run_id"], x["lease_expires_at"]] for x in leases],
        hovertemplate="%{customdata[0]}<br>%{x:.1f} s left (until %{customdata[1]})"
                      "<extra></extra>",
    ))
    fig.add_vline(x=at_risk_seconds, line_dash="dash", line_color="#dc3545",
                  annotation_text=f"at risk < {at_risk_seconds} s")
    fig.update_layout(**_LAYOUT, height=max(200, 26 * len(leases) + 90), showlegend=False,
                      xaxis_title="seconds left on the lease",
                      yaxis=dict(autorange="reversed"))
    return fig


def _version_label(outcome: dict[str, Any]) -> str:
    return f"v{outcome['version']} {outcome.get('name') or ''}".strip()


def outcome_rates(outcomes: list[dict[str, Any]]) -> go.Figure:
    """Stacked horizontal bars: share of each terminal status per version (or agent)."""
    finished = [o for o in outcomes if o["finished"]]
    if not finished:
        return empty_figure("No finished runs in this window.")
    labels = [_version_label(o) if o["version"] is not None else o["agent_id"] for o in finished]
    fig = go.Figure()
    for status in ("succeeded", "failed", "cancelled", "interrupted"):
        fig.add_bar(
            name=status, y=labels, orientation="h",
            x=[(o["rates"][status] or 0) * 100 for o in finished],
            customdata=[o["by_status"][status] for o in finished],
            marker_color=STATUS_COLORS[status],
            hovertemplate="%{y}: %{x:.1f}% " + status + " (%{customdata} runs)<extra></extra>",
        )
    fig.update_layout(**_LAYOUT, barmode="stack", height=max(200, 40 * len(finished) + 90),
                      xaxis=dict(title="% of finished runs", range=[0, 100]),
                      yaxis=dict(autorange="reversed"))
    return fig


def latency_percentiles(outcomes: list[dict[str, Any]]) -> go.Figure:
    """Grouped bars: p50 / p95 / p99 latency (seconds) per version (or agent)."""
    timed = [o for o in outcomes if o["latency_p50"] is not None]
    if not timed:
        return empty_figure("No run both started and ended in this window.")
    labels = [_version_label(o) if o["version"] is not None else o["agent_id"] for o in timed]
    fig = go.Figure()
    for key, color in (("latency_p50", "#6ea8fe"), ("latency_p95", "#0d6efd"),
                       ("latency_p99", "#052c65")):
        fig.add_bar(name=key.removeprefix("latency_"), x=labels, y=[o[key] for o in timed],
                    marker_color=color, hovertemplate="%{x}: %{y:.2f} s<extra></extra>")
    fig.update_layout(**_LAYOUT, barmode="group", height=300, yaxis_title="seconds")
    return fig


# --- run tree (dash-cytoscape) -----------------------------------------------------------------

TREE_STYLESHEET: list[dict[str, Any]] = [
    {"selector": "node", "style": {
        "label": "data(label)", "text-wrap": "wrap", "text-valign": "center",
        "text-halign": "center", "shape": "round-rectangle", "width": 150, "height": 52,
        "font-size": 11, "color": "#fff", "background-color": "data(color)",
        "border-width": 2, "border-color": "#dee2e6"}},
    {"selector": "edge", "style": {
        "curve-style": "bezier", "target-arrow-shape": "triangle", "width": 2,
        "line-color": "#adb5bd", "target-arrow-color": "#adb5bd"}},
    {"selector": ".failed", "style": {"border-width": 5, "border-color": "#842029"}},
    {"selector": ".interrupted", "style": {
        "border-width": 5, "border-color": "#842029", "border-style": "dashed"}},
    {"selector": ".focus", "style": {"border-width": 6, "border-color": "#ffc107"}},
    {"selector": ":selected", "style": {"border-width": 6, "border-color": "#0dcaf0"}},
]


def _duration(node: dict[str, Any]) -> str:
    start, end = _time(node.get("started_at")), _time(node.get("finished_at"))
    if start is None:
        return "never started"
    if end is None:
        return "running"
    return f"{(end - start).total_seconds():.1f} s"


def tree_elements(nodes: list[dict[str, Any]], focus: str | None = None) -> list[dict[str, Any]]:
    """Cytoscape nodes and parent → child edges; ``focus`` marks the run the page was opened on."""
    elements: list[dict[str, Any]] = []
    ids = {n["run_id"] for n in nodes}
    for n in nodes:
        classes = [n["status"]]
        if n["run_id"] == focus:
            classes.append("focus")
        elements.append({
            "data": {
                "id": n["run_id"],
                "label": f"{n.get('agent_name') or n['agent_id']} v{n.get('agent_version')}\n"
                         f"{n['status']} · {_duration(n)}",
                "status": n["status"],
                "color": STATUS_COLORS.get(n["status"], "#6c757d"),
            },
            "classes": " ".join(classes),
        })
    for n in nodes:
        if n["parent_run_id"] in ids:
            elements.append({"data": {"source": n["parent_run_id"], "target": n["run_id"]}})
    return elements


def tree_layout(root_run_id: str) -> dict[str, Any]:
    """Top-down: the root on top, each generation one row lower."""
    return {"name": "breadthfirst", "directed": True, "roots": f"[id = '{root_run_id}']",
            "spacingFactor": 1.15, "animate": False}
