"""``/interrupted``: interrupted runs, why (reason), on which executor, the last event before
the interruption, lease expiry, parent; and the trend per day by reason."""

from __future__ import annotations

import dash
import dash_bootstrap_components as dbc
from dash import Input, Output, State, ctx, dcc, html

from dashboards import components as ui
from dashboards import figures, params
from dashboards.page_registry import callback
from queries.interrupted_runs import (
    REASONS,
    InterruptedFilters,
    interrupted_runs,
    interruption_trend,
)

P = "interrupted"
TWIN = "/api/interrupted-runs"
DEFAULT_WINDOW = "14d"
REASON_HELP = {
    "lease_expired": "the executor stopped heartbeating and its lease ran out",
    "parent_terminal": "a queued child whose parent had already ended",
    "service_restart": "the serving process restarted while running it",
    "executor_shutdown": "the executor was stopped on purpose while running it",
}
COLUMNS = [
    {"field": "when", "headerName": "Interrupted", "width": 205},
    {"field": "reason", "headerName": "Reason", "width": 150, "tooltipField": "reason_help"},
    {"field": "agent", "headerName": "Agent", "width": 180},
    ui.link_column("run", "Run (tree)"),
    {"field": "executor_instance_id", "headerName": "Executor", "width": 150},
    {"field": "last_event", "headerName": "Last event before", "width": 330},
    {"field": "lease", "headerName": "Lease ended", "width": 205},
    ui.link_column("parent", "Parent", width=340),
]


def layout(reason=None, executor=None, agent=None, window=None, since=None, until=None, **_):
    key = params.window_key(window, DEFAULT_WINDOW)
    return html.Div([
        dcc.Location(id=f"{P}-url", refresh=False),
        ui.page_header("Interrupted runs", "Runs that ended without their executor finishing them, "
                       "and why. The reconciler never re-runs the model: a retry is a new run.",
                       twin=TWIN, twin_id=f"{P}-json"),
        ui.left_out_of_link({"reason": (reason, params.choice(reason, REASONS) is not None),
                             **params.window_checks(window, since, until)}),
        dbc.Row([
            dbc.Col(ui.labelled("Reason", dbc.Select(
                id=f"{P}-reason", value=params.choice(reason, REASONS, ui.ANY),
                options=[{"label": "any reason", "value": ui.ANY}]
                + [{"label": r, "value": r} for r in REASONS])), md=2),
            dbc.Col(ui.labelled("Executor", dbc.Input(id=f"{P}-executor", debounce=True,
                                                       value=params.text(executor),
                                                       maxLength=params.TEXT_LENGTH,
                                                       placeholder="executor instance id")), md=3),
            dbc.Col(ui.labelled("Agent", ui.agent_dropdown(f"{P}-agent", params.agent(agent))),
                    md=3),
            dbc.Col(ui.labelled("Interrupted", ui.window_picker(P, key, since, until)), md=4),
        ], className="g-2 mb-3"),
        ui.loading(html.Div([
            html.Div(id=f"{P}-kpis"),
            dbc.Card([dbc.CardHeader("Interrupted per day, by reason"),
                      dbc.CardBody(dcc.Graph(id=f"{P}-trend", config={"displaylogo": False}))],
                     className="mb-3"),
        ])),
        ui.pager(P),
        ui.loading(html.Div([
            ui.empty_state("No interrupted runs", "", id=f"{P}-empty"),
            ui.grid(f"{P}-grid", COLUMNS),
        ])),
    ])


ui.agent_choices_callback(P)


def _filters(reason, executor, agent, key, since, until) -> tuple[dict, InterruptedFilters]:
    # An executor instance id is any text its executor chose (up to 200 characters), not an id
    # of ours: the executor filter is text.
    values = {"reason": params.choice(reason, REASONS), "executor": params.text(executor),
              "agent": params.agent(agent)}
    return values, InterruptedFilters(window=params.resolve_window(key, since, until),
                                      reason=values["reason"],
                                      executor_instance_id=values["executor"],
                                      agent_id=values["agent"])


