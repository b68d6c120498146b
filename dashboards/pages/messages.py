"""``/messages``: search assistant answers by text, session, owner, agent and time."""

from __future__ import annotations

import dash
import dash_bootstrap_components as dbc
from dash import Input, Output, State, ctx, dcc, html

from dashboards import components as ui
from dashboards import params
from dashboards.page_registry import callback
from queries.message_search import MessageSearch, search_messages

P = "messages"
TWIN = "/api/messages"
DEFAULT_WINDOW = "all"
COLUMNS = [
    {"field": "created", "headerName": "Answered", "width": 205},
    {"field": "agent", "headerName": "Agent (at that time)", "width": 170},
    {"field": "owner_id", "headerName": "Owner", "width": 80},
    {"field": "content_preview", "headerName": "Answer", "flex": 1, "minWidth": 280,
     "tooltipField": "content_preview"},
    ui.link_column("message", "Provenance"),
    ui.link_column("run", "Run id"),
    {**ui.status_column("run_status", "Run"), "width": 105},
]


def _session(value) -> str | None:
    """The session filter: applied as typed (one that is no id matches nothing), as long as the
    twin takes."""
    return params.text(value, max_length=params.RUN_ID_LENGTH)


def layout(q=None, session=None, owner=None, agent=None, window=None, since=None, until=None,
           **_):
    key = params.window_key(window, DEFAULT_WINDOW)
    return html.Div([
        dcc.Location(id=f"{P}-url", refresh=False),
        ui.page_header("Messages", "Find an answer, then open its provenance: which run, agent "
                       "version and context produced it.", twin=TWIN, twin_id=f"{P}-json"),
        ui.left_out_of_link(params.window_checks(window, since, until)),
        dbc.Row([
            dbc.Col(ui.labelled("Text", dbc.Input(id=f"{P}-q", value=params.text(q), debounce=True,
                                                   maxLength=params.TEXT_LENGTH,
                                                   placeholder="words in the answer",
                                                   type="search")), md=3),
            dbc.Col(ui.labelled("Agent", ui.agent_dropdown(f"{P}-agent", params.agent(agent))),
                    md=3),
            dbc.Col(ui.labelled("Owner", dbc.Input(id=f"{P}-owner", value=params.text(owner),
                                                    debounce=True, maxLength=params.TEXT_LENGTH,
                                                    placeholder="owner id")), md=2),
            dbc.Col(ui.labelled("Session", dbc.Input(id=f"{P}-session", value=_session(session),
                                                      debounce=True,
                                                      maxLength=params.RUN_ID_LENGTH,
                                                      placeholder="sess_…")), md=2),
            dbc.Col(ui.labelled("Answered", ui.window_picker(P, key, since, until)), md=2),
        ], className="g-2 mb-2"),
        ui.pager(P),
        ui.loading(html.Div([
            ui.empty_state("No answers match", "", id=f"{P}-empty"),
            ui.grid(f"{P}-grid", COLUMNS),
        ])),
    ])


ui.agent_choices_callback(P)


@callback(
    *ui.paged_grid_outputs(P),
    Output(f"{P}-url", "search"),
    Output(f"{P}-json", "href"),
    Output(f"{P}-dates-col", "style"),
    Input(f"{P}-q", "value"),
    Input(f"{P}-agent", "value"),
    Input(f"{P}-owner", "value"),
    Input(f"{P}-session", "value"),
    Input(f"{P}-window", "value"),
    Input(f"{P}-dates", "start_date"),
    Input(f"{P}-dates", "end_date"),
    Input(f"{P}-prev", "n_clicks"),
    Input(f"{P}-next", "n_clicks"),
    State(f"{P}-pager", "data"),
    State(f"{P}-url", "search"),
)
def search(q, agent, owner, session, window, since, until, _prev, _next, pager, current_search):
    key = params.window_key(window, DEFAULT_WINDOW)
    # Owners are any text (ingest.tokens): the owner filter is text, not an id.
    filters = {"q": params.text(q), "agent": params.agent(agent), "owner": params.text(owner),
               "session": _session(session)}
    state = ui.pager_step(pager, ctx.triggered_id, P)
    query = MessageSearch(
        text=filters["q"], agent_id=filters["agent"], owner_id=filters["owner"],
        session_id=filters["session"], window=params.resolve_window(key, since, until),
    )
    with ui.read() as s:
        page = search_messages(s, query, limit=ui.PAGE_SIZE, cursor=state["cursors"][state["page"]])
    rows = [
        {**item,
         "created": ui.when(item["created_at"]),
         "agent": f"{item['agent_name']} v{item['agent_version']}",
         "content_preview": item["content_preview"] + ("…" if item["content_truncated"] else ""),
         "message": ui.link_cell("messages", item["id"]),
         "run": ui.link_cell("runs", item["run_id"])}
        for item in page.items
    ]
    store, prev_off, next_off, label = ui.pager_view(state, len(rows), page.next_cursor)
    empty = [dash.html.H5("No answers match", className="alert-heading"),
             dash.html.P(f"Nothing answered in {params.describe_window(key, since, until)} matches "
                         "these filters. Clear a filter or widen the time window; only assistant "
                         "answers are searched, not users' messages.", className="mb-0")]
    search_value = ui.url_search({**filters, **ui.window_params(key, since, until)},
                                 {"window": DEFAULT_WINDOW}, current_search)
    twin = params.twin_href(TWIN, filters, window=(key, since, until), limit=ui.PAGE_SIZE)
    return (rows, ui.hidden_if(not rows), empty, ui.hidden_if(bool(rows)), store, prev_off,
            next_off, label, search_value, twin, ui.hidden_if(key != "custom"))


dash.register_page(__name__, path="/messages", name="Messages", title="agentledger · messages",
                   order=1, layout=layout)
