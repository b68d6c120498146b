"""Layout pieces every page uses: navigation, time-window picker, pager, grids, empty states.

Agent output is always rendered as text (``html.Pre``, grid cells, ``dcc.Markdown`` never): what
an agent wrote is data, not markup.
"""

from __future__ import annotations

import json
import re
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

import dash_ag_grid as dag
import dash_bootstrap_components as dbc
from dash import Input, Output, State, ctx, dcc, html, no_update
from flask import current_app

from dashboards import params
from dashboards.figures import STATUS_COLORS
from dashboards.page_registry import callback

PAGE_SIZE = 50
NAV = (
    ("/", "Overview", "exact"),
    ("/messages", "Messages", "partial"),
    ("/runs", "Runs", "partial"),
    ("/timeline", "Timeline", "exact"),
    ("/interrupted", "Interrupted", "exact"),
    ("/leases", "Leases", "exact"),
    ("/agents", "Agents", "exact"),
    ("/audit", "Audit", "exact"),
)
_LINKABLE = re.compile(r"^[a-z]+_[0-9a-z]+$")


def read() -> AbstractContextManager:
    """A read-only database transaction of this app (``with read() as s: queries.…(s, …)``)."""
    return current_app.extensions["agentledger"].db.read()


# --- formatting ----------------------------------------------------------------------------------

def when(value: str | None) -> str:
    """An ISO time as ``2026-11-29 18:37:46 UTC`` ('' for None)."""
    if not value:
        return ""
    moment = datetime.fromisoformat(value)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def seconds(value: float | None) -> str:
    if value is None:
        return "–"
    if value < 120:
        return f"{value:.2f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def percent(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"


def link_cell(kind: str, identifier: str | None) -> str:
    """Markdown for a grid cell linking to ``/<kind>/<id>``; only server-made ids become links."""
    if not identifier:
        return ""
    if not _LINKABLE.match(identifier):
        return identifier.replace("[", "").replace("]", "")
    return f"[{identifier}](/{kind}/{identifier})"


# --- pieces --------------------------------------------------------------------------------------

def navbar(owner: str | None, role: str | None) -> dbc.Navbar:
    links = [dbc.NavItem(dbc.NavLink(label, href=href, active=match)) for href, label, match in NAV]
    who = html.Span(f"{owner} · {role}", className="navbar-text text-light me-3") if owner else None
    return dbc.Navbar(
        dbc.Container([
            dbc.NavbarBrand("agentledger", href="/"),
            dbc.Nav(links, navbar=True, className="me-auto"),
            html.Div([who, html.A("Log out", href="/logout", className="btn btn-outline-light btn-sm")],
                     className="d-flex align-items-center"),
        ], fluid=True),
        color="dark", dark=True, className="mb-3",
    )


def page_header(title: str, subtitle: str | None = None, *extra, twin: str | None = None,
                twin_id: str | None = None) -> html.Div:
    """The page's title; ``twin`` is the path of its JSON twin, linked beside the title. The
    page's callback keeps the link's ``href`` (component ``twin_id``) on the page's filters
    (``params.twin_href``), so the link returns what the page shows."""
    kwargs = {"id": twin_id} if twin_id else {}
    link = (html.A("JSON", href=twin, className="small ms-2 fw-normal", title="this page as JSON",
                   **kwargs) if twin else None)
    return html.Div(
        [html.H3([title, link] if link else title, className="mb-0"),
         html.P(subtitle, className="text-muted mb-0") if subtitle else None, *extra],
        className="mb-3",
    )


def left_out_of_link(checks: dict[str, tuple[object, bool]]) -> dbc.Alert | None:
    """A note above the filters naming what the page's link asked for that the page cannot
    use (a status that is no status, a window it does not offer), or None when it used every
    value. Without it a pasted link that names a filter wrongly would show everything, and
    the filters' "any" would be the only sign. ``checks`` as ``params.left_out`` takes them."""
    left = params.left_out(checks)
    if not left:
        return None
    named = ", ".join(f"{name} “{value}”" for name, value in left)
    verb = "is not a value" if len(left) == 1 else "are not values"
    return dbc.Alert(f"This link's {named} {verb} this page takes: the filters below show what "
                     "it shows instead.", color="warning", className="py-2 small",
                     dismissable=True, id="link-left-out")


