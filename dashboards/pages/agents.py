"""``/agents``: outcomes per agent and per version (counts and rates by terminal status, latency
percentiles, queue wait, tokens and cost, trend per day), and two versions of one agent side by
side with what changed in their definition."""

from __future__ import annotations

import dash
import dash_bootstrap_components as dbc
from dash import Input, Output, State, ctx, dcc, html, no_update

from dashboards import components as ui
from dashboards import figures, params
from dashboards.page_registry import callback
from queries.agent_outcomes import agent_outcomes
from queries.agents_catalog import get_agent, list_agents
from queries.outcome_trend import outcome_trend
from queries.provenance import diff_agent_versions

P = "agents"
TWIN = "/api/agent-outcomes"
DEFAULT_WINDOW = "30d"
TERMINAL_SHOWN = ("succeeded", "failed", "interrupted", "cancelled")
# Each terminal status is two columns under one header: its count (a number, so the column
# sorts by it) and its share of the finished runs.
OUTCOME_COLUMNS = [
    {"field": "label", "headerName": "Agent", "width": 200, "pinned": "left"},
    {"field": "runs", "headerName": "Runs", "width": 58, "sortable": True},
    *[{"headerName": status.title(), "children": [
        {"field": f"{status}_count", "headerName": "count", "width": 64, "sortable": True},
        {"field": status, "headerName": "rate", "width": 66},
    ]} for status in TERMINAL_SHOWN],
    {"headerName": "Latency", "children": [
        {"field": "p50", "headerName": "p50", "width": 80},
        {"field": "p95", "headerName": "p95", "width": 80},
        {"field": "p99", "headerName": "p99", "width": 80},
    ]},
    {"headerName": "Queue wait", "children": [{"field": "wait", "headerName": "p50", "width": 92}]},
    {"field": "tokens", "headerName": "Tokens in / out", "width": 130},
    {"field": "cost", "headerName": "Cost", "flex": 1, "minWidth": 80},
]


def cost_text(outcome: dict) -> str:
    """The summed cost, ``unknown`` when no run had a price, and how many runs had none."""
    if outcome["cost_usd"] is None:
        return "unknown"
    text = f"${outcome['cost_usd']:,.4f}"
    missing = outcome.get("runs_without_cost") or 0
    return f"{text} (+{missing} run{'s' if missing != 1 else ''} unpriced)" if missing else text


def count_and_rate(outcome: dict, status: str) -> str:
    """How many finished runs ended in ``status``, and their share of the finished runs."""
    return f"{outcome['by_status'][status]:,} · {ui.percent(outcome['rates'][status])}"


def _value(key: str, show):
    return lambda outcome: "–" if outcome[key] is None else show(outcome[key])


# The version comparison's rows: a label, and how to show it for one version's outcome.
METRICS = (
    ("Runs", _value("runs", str)),
    ("Finished", _value("finished", str)),
    *[(status.title(), lambda o, status=status: count_and_rate(o, status))
      for status in TERMINAL_SHOWN],
    ("Latency p50", _value("latency_p50", ui.seconds)),
    ("Latency p95", _value("latency_p95", ui.seconds)),
    ("Latency p99", _value("latency_p99", ui.seconds)),
    ("Queue wait p50", _value("queue_wait_p50", ui.seconds)),
    ("Queue wait p95", _value("queue_wait_p95", ui.seconds)),
    ("Input tokens", _value("input_tokens", lambda v: f"{v:,}")),
    ("Output tokens", _value("output_tokens", lambda v: f"{v:,}")),
    ("Cost", cost_text),
    ("Runs without a price", _value("runs_without_cost", str)),
)


def layout(agent=None, a=None, b=None, window=None, since=None, until=None, **_):
    key = params.window_key(window, DEFAULT_WINDOW)
    version = {"low": 1, "high": 1_000_000}
    return html.Div([
        dcc.Location(id=f"{P}-url", refresh=False),
        ui.page_header("Agents", "How each agent and each of its versions turned out, for runs "
                       "created in the window. A run counts under the version frozen in its "
                       "snapshot.", twin=TWIN, twin_id=f"{P}-json"),
        ui.left_out_of_link({**params.window_checks(window, since, until),
                             "a": (a, params.whole_number_taken(a, **version)),
                             "b": (b, params.whole_number_taken(b, **version))}),
        dbc.Row([
            dbc.Col(ui.labelled("Created", ui.window_picker(P, key, since, until)), md=4),
        ], className="g-2 mb-3"),
        ui.loading(html.Div([
            html.Div(id=f"{P}-note", className="small text-muted mb-1"),
            ui.grid(f"{P}-all", OUTCOME_COLUMNS, compact=True),
        ])),
        html.Hr(),
        dbc.Row([
            dbc.Col(ui.labelled("Agent", ui.agent_dropdown(f"{P}-agent", params.agent(agent),
                                                           placeholder="pick an agent")), md=4),
            dbc.Col(ui.labelled("Compare version", dbc.Select(
                id=f"{P}-a", value=str(params.integer(a, None, **version) or ""), options=[])), md=2),
            dbc.Col(ui.labelled("with version", dbc.Select(
                id=f"{P}-b", value=str(params.integer(b, None, **version) or ""), options=[])), md=2),
        ], className="g-2 mb-3"),
        ui.loading(html.Div(id=f"{P}-detail")),
    ])


