"""Runs: detail, list, events (JSON pages and Server-Sent Events), cancel, tree, provenance."""

from __future__ import annotations

import json

from flask import Response, jsonify

from agentledger.api import api
from agentledger.api.operations import READERS, WRITERS
from agentledger.api.request_scope import (
    actor,
    owner_scope,
    principal,
    read_one,
    run_not_found,
    state,
)
from agentledger.api.requests import EventsQuery, RunListQuery
from agentledger.api.responses import (
    CancelOut,
    EventsOut,
    EvidenceOut,
    ProvenanceOut,
    RunList,
    RunOut,
    TreeOut,
)
from agentledger.api.stream import event_stream_response, wants_event_stream
from agentledger.core.errors import NotAnAssistantMessage, NotFound
from agentledger.core.vocabulary import RUN_FOLLOWER_ROLES
from ingest.admin_log import record
from ingest.cancel import request_cancel
from queries.evidence import evidence_bundle
from queries.provenance import UserMessage, message_provenance
from queries.run_events import events_page
from queries.run_tree import run_tree
from queries.runs import RunFilters, get_run, list_runs

SSE_CONTENT = {200: {"text/event-stream": {"schema": {"type": "string"}}}}


@api.route("/agent-runs/<run_id>", "GET", summary="One run: status, snapshots, lease, timing",
           roles=RUN_FOLLOWER_ROLES, responses={200: RunOut}, errors=(404,), tag="runs")
def runs_detail(run_id: str):
    run = read_one(get_run, run_id, visible_to=owner_scope(), admin=principal().role == "admin")
    if run is None:
        raise run_not_found(run_id)
    return jsonify(run)


@api.route("/agent-runs", "GET", summary="Runs matching filters, newest first", roles=READERS,
           query=RunListQuery, responses={200: RunList}, tag="runs")
def runs_index(query: RunListQuery):
    filters = RunFilters(
        status=query.status, agent_id=query.agent_id, session_id=query.session_id,
        root_run_id=query.root_run_id, created_after=query.created_after,
        created_before=query.created_before,
    )
    with state().db.read() as s:
        page = list_runs(s, filters, visible_to=owner_scope(), limit=query.limit, cursor=query.cursor)
    return jsonify(page.as_dict())


@api.route("/agent-runs/<run_id>/events", "GET",
           summary="The run's events: JSON pages, or Server-Sent Events with Accept: text/event-stream",
           roles=RUN_FOLLOWER_ROLES, query=EventsQuery, responses={200: EventsOut, 204: None},
           errors=(404,), tag="runs", extra_content=SSE_CONTENT,
           headers={"Last-Event-ID": "SSE: resume after this seq"})
def runs_events(run_id: str, query: EventsQuery):
    if wants_event_stream():
        return event_stream_response(run_id, query.after_seq)
    page = read_one(events_page, run_id, after_seq=query.after_seq, limit=query.limit,
                    visible_to=owner_scope())
    if page is None:
        raise run_not_found(run_id)
    return jsonify(page.as_dict())


@api.route("/agent-runs/<run_id>/cancel", "POST",
           summary="Cancel the run and its unfinished descendants", roles=WRITERS,
           responses={202: CancelOut}, errors=(404, 409), tag="runs")
def runs_cancel(run_id: str):
    with state().db.write() as s:
        status = request_cancel(s, run_id, requested_by=principal().owner_id,
                                visible_to=owner_scope())
        record(s, actor(), "run.cancel_requested", "run", run_id, {"status": status})
    return jsonify({"run_id": run_id, "status": status}), 202


@api.route("/agent-runs/<run_id>/tree", "GET", summary="The whole delegation tree of any of its runs",
           roles=READERS, responses={200: TreeOut}, errors=(404,), tag="runs")
def runs_tree(run_id: str):
    tree = read_one(run_tree, run_id, visible_to=owner_scope())
    if tree is None:
        raise run_not_found(run_id)
    return jsonify(tree)


@api.route("/messages/<message_id>/provenance", "GET",
           summary="Which run, agent version and context produced this answer", roles=READERS,
           responses={200: ProvenanceOut}, errors=(404, 422), tag="runs")
def message_provenance_view(message_id: str):
    return jsonify(_of_answer(message_provenance, message_id, "provenance"))


def _of_answer(query, message_id: str, what: str):
    """``query`` about an assistant message the caller may see: 422 for a user message, 404
    for one that does not exist for the caller."""
    try:
        found = read_one(query, message_id, visible_to=owner_scope())
    except UserMessage as exc:
        raise NotAnAssistantMessage(
            f"message {message_id} is a user message; {what} exists only for answers"
        ) from exc
    if found is None:
        raise NotFound(f"message {message_id} does not exist")
    return found



@api.route("/messages/<message_id>/evidence", "GET",
           summary="Evidence bundle of an answer: its whole run tree, snapshots, events and hashes",
           roles=READERS, responses={200: EvidenceOut}, errors=(404, 422), tag="runs")
def message_evidence_view(message_id: str):
    bundle = _of_answer(evidence_bundle, message_id, "evidence")
    body = json.dumps(bundle, ensure_ascii=False, indent=1, sort_keys=True)
    return Response(body, mimetype="application/json", headers={
        "Content-Disposition": f'attachment; filename="evidence-{message_id}.json"'})
