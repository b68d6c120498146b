"""``/runs``: the run explorer, with the filters of ``GET /api/agent-runs``."""

from __future__ import annotations

import dash
import dash_bootstrap_components as dbc
from dash import Input, Output, State, ctx, dcc, html

from dashboards import components as ui
from dashboards import params
from dashboards.page_registry import callback
from queries.runs import RunFilters, list_runs

P = "runs"
TWIN = "/api/agent-runs"
STATUSES = [o["value"] for o in ui.STATUS_FILTER_OPTIONS if o["value"] != ui.ANY]
COLUMNS = [
    {"field": "created", "headerName": "Created", "width": 205},
    ui.status_column(),
    {"field": "agent", "headerName": "Agent", "width": 180},
    ui.link_column("run", "Run (tree)"),
    {"field": "queued", "headerName": "Queued", "width": 95},
    {"field": "ran", "headerName": "Ran", "width": 95},
    {"field": "owner_id", "headerName": "Owner", "width": 90},
    {"field": "executor_instance_id", "headerName": "Executor", "width": 130},
    ui.link_column("root", "Root (when delegated)"),
    {"field": "session_id", "headerName": "Session", "width": 260},
]


def _run_id(value) -> str | None:
    """A session or root run filter: applied as typed (one that is no id matches no run), as
    long as the twin takes."""
    return params.text(value, max_length=params.RUN_ID_LENGTH)


def layout(status=None, agent=None, session=None, root=None, window=None, since=None, until=None,
           **_):
    key = params.window_key(window)
    return html.Div([
        dcc.Location(id=f"{P}-url", refresh=False),
        ui.page_header("Runs", "Every execution, newest first. Open one to see its whole tree.",
                       twin=TWIN, twin_id=f"{P}-json"),
        ui.left_out_of_link({"status": (status, params.choice(status, STATUSES) is not None),
                             **params.window_checks(window, since, until)}),
        dbc.Row([
            dbc.Col(ui.labelled("Status", dbc.Select(id=f"{P}-status",
                                                     options=ui.STATUS_FILTER_OPTIONS,
                                                     value=params.choice(status, STATUSES, ui.ANY))),
                    md=2),
            dbc.Col(ui.labelled("Agent", ui.agent_dropdown(f"{P}-agent", params.agent(agent))),
                    md=3),
            dbc.Col(ui.labelled("Session", dbc.Input(id=f"{P}-session", debounce=True,
                                                      value=_run_id(session),
                                                      maxLength=params.RUN_ID_LENGTH,
                                                      placeholder="sess_…")), md=2),
            dbc.Col(ui.labelled("Root run", dbc.Input(id=f"{P}-root", debounce=True,
                                                       value=_run_id(root),
                                                       maxLength=params.RUN_ID_LENGTH,
                                                       placeholder="run_…")), md=2),
            dbc.Col(ui.labelled("Created", ui.window_picker(P, key, since, until)), md=3),
        ], className="g-2 mb-2"),
        ui.pager(P),
        ui.loading(html.Div([
            ui.empty_state("No runs match", "", id=f"{P}-empty"),
            ui.grid(f"{P}-grid", COLUMNS),
        ])),
    ])


ui.agent_choices_callback(P)


@callback(
    *ui.paged_grid_outputs(P),
    Output(f"{P}-url", "search"),
    Output(f"{P}-json", "href"),
    Output(f"{P}-dates-col", "style"),
    Input(f"{P}-status", "value"),
    Input(f"{P}-agent", "value"),
    Input(f"{P}-session", "value"),
    Input(f"{P}-root", "value"),
    Input(f"{P}-window", "value"),
    Input(f"{P}-dates", "start_date"),
    Input(f"{P}-dates", "end_date"),
    Input(f"{P}-prev", "n_clicks"),
    Input(f"{P}-next", "n_clicks"),
    State(f"{P}-pager", "data"),
    State(f"{P}-url", "search"),
)
def explore(status, agent, session, root, window, since, until, _prev, _next, pager,
            current_search):
    key = params.window_key(window)
    values = {"status": params.choice(status, STATUSES), "agent": params.agent(agent),
              "session": _run_id(session), "root": _run_id(root)}
    window_ = params.resolve_window(key, since, until)
    filters = RunFilters(status=values["status"], agent_id=values["agent"],
                         session_id=values["session"], root_run_id=values["root"],
                         created_after=window_.start, created_before=window_.end)
    state = ui.pager_step(pager, ctx.triggered_id, P)
    with ui.read() as s:
        page = list_runs(s, filters, limit=ui.PAGE_SIZE, cursor=state["cursors"][state["page"]])
    rows = [
        {"created": ui.when(r["created_at"]), "status": r["status"],
         "agent": f"{r['agent_name']} v{r['agent_version']}",
         "run": ui.link_cell("runs", r["id"]),
         "root": "" if r["root_run_id"] == r["id"] else ui.link_cell("runs", r["root_run_id"]),
         "owner_id": r["owner_id"], "session_id": r["session_id"] or "(delegated)",
         "executor_instance_id": r["executor_instance_id"] or "",
         "queued": ui.duration(r["created_at"], r["started_at"] or r["finished_at"]),
         "ran": ui.duration(r["started_at"], r["finished_at"])}
        for r in page.items
    ]
    store, prev_off, next_off, label = ui.pager_view(state, len(rows), page.next_cursor)
    empty = [html.H5("No runs match", className="alert-heading"),
             html.P(f"No run created in {params.describe_window(key, since, until)} matches these "
                    "filters. Clear a filter or widen the time window.", className="mb-0")]
    search = ui.url_search({**values, **ui.window_params(key, since, until)},
                           {"window": params.DEFAULT_WINDOW}, current_search)
    # GET /api/agent-runs takes no preset: the window goes as the bounds this page read.
    twin = params.twin_href(TWIN, values, created_after=window_.start,
                            created_before=window_.end, limit=ui.PAGE_SIZE)
    return (rows, ui.hidden_if(not rows), empty, ui.hidden_if(bool(rows)), store, prev_off,
            next_off, label, search, twin, ui.hidden_if(key != "custom"))


dash.register_page(__name__, path="/runs", name="Runs", title="agentledger · runs", order=3,
                   layout=layout)
