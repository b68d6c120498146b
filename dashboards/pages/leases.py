"""``/leases``: lease health, refreshed every few seconds. Live executors, the runs each holds,
its last heartbeat, the time left on every lease (runs at risk in red), and the reconciler's lag."""

from __future__ import annotations

import dash
import dash_bootstrap_components as dbc
from dash import Input, Output, State, dcc, html

from dashboards import components as ui
from dashboards import figures, params
from dashboards.page_registry import callback
from queries.lease_health import (
    DEFAULT_AT_RISK_SECONDS,
    DEFAULT_LEASE_LIMIT,
    DEFAULT_SEEN_MINUTES,
    lease_health,
)

P = "leases"
TWIN = "/api/leases"
REFRESH_MS = 3000
EXECUTOR_COLUMNS = [
    {"field": "executor_instance_id", "headerName": "Executor", "flex": 1, "minWidth": 150},
    {"field": "runs_held", "headerName": "Runs held", "width": 95},
    {"field": "ago", "headerName": "Heartbeat", "width": 105, "tooltipField": "heartbeat"},
    {"field": "runs_ended_recently", "headerName": "Ended lately", "width": 110},
]
LEASE_COLUMNS = [
    ui.link_column("run", "Run (tree)"),
    {"field": "agent", "headerName": "Agent", "width": 190},
    ui.status_column(),
    {"field": "executor_instance_id", "headerName": "Executor", "width": 220},
    {"field": "left", "headerName": "Lease left", "width": 110},
    {"field": "until", "headerName": "Lease until", "width": 205},
    {"field": "heartbeat", "headerName": "Last heartbeat", "width": 205},
]
ROW_STYLE = {"styleConditions": [
    {"condition": "params.data.expired", "style": {"backgroundColor": "#343a40", "color": "white"}},
    {"condition": "params.data.at_risk", "style": {"backgroundColor": "#f8d7da", "fontWeight": 600}},
]}


def layout(seen=None, risk=None, **_):
    return html.Div([
        dcc.Location(id=f"{P}-url", refresh=False),
        dcc.Interval(id=f"{P}-tick", interval=REFRESH_MS),
        ui.page_header("Lease health", f"Refreshed every {REFRESH_MS // 1000} s from the database "
                       "clock. A lease only says an executor is alive; when one expires the "
                       "reconciler ends the run interrupted.", twin=TWIN, twin_id=f"{P}-json"),
        ui.left_out_of_link({"seen": (seen, params.whole_number_taken(seen, low=1, high=1440)),
                             "risk": (risk, params.whole_number_taken(risk, low=1, high=3600))}),
        dbc.Row([
            dbc.Col(ui.labelled("Executors seen in the last (minutes)", dbc.Input(
                id=f"{P}-seen", type="number", min=1, max=1440, debounce=True,
                value=params.integer(seen, DEFAULT_SEEN_MINUTES, low=1, high=1440))), md=3),
            dbc.Col(ui.labelled("At risk when less than (seconds) left", dbc.Input(
                id=f"{P}-risk", type="number", min=1, max=3600, debounce=True,
                value=params.integer(risk, DEFAULT_AT_RISK_SECONDS, low=1, high=3600))), md=3),
            dbc.Col(html.Div(id=f"{P}-clock", className="small text-muted mt-4"), md=6),
        ], className="g-2 mb-3"),
        html.Div(id=f"{P}-kpis"),
        dbc.Row([
            dbc.Col(dbc.Card([dbc.CardHeader("Executors"), dbc.CardBody([
                ui.empty_state("No live executors", "", id=f"{P}-executors-empty"),
                ui.grid(f"{P}-executors", EXECUTOR_COLUMNS),
            ])]), lg=5, className="mb-3"),
            dbc.Col(dbc.Card([dbc.CardHeader("Time left on each lease"), dbc.CardBody(
                dcc.Graph(id=f"{P}-chart", config={"displaylogo": False}))]), lg=7, className="mb-3"),
        ]),
        dbc.Card([dbc.CardHeader("Leases, soonest to expire first"), dbc.CardBody([
            ui.empty_state("No leases", "", id=f"{P}-leases-empty"),
            html.Div(id=f"{P}-leases-note", className="small text-muted"),
            ui.grid(f"{P}-leases", LEASE_COLUMNS, getRowStyle=ROW_STYLE),
        ])]),
    ])


