"""``/messages/<message_id>``: the provenance of one answer.

The answer, the run that produced it, the agent name and version frozen in that run's snapshot,
both snapshots, what the run had in memory (its thread's earlier turns), the run's events, a
link to its tree, and how the agent has changed since.
"""

from __future__ import annotations

import dash
import dash_bootstrap_components as dbc
from dash import Input, Output, dcc, html

from dashboards import components as ui
from dashboards import event_log, params
from dashboards.page_registry import callback
from queries.agents_catalog import get_agent
from queries.provenance import UserMessage, diff_agent_versions, message_provenance

P = "message"


def layout(message_id: str | None = None, **_):
    return html.Div([
        dcc.Store(id=f"{P}-id", data=message_id),
        ui.loading(html.Div(id=f"{P}-body"), targets={f"{P}-body": "children"}),
    ])


def _context_table(pack: dict) -> html.Div:
    items = pack.get("items", [])
    if not items:
        return ui.empty_state("No context", "This run was given no context items to read.")
    return html.Div([
        dbc.Table(
            [html.Thead(html.Tr([html.Th("Item"), html.Th("Title"), html.Th("Version"),
                                 html.Th("sha256 of the content")])),
             html.Tbody([html.Tr([html.Td(i.get("id")), html.Td(i.get("title")),
                                  html.Td(str(i.get("version", ""))),
                                  html.Td(html.Code(i.get("sha256", "")))]) for i in items])],
            size="sm", responsive=True, className="mb-1"),
        html.Div(["pack hash ", html.Code(pack.get("pack_hash", ""))], className="small text-muted"),
    ])


def _memory(history: list[dict]) -> html.Div:
    """The thread's earlier turns the run was given, oldest first; answers link to their own
    provenance."""
    if not history:
        return ui.empty_state("Nothing in memory",
                              "This was the first run of its thread (or a delegated run, whose "
                              "thread is its own): it was given no earlier turns.")
    rows = []
    for turn in history:
        if turn["role"] == "assistant":
            who = dcc.Link("assistant", href=f"/messages/{turn['message_id']}")
        else:
            who = html.Span("user")
        rows.append(html.Tr([
            html.Td(who), html.Td(ui.text_block(turn["content"])),
            html.Td(dcc.Link(turn["run_id"], href=f"/runs/{turn['run_id']}")),
            html.Td(ui.when(turn["created_at"])),
        ]))
    return html.Div([
        html.P(f"{len(history)} earlier turn{'s' if len(history) != 1 else ''} of the thread, "
               "oldest first.", className="small text-muted"),
        dbc.Table([html.Thead(html.Tr([html.Th("Role"), html.Th("Content"), html.Th("Run"),
                                       html.Th("At")])),
                   html.Tbody(rows)], size="sm", responsive=True, className="mb-0",
                  id=f"{P}-memory"),
    ])


def _since_then(agent_id: str, version: int, current: dict | None, diff: dict | None):
    if current is None:
        return ui.empty_state("Agent no longer registered", f"Agent {agent_id} is not in the catalog.")
    if current["version"] == version:
        return html.P(f"Version {version} is still the agent's current version.", className="mb-0")
    if diff is None:
        return html.P("The versions could not be compared.", className="mb-0")
    rows = [html.Tr([html.Td(c["field"]), html.Td(ui.json_block(c["before"])),
                     html.Td(ui.json_block(c["after"]))]) for c in diff["changes"]]
    return html.Div([
        html.P(f"The agent is now at version {current['version']} ({current['name']}). "
               f"What changed since version {version}:"),
        dbc.Table([html.Thead(html.Tr([html.Th("Field"), html.Th(f"v{version} (this answer)"),
                                       html.Th(f"v{current['version']} (today)")])),
                   html.Tbody(rows)], size="sm", responsive=True, className="mb-0"),
    ])