def empty_state(title: str, explanation: str, id: str | None = None) -> dbc.Alert:
    kwargs = {"id": id} if id else {}
    return dbc.Alert([html.H5(title, className="alert-heading"), html.P(explanation, className="mb-0")],
                     color="light", className="border", **kwargs)


def hidden_if(condition: bool) -> dict[str, str]:
    return {"display": "none"} if condition else {}


def kpi(label: str, value: Any, *, color: str = "dark", id: str | None = None) -> dbc.Card:
    body = html.Div(str(value), className=f"fs-3 fw-semibold text-{color}", **({"id": id} if id else {}))
    return dbc.Card(dbc.CardBody([html.Div(label, className="text-muted small"), body]),
                    className="h-100")


def kpi_row(cards: list) -> dbc.Row:
    return dbc.Row([dbc.Col(c, xs=6, md=4, xl=2, className="mb-2") for c in cards], className="g-2 mb-3")


def status_badge(status: str) -> html.Span:
    return html.Span(status, className="badge",
                     style={"backgroundColor": STATUS_COLORS.get(status, "#6c757d")})


def fact(label: str, value: Any) -> html.Tr:
    return html.Tr([html.Th(label, className="text-muted fw-normal pe-3", style={"width": "10rem"}),
                    html.Td(value)])


def facts(rows: list[html.Tr]) -> dbc.Table:
    """A two-column label / value table."""
    return dbc.Table(html.Tbody(rows), size="sm", borderless=True, className="mb-2")


def json_block(value: Any) -> html.Pre:
    """Any JSON value, pretty-printed as plain text."""
    return html.Pre(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False),
                    className="bg-light border rounded p-2 small mb-0",
                    style={"maxHeight": "24rem", "whiteSpace": "pre-wrap", "wordBreak": "break-word"})


def text_block(value: str) -> html.Pre:
    """Agent or user text, shown verbatim (wrapped), never interpreted."""
    return html.Pre(value, className="bg-light border rounded p-3 mb-0",
                    style={"whiteSpace": "pre-wrap", "wordBreak": "break-word"})


def loading(children, id: str | None = None, *,
            targets: dict[str, str] | None = None) -> dcc.Loading:
    """A spinner while ``children`` load; with ``targets`` (component id → property) only
    while those do, so a part of the page that updates itself (an event log's pager) does not
    blank the whole of it."""
    kwargs: dict[str, Any] = {"id": id} if id else {}
    if targets:
        kwargs["target_components"] = targets
    return dcc.Loading(children, type="default", delay_show=250, **kwargs)


def window_picker(prefix: str, key: str, since: object, until: object) -> dbc.Row:
    """Preset windows plus a custom date range (shown when 'Custom dates…' is picked), opened
    on the days of the URL that are days."""
    since, until = params.day_text(since), params.day_text(until)
    return dbc.Row([
        dbc.Col(dbc.Select(
            id=f"{prefix}-window",
            options=[{"label": label, "value": value}
                     for value, (label, _) in params.WINDOW_CHOICES.items()],
            value=key,
        ), width="auto"),
        dbc.Col(dcc.DatePickerRange(
            id=f"{prefix}-dates", start_date=since, end_date=until, display_format="YYYY-MM-DD",
            clearable=True, start_date_placeholder_text="from", end_date_placeholder_text="to",
        ), width="auto", id=f"{prefix}-dates-col", style=hidden_if(key != "custom")),
    ], className="g-2 align-items-center")


def labelled(label: str, control) -> html.Div:
    return html.Div([dbc.Label(label, className="small text-muted mb-1"), control])