@callback(
    Output(f"{P}-kpis", "children"),
    Output(f"{P}-trend", "figure"),
    Output(f"{P}-url", "search"),
    Output(f"{P}-json", "href"),
    Output(f"{P}-dates-col", "style"),
    Input(f"{P}-reason", "value"),
    Input(f"{P}-executor", "value"),
    Input(f"{P}-agent", "value"),
    Input(f"{P}-window", "value"),
    Input(f"{P}-dates", "start_date"),
    Input(f"{P}-dates", "end_date"),
    State(f"{P}-url", "search"),
)
def trend(reason, executor, agent, window, since, until, current_search):
    key = params.window_key(window, DEFAULT_WINDOW)
    values, filters = _filters(reason, executor, agent, key, since, until)
    with ui.read() as s:
        found = interruption_trend(s, filters)
    kpis = ui.kpi_row(
        [ui.kpi("Interrupted", sum(found.by_reason.values()), color="warning")]
        + [ui.kpi(r.replace("_", " "), found.by_reason.get(r, 0)) for r in REASONS]
    )
    search = ui.url_search({**values, **ui.window_params(key, since, until)},
                           {"window": DEFAULT_WINDOW}, current_search)
    twin = params.twin_href(TWIN, values, window=(key, since, until), bounds="interrupted",
                            limit=ui.PAGE_SIZE)
    return (kpis, figures.interruption_trend(found.rows, found.bucket_seconds), search, twin,
            ui.hidden_if(key != "custom"))


@callback(
    *ui.paged_grid_outputs(P),
    Input(f"{P}-reason", "value"),
    Input(f"{P}-executor", "value"),
    Input(f"{P}-agent", "value"),
    Input(f"{P}-window", "value"),
    Input(f"{P}-dates", "start_date"),
    Input(f"{P}-dates", "end_date"),
    Input(f"{P}-prev", "n_clicks"),
    Input(f"{P}-next", "n_clicks"),
    State(f"{P}-pager", "data"),
)
def listing(reason, executor, agent, window, since, until, _prev, _next, pager):
    key = params.window_key(window, DEFAULT_WINDOW)
    _, filters = _filters(reason, executor, agent, key, since, until)
    state = ui.pager_step(pager, ctx.triggered_id, P)
    with ui.read() as s:
        page = interrupted_runs(s, filters, limit=ui.PAGE_SIZE,
                                cursor=state["cursors"][state["page"]])
    rows = []
    for item in page.items:
        last = item["last_event"]
        rows.append({
            "when": ui.when(item["interrupted_at"]),
            "reason": item["reason"],
            "reason_help": REASON_HELP.get(item["reason"], ""),
            "agent": f"{item['agent_name']} v{item['agent_version']}",
            "run": ui.link_cell("runs", item["run_id"]),
            "executor_instance_id": item["executor_instance_id"] or "– (never started)",
            "last_event": f"#{last['seq']} {last['type']} at {ui.when(last['created_at'])}"
            if last else "",
            "lease": ui.when(item["lease_expires_at"]) or "–",
            "parent": (ui.link_cell("runs", item["parent_run_id"])
                       + (f" ({item['parent_status']})" if item["parent_status"] else ""))
            if item["parent_run_id"] else "",
        })
    store, prev_off, next_off, label = ui.pager_view(state, len(rows), page.next_cursor)
    empty = [html.H5("No interrupted runs", className="alert-heading"),
             html.P(f"No run matching these filters was interrupted in "
                    f"{params.describe_window(key, since, until)}. Runs end interrupted when their "
                    "lease expires, their parent ended first, or the service restarted or shut down "
                    "while they ran.", className="mb-0")]
    return (rows, ui.hidden_if(not rows), empty, ui.hidden_if(bool(rows)), store, prev_off,
            next_off, label)


dash.register_page(__name__, path="/interrupted", name="Interrupted",
                   title="agentledger · interrupted runs", order=6, layout=layout)
