"""``/runs/<run_id>``: the whole delegation tree of a run as a graph (root on top), each node's
status and timing; clicking a node shows its events and snapshots. Failed and interrupted runs
have a heavy red border (dashed when interrupted)."""

from __future__ import annotations

from collections import Counter

import dash
import dash_bootstrap_components as dbc
import dash_cytoscape as cyto
from dash import Input, Output, dcc, html

from dashboards import components as ui
from dashboards import event_log, figures, params
from dashboards.page_registry import callback
from queries.archived_runs import archived_run, archived_run_sentence
from queries.run_tree import run_tree
from queries.runs import get_run

P = "run"


def layout(run_id: str | None = None, **_):
    return html.Div([
        dcc.Store(id=f"{P}-id", data=run_id),
        ui.loading(html.Div(id=f"{P}-header")),
        dbc.Row([
            dbc.Col(dbc.Card([
                dbc.CardHeader(["Run tree ",
                                html.Span("(click a run to see its events and snapshots)",
                                          className="small text-muted")]),
                dbc.CardBody(cyto.Cytoscape(
                    id=f"{P}-tree", elements=[], stylesheet=figures.TREE_STYLESHEET,
                    layout={"name": "preset"}, style={"width": "100%", "height": "520px"},
                    minZoom=0.3, maxZoom=2, userZoomingEnabled=True, boxSelectionEnabled=False,
                    autoungrabify=True,
                ), className="p-1"),
            ]), lg=6, className="mb-3"),
            dbc.Col(ui.loading(html.Div(id=f"{P}-node"), targets={f"{P}-node": "children"}),
                    lg=6, className="mb-3"),
        ]),
    ])


@callback(
    Output(f"{P}-header", "children"),
    Output(f"{P}-tree", "elements"),
    Output(f"{P}-tree", "layout"),
    Input(f"{P}-id", "data"),
)
def load_tree(asked):
    run_id = params.identifier(asked)  # anything that is no id of ours names no run
    with ui.read() as s:
        tree = run_tree(s, run_id) if run_id else None
        archived = archived_run(s, run_id) if run_id and tree is None else None
    if archived is not None:
        sentence = archived_run_sentence(archived)
        missing = ui.empty_state("Archived run", sentence[0].upper() + sentence[1:] + ".")
        return missing, [], {"name": "preset"}
    if tree is None:
        missing = ui.empty_state("No such run", f"There is no run {params.text(asked) or ''}. "
                                 "Find runs on the Runs page.")
        return missing, [], {"name": "preset"}
    nodes = tree["nodes"]
    counts = Counter(n["status"] for n in nodes)
    header = html.Div([
        ui.page_header(f"Run {run_id}", None),
        html.Div([
            html.Span("1 run in this tree" if len(nodes) == 1 else f"{len(nodes)} runs in this tree",
                      id=f"{P}-count", className="me-3 fw-semibold"),
            *[html.Span([ui.status_badge(status), f" {n}"], className="me-2")
              for status, n in sorted(counts.items())],
            html.Span(["root ", dcc.Link(tree["root_run_id"], href=f"/runs/{tree['root_run_id']}")],
                      className="ms-3 small text-muted"),
        ], className="mb-3"),
    ])
    return header, figures.tree_elements(nodes, focus=run_id), figures.tree_layout(tree["root_run_id"])


@callback(
    Output(f"{P}-node", "children"),
    Input(f"{P}-tree", "tapNodeData"),
    Input(f"{P}-id", "data"),
)
def show_node(tapped, run_id):
    tapped_id = tapped.get("id") if isinstance(tapped, dict) else None
    node_id = params.identifier(tapped_id) or params.identifier(run_id)
    if not node_id:
        return None
    with ui.read() as s:
        run = get_run(s, node_id)
        events = event_log.first_page(s, node_id) if run else None
    if run is None:
        return None
    error = run["error"]
    answer = (dcc.Link(run["final_message_id"], href=f"/messages/{run['final_message_id']}")
              if run["final_message_id"] else "–")
    return dbc.Card([
        dbc.CardHeader([html.B(f"{run['agent_name']} v{run['agent_version']}"), " ",
                        ui.status_badge(run["status"]), " ", html.Code(run["id"], id=f"{P}-selected")]),
        dbc.CardBody([
            ui.facts([
                ui.fact("Parent", dcc.Link(run["parent_run_id"], href=f"/runs/{run['parent_run_id']}")
                      if run["parent_run_id"] else "– (root)"),
                ui.fact("Created", ui.when(run["created_at"])),
                ui.fact("Started", ui.when(run["started_at"]) or "never"),
                ui.fact("Ended", ui.when(run["finished_at"]) or "not yet"),
                ui.fact("Queued / ran", f"{ui.duration(run['created_at'], run['started_at'] or run['finished_at']) or '–'}"
                                      f" / {ui.duration(run['started_at'], run['finished_at']) or '–'}"),
                ui.fact("Executor", run["executor_instance_id"] or "–"),
                ui.fact("Lease until", ui.when(run["lease_expires_at"]) or "–"),
                ui.fact("Answer", answer),
                ui.fact("Error", ui.json_block(error) if error else "–"),
            ]),
            dbc.Tabs([
                dbc.Tab(event_log.event_log(P, events), label="Events",
                        tab_id="events", className="pt-2"),
                dbc.Tab(ui.json_block(run["agent_execution_snapshot"]), label="Agent snapshot",
                        tab_id="agent", className="pt-2"),
                dbc.Tab(ui.json_block(run["context_pack_snapshot"]), label="Context pack",
                        tab_id="context", className="pt-2"),
            ], active_tab="events", id=f"{P}-tabs"),
        ]),
    ])


dash.register_page(__name__, path_template="/runs/<run_id>", name="Run tree",
                   title="agentledger · run tree", order=4, layout=layout)