def grid(id: str, columns: list[dict[str, Any]], *, height: str | None = None,
         compact: bool = False, **extra: Any) -> dag.AgGrid:
    """A read-only grid showing one server-side page; cells are text unless a column says
    ``cellRenderer: markdown`` (used only for the id links that ``link_cell`` builds).
    ``compact`` narrows the cells' side padding, for a grid of many short numbers."""
    options: dict[str, Any] = {"suppressCellFocus": True, "enableCellTextSelection": True}
    style: dict[str, Any] = {"height": height} if height else {}
    if compact:
        style["--ag-cell-horizontal-padding"] = "6px"
    if height is None:
        options["domLayout"] = "autoHeight"
    return dag.AgGrid(
        id=id,
        columnDefs=columns,
        rowData=extra.pop("rowData", []),
        defaultColDef={"resizable": True, "sortable": False, "filter": False, "width": 120},
        dashGridOptions=options,
        style=style,
        className="ag-theme-alpine",
        **extra,
    )


def link_column(field: str, header: str, **extra) -> dict[str, Any]:
    return {"field": field, "headerName": header, "cellRenderer": "markdown", "width": 245,
            **extra}


def status_column(field: str = "status", header: str = "Status") -> dict[str, Any]:
    """A status column, each status in its colour."""
    return {"field": field, "headerName": header, "width": 115, "cellStyle": {"styleConditions": [
        {"condition": f"params.value == '{status}'",
         "style": {"color": color, "fontWeight": 600 if status in ("failed", "interrupted") else 400}}
        for status, color in STATUS_COLORS.items()]}}


# --- server-side paging with keyset cursors -------------------------------------------------------

def pager(prefix: str) -> html.Div:
    return html.Div([
        dcc.Store(id=f"{prefix}-pager", data=new_pager()),
        dbc.ButtonGroup([
            dbc.Button("← Newer", id=f"{prefix}-prev", color="secondary", outline=True, size="sm",
                       disabled=True),
            dbc.Button("Older →", id=f"{prefix}-next", color="secondary", outline=True, size="sm",
                       disabled=True),
        ], className="me-2"),
        html.Span(id=f"{prefix}-page-label", className="text-muted small"),
    ], className="d-flex align-items-center my-2")


def paged_grid_outputs(prefix: str) -> list[Output]:
    """The outputs every paged listing updates, in the order its callback returns them: grid
    rows and visibility, the empty state and its visibility, the pager store, both buttons and
    the page label (``pager_view`` gives the last four)."""
    return [
        Output(f"{prefix}-grid", "rowData"),
        Output(f"{prefix}-grid", "style"),
        Output(f"{prefix}-empty", "children"),
        Output(f"{prefix}-empty", "style"),
        Output(f"{prefix}-pager", "data"),
        Output(f"{prefix}-prev", "disabled"),
        Output(f"{prefix}-next", "disabled"),
        Output(f"{prefix}-page-label", "children"),
    ]


def new_pager() -> dict[str, Any]:
    return {"cursors": [None], "page": 0, "next": None}


def _well_formed(state: Any) -> dict[str, Any] | None:
    """``state`` when it is a pager as ``pager_view`` writes it, else None. The store lives in
    the browser, which may send back anything at all; a pager holds the cursor of each page
    read so far (the first page's None, the others' strings), the page shown (an index into
    them) and the next page's cursor (a string, or None on the last page). Whether a cursor
    string is one this server made is the query's to say: ``BadCursor``, 400, as in the twins."""
    if not isinstance(state, dict):
        return None
    cursors, page, after = state.get("cursors"), state.get("page"), state.get("next")
    if (not isinstance(cursors, list) or not cursors or cursors[0] is not None
            or not all(isinstance(c, str) for c in cursors[1:])):
        return None
    if type(page) is not int or not 0 <= page < len(cursors):  # bool is an int, not a page
        return None
    if after is not None and not isinstance(after, str):
        return None
    return {"cursors": cursors, "page": page, "next": after}