def _version_options(agent_id: str | None) -> list[dict]:
    if not agent_id:
        return []
    with ui.read() as s:
        found = get_agent(s, agent_id)
    if found is None:
        return []
    return [{"label": f"v{v['version']} · {v['name']} · {v['model'] or v['kind']}",
             "value": str(v["version"])} for v in found["versions"]]


@callback(
    Output(f"{P}-agent", "options"),
    Output(f"{P}-agent", "value"),
    Output(f"{P}-a", "options"),
    Output(f"{P}-a", "value"),
    Output(f"{P}-b", "options"),
    Output(f"{P}-b", "value"),
    Input(f"{P}-agent", "value"),
    Input(f"{P}-agent", "search_value"),
    State(f"{P}-a", "value"),
    State(f"{P}-b", "value"),
)
def pick_agent(agent_id, search, a, b):
    agent_id = params.agent(agent_id)
    if ctx.triggered_prop_ids == {f"{P}-agent.search_value": f"{P}-agent"}:
        # Typing narrows the choices; the agent and versions shown stay until one is picked.
        return (ui.agent_options(search, keep=agent_id),
                no_update, no_update, no_update, no_update, no_update)
    if not agent_id:
        # Open on an agent that has versions to compare.
        with ui.read() as s:
            agents = list_agents(s, limit=500).items
        several = [x["id"] for x in agents if x["version"] > 1]
        agent_id = (several or [x["id"] for x in agents] or [None])[0]
    options = ui.agent_options(keep=agent_id)
    versions = _version_options(agent_id)
    known = [v["value"] for v in versions]
    if ctx.triggered_id == f"{P}-agent" or a not in known or b not in known:
        b = known[-1] if known else ""
        a = known[-2] if len(known) > 1 else b
    return options, agent_id, versions, a, versions, b


def _row(outcome: dict, label: str) -> dict:
    rates, counts = outcome["rates"], outcome["by_status"]
    return {
        "label": label, "runs": outcome["runs"],
        **{s: ui.percent(rates[s]) for s in TERMINAL_SHOWN},
        **{f"{s}_count": counts[s] for s in TERMINAL_SHOWN},
        "p50": ui.seconds(outcome["latency_p50"]), "p95": ui.seconds(outcome["latency_p95"]),
        "p99": ui.seconds(outcome["latency_p99"]), "wait": ui.seconds(outcome["queue_wait_p50"]),
        "tokens": f"{outcome['input_tokens']:,} / {outcome['output_tokens']:,}",
        "cost": cost_text(outcome),
    }


def _side_by_side(agent_id: str, a: int, b: int, va: dict | None, vb: dict | None, diff: dict | None):
    def shown(outcome, show):
        return "–" if outcome is None else show(outcome)

    rows = [html.Tr([html.Th(label, className="fw-normal text-muted"), html.Td(shown(va, show)),
                     html.Td(shown(vb, show))]) for label, show in METRICS]
    head = html.Thead(html.Tr([html.Th("Metric"),
                               html.Th(f"v{a} {va['name'] if va else ''}", id=f"{P}-col-a"),
                               html.Th(f"v{b} {vb['name'] if vb else ''}", id=f"{P}-col-b")]))
    if diff is None:
        changes = html.P("Pick two existing versions to compare their definitions.")
    elif diff["same_definition"]:
        changes = html.P("The two versions have the same definition.", className="mb-0")
    else:
        changes = dbc.Table(
            [html.Thead(html.Tr([html.Th("Field"), html.Th(f"v{a}"), html.Th(f"v{b}")])),
             html.Tbody([html.Tr([html.Td(c["field"]), html.Td(ui.json_block(c["before"])),
                                  html.Td(ui.json_block(c["after"]))])
                         for c in diff["changes"] if c["field"] != "version"])],
            size="sm", responsive=True, className="mb-0")
    missing = [f"v{v}" for v, o in ((a, va), (b, vb)) if o is None]
    return dbc.Row([
        dbc.Col(dbc.Card([
            dbc.CardHeader(f"{agent_id}: v{a} and v{b} side by side"),
            dbc.CardBody([
                html.P(f"No runs of {', '.join(missing)} were created in this window.",
                       className="small text-muted") if missing else None,
                dbc.Table([head, html.Tbody(rows)], size="sm", striped=True, className="mb-0"),
            ]),
        ]), lg=6, className="mb-3"),
        dbc.Col(dbc.Card([dbc.CardHeader("What changed in the definition"), dbc.CardBody(changes)]),
                lg=6, className="mb-3"),
    ])


