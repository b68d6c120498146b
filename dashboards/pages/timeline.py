"""``/timeline``: one bar per run from created to finished, coloured by phase (queued, running)
and by how the run ended. Click a bar to open that run's tree."""

from __future__ import annotations

import dash
import dash_bootstrap_components as dbc
from dash import Input, Output, State, dcc, html, no_update

from dashboards import components as ui
from dashboards import figures, params
from dashboards.page_registry import callback
from queries.status_timeline import TimelineFilters, status_timeline

P = "timeline"
TWIN = "/api/timeline"
DEFAULT_WINDOW = "24h"
LIMITS = ("50", "100", "300", "1000")
ALIGNS = {"start": "each run from 0", "clock": "wall clock"}
STATUSES = [o["value"] for o in ui.STATUS_FILTER_OPTIONS if o["value"] != ui.ANY]


def layout(status=None, agent=None, roots=None, limit=None, align=None, window=None, since=None,
           until=None, **_):
    key = params.window_key(window, DEFAULT_WINDOW)
    return html.Div([
        dcc.Location(id=f"{P}-url", refresh=False),
        dcc.Location(id=f"{P}-nav", refresh="callback-nav"),
        ui.page_header("Status timeline", "Queued (grey), then running, coloured by how each run "
                       "ended. Click a bar to open its run tree.", twin=TWIN,
                       twin_id=f"{P}-json"),
        ui.left_out_of_link({"status": (status, params.choice(status, STATUSES) is not None),
                             "roots": (roots, params.choice(roots, ("all", "roots")) is not None),
                             "limit": (limit, params.choice(limit, LIMITS) is not None),
                             "align": (align, params.choice(align, ALIGNS) is not None),
                             **params.window_checks(window, since, until)}),
        dbc.Row([
            dbc.Col(ui.labelled("Status", dbc.Select(id=f"{P}-status",
                                                     options=ui.STATUS_FILTER_OPTIONS,
                                                     value=params.choice(status, STATUSES, ui.ANY))),
                    md=2),
            dbc.Col(ui.labelled("Agent", ui.agent_dropdown(f"{P}-agent", params.agent(agent))),
                    md=2),
            dbc.Col(ui.labelled("Runs", dbc.Select(id=f"{P}-roots", value=params.choice(
                roots, ("all", "roots"), "all"), options=[
                    {"label": "all runs", "value": "all"},
                    {"label": "root runs only", "value": "roots"}])), md=2),
            dbc.Col(ui.labelled("Show at most", dbc.Select(
                id=f"{P}-limit", value=params.choice(limit, LIMITS, "100"),
                options=[{"label": f"{n} runs", "value": n} for n in LIMITS])), md=2),
            dbc.Col(ui.labelled("Time axis", dbc.Select(
                id=f"{P}-align", value=params.choice(align, ALIGNS, "start"),
                options=[{"label": v, "value": k} for k, v in ALIGNS.items()])), md=2),
            dbc.Col(ui.labelled("Created", ui.window_picker(P, key, since, until)), md=2),
        ], className="g-2 mb-2"),
        html.Div(id=f"{P}-note", className="small text-muted mb-2"),
        ui.loading(dcc.Graph(id=f"{P}-chart", config={"displaylogo": False})),
    ])


ui.agent_choices_callback(P)


@callback(
    Output(f"{P}-chart", "figure"),
    Output(f"{P}-note", "children"),
    Output(f"{P}-url", "search"),
    Output(f"{P}-json", "href"),
    Output(f"{P}-dates-col", "style"),
    Input(f"{P}-status", "value"),
    Input(f"{P}-agent", "value"),
    Input(f"{P}-roots", "value"),
    Input(f"{P}-limit", "value"),
    Input(f"{P}-align", "value"),
    Input(f"{P}-window", "value"),
    Input(f"{P}-dates", "start_date"),
    Input(f"{P}-dates", "end_date"),
    State(f"{P}-url", "search"),
)
def draw(status, agent, roots, limit, align, window, since, until, current_search):
    key = params.window_key(window, DEFAULT_WINDOW)
    values = {"status": params.choice(status, STATUSES), "agent": params.agent(agent),
              "roots": params.choice(roots, ("all", "roots"), "all"),
              "limit": params.choice(limit, LIMITS, "100"),
              "align": params.choice(align, ALIGNS, "start")}
    filters = TimelineFilters(status=values["status"], agent_id=values["agent"],
                              roots_only=values["roots"] == "roots")
    with ui.read() as s:
        found = status_timeline(s, params.resolve_window(key, since, until), filters,
                                limit=int(values["limit"]))
    described = params.describe_window(key, since, until)
    if found.truncated:
        note = (f"Showing the {len(found.rows)} most recent of {found.total} runs created in "
                f"{described}; narrow the filters or raise the limit to see more.")
    elif found.rows:
        note = f"{found.total} runs created in {described}."
    else:
        note = (f"No run created in {described} matches these filters. Widen the time window "
                "(the demo data spans the last 14 days) or clear a filter.")
    search = ui.url_search({**values, **ui.window_params(key, since, until)},
                           {"window": DEFAULT_WINDOW, "roots": "all", "limit": "100",
                            "align": "start"}, current_search)
    # The twin's first page is the page's runs (the most recent ``limit``); past a twin page's
    # most rows its next_cursor has the rest. The time axis is only how the page draws them.
    twin = params.twin_href(TWIN, {"status": values["status"], "agent": values["agent"]},
                            window=(key, since, until), roots_only=values["roots"] == "roots",
                            limit=min(int(values["limit"]), params.TWIN_MAX_LIMIT))
    return (figures.timeline(found.rows, align=values["align"]), note, search, twin,
            ui.hidden_if(key != "custom"))


@callback(Output(f"{P}-nav", "pathname"), Input(f"{P}-chart", "clickData"),
          prevent_initial_call=True)
def open_run(click):
    # A bar's customdata is [run id, status, seconds]; the browser may send anything else.
    points = click.get("points") if isinstance(click, dict) else None
    point = points[0] if isinstance(points, list) and points else None
    data = point.get("customdata") if isinstance(point, dict) else None
    run_id = params.identifier(data[0]) if isinstance(data, list) and data else None
    return f"/runs/{run_id}" if run_id else no_update


dash.register_page(__name__, path="/timeline", name="Timeline", title="agentledger · timeline",
                   order=5, layout=layout)