@callback(Output(f"{P}-body", "children"), Input(f"{P}-id", "data"))
def show(asked):
    if not isinstance(asked, str) or not asked:
        return ui.empty_state("No message", "Open an answer from the Messages page.")
    message_id = params.identifier(asked) or ""  # anything that is no id of ours names nothing
    with ui.read() as s:
        try:
            found = message_provenance(s, message_id) if message_id else None
        except UserMessage:
            return ui.empty_state(
                "This is a user's message",
                f"{message_id} was written by a user. Provenance exists only for assistant answers.")
        if found is None:
            return ui.empty_state("No such answer", f"There is no message "
                                  f"{params.text(asked) or ''}. Search on the Messages page.")
        run = found["run"]
        agent = found["agent"]
        events = event_log.first_page(s, run["id"])
        current = get_agent(s, agent["id"], with_versions=False)
        diff = (diff_agent_versions(s, agent["id"], agent["version"], current["version"])
                if current and current["version"] != agent["version"] else None)
    message = found["message"]
    session = found["session"]
    snapshot = found["agent_execution_snapshot"]
    return html.Div([
        ui.page_header(f"Answer {message['id']}", f"answered {ui.when(message['created_at'])}"),
        # A plain link: the API accepts the login cookie for GETs, and the response is an
        # attachment, so the browser saves the file instead of leaving the page.
        html.A("Download evidence", id=f"{P}-evidence", href=f"/api/messages/{message['id']}/evidence",
               download=f"evidence-{message['id']}.json",
               className="btn btn-outline-primary btn-sm mb-3"),
        dbc.Row([
            dbc.Col([
                dbc.Card([dbc.CardHeader("The answer"), dbc.CardBody(ui.text_block(message["content"]))],
                         className="mb-3"),
                dbc.Card([dbc.CardHeader("Produced by"), dbc.CardBody(ui.facts([
                    ui.fact("Agent", html.Span([html.B(agent["name"]), f"  version {agent['version']}  ",
                                              html.Code(agent["id"])])),
                    ui.fact("Run", html.Span([dcc.Link(run["id"], href=f"/runs/{run['id']}"), " ",
                                            ui.status_badge(run["status"])])),
                    ui.fact("Run tree", dcc.Link("open the whole tree", href=f"/runs/{run['id']}")),
                    ui.fact("Executor", run["executor_instance_id"] or "–"),
                    ui.fact("Queued / started / ended", " → ".join(
                        ui.when(run[k]) or "–" for k in ("created_at", "started_at", "finished_at"))),
                    ui.fact("Session", f"{session['title'] or '(untitled)'} · {session['id']} · owner "
                                     f"{session['owner_id']}" if session else "– (a delegated run)"),
                ]))], className="mb-3"),
                dbc.Card([dbc.CardHeader("Since then"),
                          dbc.CardBody(_since_then(agent["id"], agent["version"], current, diff))],
                         className="mb-3"),
            ], lg=6),
            dbc.Col([
                dbc.Card([dbc.CardHeader("Agent execution snapshot (frozen when the run was created)"),
                          dbc.CardBody([
                              ui.facts([ui.fact("Kind", snapshot.get("kind")),
                                      ui.fact("Model", snapshot.get("model") or "–"),
                                      ui.fact("Content hash", html.Code(snapshot.get("content_hash")))]),
                              html.Div("Instructions", className="text-muted small mt-2"),
                              ui.text_block(snapshot.get("instructions") or ""),
                              html.Div("Tools and parameters", className="text-muted small mt-2"),
                              ui.json_block({"tools": snapshot.get("tools"),
                                             "params": snapshot.get("params")}),
                          ])], className="mb-3"),
                dbc.Card([dbc.CardHeader("Context pack snapshot"),
                          dbc.CardBody(_context_table(found["context_pack_snapshot"]))],
                         className="mb-3"),
            ], lg=6),
        ]),
        dbc.Card([dbc.CardHeader("In memory when it answered"),
                  dbc.CardBody(_memory(found["history"]))], className="mb-3"),
        dbc.Card([dbc.CardHeader(f"Events of run {run['id']}"),
                  dbc.CardBody(event_log.event_log(P, events))]),
    ])


dash.register_page(__name__, path_template="/messages/<message_id>",
                   name="Answer", title="agentledger · answer", order=2, layout=layout)
