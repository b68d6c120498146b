"""``/audit``: the admin action log: tokens created and revoked, agents registered and
re-versioned, runs cancelled, sessions deleted; who, what, when."""

from __future__ import annotations

import json

import dash
import dash_bootstrap_components as dbc
from dash import Input, Output, State, ctx, dcc, html

from agentledger.core.vocabulary import ADMIN_ACTIONS
from dashboards import components as ui
from dashboards import params
from dashboards.page_registry import callback
from queries.admin_actions import ActionFilters, admin_actions

P = "audit"
TWIN = "/api/admin-actions"
ACTIONS = ADMIN_ACTIONS
COLUMNS = [
    {"field": "at", "headerName": "When", "width": 205},
    {"field": "actor", "headerName": "Who", "width": 170},
    {"field": "actor_role", "headerName": "Role", "width": 100},
    {"field": "action", "headerName": "Action", "width": 190},
    {"field": "target", "headerName": "Target", "width": 330},
    {"field": "detail", "headerName": "Detail", "flex": 1},
]


def layout(action=None, actor=None, **_):
    return html.Div([
        dcc.Location(id=f"{P}-url", refresh=False),
        ui.page_header("Admin actions", "Every administrative change, append-only: who did what, "
                       "and when.", twin=TWIN, twin_id=f"{P}-json"),
        ui.left_out_of_link({"action": (action, params.choice(action, ACTIONS) is not None)}),
        dbc.Row([
            dbc.Col(ui.labelled("Action", dbc.Select(
                id=f"{P}-action", value=params.choice(action, ACTIONS, ui.ANY),
                options=[{"label": "any action", "value": ui.ANY}]
                + [{"label": a, "value": a} for a in ACTIONS])), md=3),
            dbc.Col(ui.labelled("Who", dbc.Input(id=f"{P}-actor", debounce=True,
                                                  value=params.text(actor),
                                                  maxLength=params.TEXT_LENGTH,
                                                  placeholder="owner or cli:user")), md=3),
        ], className="g-2 mb-3"),
        ui.pager(P),
        ui.loading(html.Div([
            ui.empty_state("No admin actions", "", id=f"{P}-empty"),
            ui.grid(f"{P}-grid", COLUMNS),
        ])),
    ])


@callback(
    *ui.paged_grid_outputs(P),
    Output(f"{P}-url", "search"),
    Output(f"{P}-json", "href"),
    Input(f"{P}-action", "value"),
    Input(f"{P}-actor", "value"),
    Input(f"{P}-prev", "n_clicks"),
    Input(f"{P}-next", "n_clicks"),
    State(f"{P}-pager", "data"),
    State(f"{P}-url", "search"),
)
def listing(action, actor, _prev, _next, pager, current_search):
    # An actor is an owner (any text) or cli:<user>: the actor filter is text.
    values = {"action": params.choice(action, ACTIONS), "actor": params.text(actor)}
    state = ui.pager_step(pager, ctx.triggered_id, P)
    with ui.read() as s:
        page = admin_actions(s, ActionFilters(action=values["action"], actor=values["actor"]),
                             limit=ui.PAGE_SIZE, cursor=state["cursors"][state["page"]])
    rows = [{
        "at": ui.when(item["at"]),
        "actor": item["actor"],
        "actor_role": item["actor_role"],
        "action": item["action"],
        "target": (ui.link_cell("runs", item["target_id"]) if item["target_type"] == "run"
                   else f"{item['target_type']} {item['target_id']}"),
        "detail": json.dumps(item["detail"], sort_keys=True) if item["detail"] else "",
    } for item in page.items]
    store, prev_off, next_off, label = ui.pager_view(state, len(rows), page.next_cursor)
    empty = [html.H5("No admin actions", className="alert-heading"),
             html.P("Nothing matches these filters. Token, agent, cancel and session-deletion "
                    "actions appear here as they happen.", className="mb-0")]
    search = ui.url_search(values, {}, current_search)
    twin = params.twin_href(TWIN, values, limit=ui.PAGE_SIZE)
    return (rows, ui.hidden_if(not rows), empty, ui.hidden_if(bool(rows)), store, prev_off,
            next_off, label, search, twin)


dash.register_page(__name__, path="/audit", name="Audit", title="agentledger · admin actions",
                   order=9, layout=layout)