@callback(
    Output(f"{P}-kpis", "children"),
    Output(f"{P}-clock", "children"),
    Output(f"{P}-executors", "rowData"),
    Output(f"{P}-executors", "style"),
    Output(f"{P}-executors-empty", "children"),
    Output(f"{P}-executors-empty", "style"),
    Output(f"{P}-chart", "figure"),
    Output(f"{P}-leases", "rowData"),
    Output(f"{P}-leases", "style"),
    Output(f"{P}-leases-empty", "children"),
    Output(f"{P}-leases-empty", "style"),
    Output(f"{P}-leases-note", "children"),
    Output(f"{P}-url", "search"),
    Output(f"{P}-json", "href"),
    Input(f"{P}-tick", "n_intervals"),
    Input(f"{P}-seen", "value"),
    Input(f"{P}-risk", "value"),
    State(f"{P}-url", "search"),
)
def refresh(_tick, seen, risk, current_search):
    seen = params.integer(seen, DEFAULT_SEEN_MINUTES, low=1, high=1440)
    risk = params.integer(risk, DEFAULT_AT_RISK_SECONDS, low=1, high=3600)
    with ui.read() as s:
        health = lease_health(s, seen_within_minutes=seen, at_risk_seconds=risk)
    kpis = ui.kpi_row([
        ui.kpi("Live executors", len(health.executors), color="primary"),
        ui.kpi("Live leases", health.live_leases),
        ui.kpi("At risk", health.at_risk, color="danger" if health.at_risk else "dark"),
        ui.kpi("Expired, not yet reconciled", health.expired_unreconciled,
               color="danger" if health.expired_unreconciled else "dark"),
        ui.kpi("Reconcile lag", ui.seconds(health.reconcile_lag_seconds),
               color="danger" if health.reconcile_lag_seconds else "dark"),
        ui.kpi("Queued, waiting", health.queued),
    ])
    executors = [
        {**e, "heartbeat": ui.when(e["last_heartbeat_at"]) or "–",
         "ago": f"{ui.seconds(e['seconds_since_heartbeat'])} ago"}
        for e in health.executors
    ]
    leases = [
        {"run": ui.link_cell("runs", x["run_id"]), "agent": f"{x['agent_name']} v{x['agent_version']}",
         "status": x["status"], "executor_instance_id": x["executor_instance_id"],
         "left": "expired" if x["expired"] else ui.seconds(x["seconds_left"]),
         "until": ui.when(x["lease_expires_at"]), "heartbeat": ui.when(x["last_heartbeat_at"]),
         "expired": x["expired"], "at_risk": x["at_risk"]}
        for x in health.leases
    ]
    executors_empty = [html.H5("No live executors", className="alert-heading"), html.P([
        f"No executor heartbeated, held a run or finished one in the last {seen} minutes. "
        "Executors are seen through the runs they work on: an idle one, such as the executor ",
        html.Code("agentledger serve"), " runs in-process, shows here once it claims a run. "
        "Queued runs that stay queued need one: start it with ", html.Code("agentledger worker"),
        " or ", html.Code("agentledger serve"), "."], className="mb-0")]
    leases_empty = [html.H5("No run holds a lease", className="alert-heading"), html.P(
        f"Nothing is running right now ({health.queued} queued). A lease appears when an executor "
        "claims a queued run, and goes when the run ends.", className="mb-0")]
    note = (f"Showing the {len(leases)} leases that end soonest." if health.leases_truncated else "")
    search = ui.url_search({"seen": seen, "risk": risk},
                           {"seen": DEFAULT_SEEN_MINUTES, "risk": DEFAULT_AT_RISK_SECONDS},
                           current_search)
    if search is not dash.no_update and dash.ctx.triggered_id == f"{P}-tick":
        search = dash.no_update  # the clock ticking is not a filter change
    return (
        kpis,
        f"database clock: {ui.when(health.now.isoformat())}",
        executors, ui.hidden_if(not executors), executors_empty, ui.hidden_if(bool(executors)),
        figures.lease_countdown(health.leases, risk),
        leases, ui.hidden_if(not leases), leases_empty, ui.hidden_if(bool(leases)),
        note, search,
        # The page shows the leases lease_health returns by default: as many in the twin.
        params.twin_href(TWIN, {"seen": seen, "risk": risk}, limit=DEFAULT_LEASE_LIMIT),
    )


dash.register_page(__name__, path="/leases", name="Leases", title="agentledger · leases",
                   order=7, layout=layout)