def pager_step(state: Any, trigger: str | None, prefix: str) -> dict[str, Any]:
    """The pager after a click (``<prefix>-next`` / ``<prefix>-prev``); anything else (a
    filter change, the first load) starts again at the first page. So does a click on a pager
    that is not well formed (``_well_formed``): a stale or edited store is nothing the user
    could fix, and the first page is the page they opened."""
    state = _well_formed(state)
    if state is None:
        return new_pager()
    if trigger == f"{prefix}-next" and state["next"]:
        page = state["page"] + 1
        return {"cursors": state["cursors"][:page] + [state["next"]], "page": page, "next": None}
    if trigger == f"{prefix}-prev" and state["page"] > 0:
        return {"cursors": state["cursors"], "page": state["page"] - 1, "next": None}
    if trigger in (f"{prefix}-next", f"{prefix}-prev"):
        return {**state, "next": None}
    return new_pager()


def pager_view(state: dict[str, Any], shown: int, next_cursor: str | None,
               page_size: int | None = None):
    """(store data, newer disabled, older disabled, label) once a page has been read."""
    state = {**state, "next": next_cursor}
    first = state["page"] * (page_size or PAGE_SIZE) + 1
    label = f"rows {first}–{first + shown - 1}" if shown else "no rows"
    if next_cursor:
        label += " · more below"
    return state, state["page"] == 0, not next_cursor, label


# --- filters in the URL ----------------------------------------------------------------------------

def window_params(key: str, since: object, until: object) -> dict[str, Any]:
    """The window's part of the page's URL: the preset, or ``custom`` and its days."""
    custom = key == "custom"
    return {"window": key, "since": params.day_text(since) if custom else None,
            "until": params.day_text(until) if custom else None}


def url_search(values: dict[str, Any], defaults: dict[str, Any], current: str | None):
    """The page's canonical query string after a user changed a filter (pushed to the browser's
    history, so the link can be shared); ``no_update`` on the first load or when unchanged."""
    search = params.query_string(values, defaults)
    if ctx.triggered_id is None or search == (current or ""):
        return no_update
    return search


# How many agents a filter drop-down offers at once; typing narrows them by id or name.
AGENT_CHOICES = 100


def agent_options(search: object = None, keep: object = None) -> list[dict[str, str]]:
    """A filter drop-down's agents (current name, id): those whose id or name holds the text
    typed (``search``), the first ``AGENT_CHOICES`` by id, and always the agent chosen
    (``keep``). A drop-down drops a value that is not among its options, so without it a link's
    filter on an agent past the first few, or on no agent at all, was silently cleared and the
    page showed every agent's rows where its twin showed that agent's."""
    from queries.agents_catalog import agent_choices, get_agent

    chosen = params.agent(keep)
    with read() as s:
        options = [{"label": f"{a['name']} ({a['id']})", "value": a["id"]}
                   for a in agent_choices(s, params.text(search), limit=AGENT_CHOICES)]
        if chosen and all(o["value"] != chosen for o in options):
            known = get_agent(s, chosen, with_versions=False)
            label = f"{known['name']} ({chosen})" if known else f"{chosen} (no such agent)"
            options.insert(0, {"label": label, "value": chosen})
    return options


def agent_choices_callback(prefix: str) -> None:
    """Fills ``{prefix}-agent``'s options when the page opens and as the user types."""

    @callback(Output(f"{prefix}-agent", "options"), Input(f"{prefix}-url", "pathname"),
              Input(f"{prefix}-agent", "search_value"), State(f"{prefix}-agent", "value"))
    def load_agents(_pathname, search, value):
        return agent_options(search, keep=value)


def agent_dropdown(id: str, value: str | None, placeholder: str = "any agent") -> dcc.Dropdown:
    return dcc.Dropdown(id=id, value=value, placeholder=placeholder, clearable=True,
                        options=[{"label": value, "value": value}] if value else [],
                        style={"minWidth": "14rem"})


ANY = "any"
STATUS_FILTER_OPTIONS = [{"label": "any status", "value": ANY}] + [
    {"label": s, "value": s}
    for s in ("queued", "running", "cancelling", "succeeded", "failed", "cancelled", "interrupted")
]


def duration(start: str | None, end: str | None) -> str:
    if not start or not end:
        return ""
    return seconds((datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds())
