"""A run's event log on a page: ``PAGE_SIZE`` events at a time, in seq order, with a pager.

The first page comes with the page itself (read in the same transaction, no extra round trip).
The pager goes to the first, earlier, later and last page; the last page holds the run's latest
event, its terminal event once the run has ended, so that is always one click away. The label
says which seqs are shown and how many events the run has. Seqs are gapless, so page ``k``
holds seqs ``k * PAGE_SIZE + 1 … (k + 1) * PAGE_SIZE``, and every page is one keyed read of
``queries.run_events.events_page``.

A log is drawn inside another callback's output (an answer's provenance, the selected node of
a run tree), so its components have pattern ids, ``{"type": "event-log-<part>", "log": <page
prefix>}``, and one MATCH callback turns the pages of whichever log was clicked. Event data is
JSON that may hold agent output: it is shown as text, never as markup.
"""

from __future__ import annotations

import json
from typing import Any

import dash_bootstrap_components as dbc
from dash import MATCH, Input, Output, State, ctx, dcc, html

from agentledger.core.vocabulary import TERMINAL
from dashboards import components as ui
from dashboards import params
from dashboards.page_registry import callback
from queries.run_events import EventsPage, events_page

PAGE_SIZE = 200
BUTTONS = (
    ("first", "« First", "the first events of the run"),
    ("prev", "‹ Earlier", f"the {PAGE_SIZE} events before these"),
    ("next", "Later ›", f"the {PAGE_SIZE} events after these"),
    ("last", "Last »", "the run's latest events (its terminal event once it has ended)"),
)


def part_id(part: str, log: Any) -> dict[str, Any]:
    """The id of one part of a page's log (``log`` is the page's prefix, or ``MATCH``)."""
    return {"type": f"event-log-{part}", "log": log}


def first_page(session, run_id: str) -> EventsPage | None:
    """The log's opening page, read in the caller's transaction."""
    return events_page(session, run_id, limit=PAGE_SIZE)


def event_log(log: str, page: EventsPage | None) -> html.Div:
    """The log of ``page``'s run, opened at ``page`` (the first one)."""
    if page is None:
        return ui.empty_state("No such run", "The run is not in the ledger.")
    disabled = _disabled(page, 0)
    return html.Div([
        dcc.Store(id=part_id("state", log), data={"run_id": page.run_id, "after": 0}),
        html.Div([
            dbc.ButtonGroup([
                dbc.Button(text, id=part_id(part, log), title=f"Show {what}", color="secondary",
                           outline=True, size="sm", disabled=off)
                for (part, text, what), off in zip(BUTTONS, disabled, strict=True)
            ], className="me-2"),
            html.Span(label(page), id=part_id("label", log), className="text-muted small"),
        ], className="d-flex align-items-center flex-wrap gap-1 mb-2"),
        ui.loading(html.Div(events_table(page.events), id=part_id("table", log))),
    ])


def events_table(events: list[dict]) -> html.Div:
    """Events as text (their data is JSON, possibly agent output)."""
    if not events:
        return ui.empty_state("No events", "This run has no events here.")
    body = [
        html.Tr([html.Td(e["seq"]), html.Td(html.Code(e["type"])), html.Td(ui.when(e["created_at"])),
                 html.Td(html.Pre(json.dumps(e["data"], ensure_ascii=False, sort_keys=True),
                                  className="mb-0 small",
                                  style={"whiteSpace": "pre-wrap", "wordBreak": "break-word"}))])
        for e in events
    ]
    return dbc.Table([html.Thead(html.Tr([html.Th("#"), html.Th("Type"), html.Th("At"),
                                          html.Th("Data")])),
                      html.Tbody(body)], size="sm", hover=True, responsive=True, className="mb-1")


def label(page: EventsPage) -> str:
    """Which seqs are shown, of how many events (``so far`` while the run has not ended)."""
    total = page.last_event_seq
    so_far = "" if page.status in TERMINAL else " so far"
    if not page.events:
        return f"No events yet{so_far}." if total == 0 else f"No events here; the run has {total:,}."
    first, last = page.events[0]["seq"], page.events[-1]["seq"]
    return f"Showing seq {first:,}–{last:,} of {total:,} events{so_far}"


def page_after(part: str | None, after: int, last_event_seq: int) -> int:
    """Where the page a button asks for starts (the seq its first event follows)."""
    if part == "first":
        return 0
    if part == "prev":
        return max(0, after - PAGE_SIZE)
    if part == "next" and after + PAGE_SIZE < last_event_seq:
        return after + PAGE_SIZE
    if part == "last":
        return max(0, last_event_seq - 1) // PAGE_SIZE * PAGE_SIZE
    return after


def _disabled(page: EventsPage, after: int) -> list[bool]:
    """(first, earlier, later, last) disabled. ``Last`` stays on while the run is still going:
    it then reads the newest events."""
    more = page.next_after_seq < page.last_event_seq
    return [after == 0, after == 0, not more, not more and page.status in TERMINAL]


@callback(
    Output(part_id("table", MATCH), "children"),
    Output(part_id("state", MATCH), "data"),
    Output(part_id("label", MATCH), "children"),
    *[Output(part_id(part, MATCH), "disabled") for part, _, _ in BUTTONS],
    *[Input(part_id(part, MATCH), "n_clicks") for part, _, _ in BUTTONS],
    State(part_id("state", MATCH), "data"),
    # The first page is drawn with the log; only a click reads another one.
    prevent_initial_call=True,
)
def turn_page(*values):
    state = values[-1] if isinstance(values[-1], dict) else {}
    run_id = params.identifier(state.get("run_id"))
    after = params.integer(state.get("after"), 0, low=0, high=2**31 - 1)  # seq is an int32
    after -= after % PAGE_SIZE  # a page boundary, whatever the browser sent
    clicked = ctx.triggered_id
    part = str(clicked.get("type", "")).removeprefix("event-log-") if isinstance(clicked, dict) else None
    page = None
    if run_id:
        with ui.read() as s:
            if part in ("next", "last"):
                # The run's newest seq now (a run that is still going has more events than
                # when the page was drawn): the head alone, no events.
                head = events_page(s, run_id, limit=0)
                after = page_after(part, after, head.last_event_seq) if head else after
            else:
                after = page_after(part, after, 0)
            page = events_page(s, run_id, after_seq=after, limit=PAGE_SIZE)
    if page is None:
        gone = ui.empty_state("No such run", "The run is not in the ledger.")
        return gone, {"run_id": run_id, "after": 0}, "", True, True, True, True
    return (events_table(page.events), {"run_id": run_id, "after": after}, label(page),
            *_disabled(page, after))