@callback(
    Output(f"{P}-all", "rowData"),
    Output(f"{P}-note", "children"),
    Output(f"{P}-detail", "children"),
    Output(f"{P}-url", "search"),
    Output(f"{P}-json", "href"),
    Output(f"{P}-dates-col", "style"),
    Input(f"{P}-window", "value"),
    Input(f"{P}-dates", "start_date"),
    Input(f"{P}-dates", "end_date"),
    Input(f"{P}-agent", "value"),
    Input(f"{P}-a", "value"),
    Input(f"{P}-b", "value"),
    State(f"{P}-url", "search"),
)
def outcomes(window, since, until, agent_id, a, b, current_search):
    key = params.window_key(window, DEFAULT_WINDOW)
    window_ = params.resolve_window(key, since, until)
    agent_id = params.agent(agent_id)
    a = params.integer(a, None, low=1, high=1_000_000)
    b = params.integer(b, None, low=1, high=1_000_000)
    with ui.read() as s:
        found = agent_outcomes(s, window_)
        trend = outcome_trend(s, window_, agent_id=agent_id) if agent_id else None
        diff = diff_agent_versions(s, agent_id, a, b) if agent_id and a and b else None
    described = params.describe_window(key, since, until)
    rows = [_row(o.as_dict(), f"{o.name} ({o.agent_id})") for o in found.agents]
    note = (f"{len(rows)} agents ran in {described}." if rows else
            f"No agent ran in {described}. Widen the time window.")
    if found.groups_truncated:
        note += (f" Only the {len(rows)} busiest agents (and their busiest versions) are shown:"
                 " more ran in this window; narrow it or pick an agent.")
    search = ui.url_search({"agent": agent_id, "a": a, "b": b, **ui.window_params(key, since, until)},
                           {"window": DEFAULT_WINDOW}, current_search)
    # Both grids come from one query of every agent in the window (the picked agent's versions
    # are its rows in it), so the twin gets the window only: with its agent_id it would leave
    # the other agents out. Up to a twin page's most rows at once; next_cursor has the rest.
    twin = params.twin_href(TWIN, window=(key, since, until), limit=params.TWIN_MAX_LIMIT)
    if not agent_id:
        detail = ui.empty_state("Pick an agent", "Choose an agent above to see its versions.")
        return rows, note, detail, search, twin, ui.hidden_if(key != "custom")
    versions = [v.as_dict() for v in found.versions_of(agent_id)]
    va = next((v for v in versions if v["version"] == a), None)
    vb = next((v for v in versions if v["version"] == b), None)
    if not versions:
        charts = ui.empty_state("No runs", f"{agent_id} ran no run created in {described}.")
    else:
        charts = html.Div([
            ui.grid(f"{P}-versions", OUTCOME_COLUMNS, compact=True,
                    rowData=[_row(v, f"v{v['version']} {v['name']}") for v in versions]),
            dbc.Row([
                dbc.Col(dbc.Card([dbc.CardHeader("Terminal status by version"), dbc.CardBody(
                    dcc.Graph(figure=figures.outcome_rates(versions), config={"displaylogo": False}))]),
                    lg=6, className="my-3"),
                dbc.Col(dbc.Card([dbc.CardHeader("Latency percentiles by version"), dbc.CardBody(
                    dcc.Graph(figure=figures.latency_percentiles(versions),
                              config={"displaylogo": False}))]), lg=6, className="my-3"),
            ]),
        ])
    detail = html.Div([
        _side_by_side(agent_id, a, b, va, vb, diff) if a and b else None,
        html.H5(f"Versions of {agent_id}"),
        charts,
        dbc.Card([dbc.CardHeader(f"Runs of {agent_id} per day, by status"), dbc.CardBody(
            dcc.Graph(figure=figures.status_over_time(trend.rows, trend.bucket_seconds),
                      config={"displaylogo": False}))]),
    ])
    return rows, note, detail, search, twin, ui.hidden_if(key != "custom")


dash.register_page(__name__, path="/agents", name="Agents", title="agentledger · agents",
                   order=8, layout=layout)
