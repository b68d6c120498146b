"""``/``: runs by status over time, what is unfinished now, recent interruptions, lease health."""

from __future__ import annotations

import dash
import dash_bootstrap_components as dbc
from dash import Input, Output, State, dcc, html

from dashboards import components as ui
from dashboards import figures, params
from dashboards.page_registry import callback
from queries.overview import overview

P = "overview"
TWIN = "/api/overview"


def layout(window: str | None = None, since: str | None = None, until: str | None = None, **_):
    key = params.window_key(window)
    return html.Div([
        dcc.Location(id=f"{P}-url", refresh=False),
        ui.page_header("Overview", "What the ledger recorded in the window, and what runs now.",
                       twin=TWIN, twin_id=f"{P}-json"),
        ui.left_out_of_link(params.window_checks(window, since, until)),
        ui.window_picker(P, key, since, until),
        html.Div(className="mb-3"),
        ui.loading(html.Div([
            html.Div(id=f"{P}-kpis"),
            dbc.Card([
                dbc.CardHeader("Runs created, by status"),
                dbc.CardBody(dcc.Graph(id=f"{P}-status-chart", config={"displaylogo": False})),
            ], className="mb-3"),
            dbc.Row([
                dbc.Col(dbc.Card([
                    dbc.CardHeader("Queued and running now"),
                    dbc.CardBody(html.Div(id=f"{P}-unfinished")),
                ]), lg=6, className="mb-3"),
                dbc.Col(dbc.Card([
                    dbc.CardHeader(["Recent interruptions ",
                                    dcc.Link("(all)", href="/interrupted", className="small")]),
                    dbc.CardBody(html.Div(id=f"{P}-interruptions")),
                ]), lg=6, className="mb-3"),
            ]),
        ])),
    ])


def _table(rows: list[dict], columns: list[tuple[str, str]]) -> dbc.Table:
    def cell(row, field):
        value = row.get(field)
        if field in ("run_id", "root_run_id") and value:
            return dcc.Link(value, href=f"/runs/{value}")
        if field == "status":
            return ui.status_badge(value)
        if field.endswith("_at"):
            return ui.when(value)
        return "" if value is None else str(value)

    return dbc.Table(
        [html.Thead(html.Tr([html.Th(h) for _, h in columns])),
         html.Tbody([html.Tr([html.Td(cell(r, f)) for f, _ in columns]) for r in rows])],
        size="sm", hover=True, responsive=True, className="mb-0",
    )


@callback(
    Output(f"{P}-kpis", "children"),
    Output(f"{P}-status-chart", "figure"),
    Output(f"{P}-unfinished", "children"),
    Output(f"{P}-interruptions", "children"),
    Output(f"{P}-url", "search"),
    Output(f"{P}-json", "href"),
    Output(f"{P}-dates-col", "style"),
    Input(f"{P}-window", "value"),
    Input(f"{P}-dates", "start_date"),
    Input(f"{P}-dates", "end_date"),
    State(f"{P}-url", "search"),
)
def refresh(window, since, until, current_search):
    key = params.window_key(window)
    window_ = params.resolve_window(key, since, until)
    with ui.read() as s:
        found = overview(s, window_)
    totals = found.totals
    created = sum(totals.values())
    finished = sum(totals.get(k, 0) for k in ("succeeded", "failed", "cancelled", "interrupted"))
    lease = found.leases
    kpis = ui.kpi_row([
        ui.kpi("Runs created", created),
        ui.kpi("Succeeded", ui.percent(totals.get("succeeded", 0) / finished if finished else None),
               color="success"),
        ui.kpi("Failed", totals.get("failed", 0), color="danger"),
        ui.kpi("Interrupted", totals.get("interrupted", 0), color="warning"),
        ui.kpi("Live leases (at risk)", f"{lease['live_leases']} ({lease['at_risk']})",
               color="primary"),
        ui.kpi("Reconcile lag", ui.seconds(lease["reconcile_lag_seconds"]),
               color="danger" if lease["expired_unreconciled"] else "dark"),
    ])
    unfinished = (
        _table(found.unfinished_runs, [("run_id", "Run"), ("agent_name", "Agent"),
                                       ("status", "Status"), ("executor_instance_id", "Executor"),
                                       ("created_at", "Created")])
        if found.unfinished_runs
        else ui.empty_state("Nothing queued or running",
                            "Every run recorded so far has ended. New messages start runs here.")
    )
    interruptions = (
        _table(found.recent_interruptions, [("run_id", "Run"), ("agent_name", "Agent"),
                                            ("reason", "Reason"),
                                            ("executor_instance_id", "Executor"),
                                            ("interrupted_at", "When")])
        if found.recent_interruptions
        else ui.empty_state("No interruptions",
                            f"No run was interrupted in {params.describe_window(key, since, until)}.")
    )
    return (
        kpis,
        figures.status_over_time(found.status_buckets, found.bucket_seconds),
        unfinished,
        interruptions,
        ui.url_search(ui.window_params(key, since, until), {"window": params.DEFAULT_WINDOW},
                      current_search),
        params.twin_href(TWIN, window=(key, since, until)),
        ui.hidden_if(key != "custom"),
    )


dash.register_page(__name__, path="/", name="Overview", title="agentledger · overview", order=0,
                   layout=layout)
