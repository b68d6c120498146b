"""Executor routes: the execution path for agent platforms in any language.

The built-in worker calls the same ``ingest`` functions in-process; these routes are the HTTP
face of exactly that code path.
"""

from __future__ import annotations

import hashlib
import time

from flask import jsonify, request

from agentledger.api import api
from agentledger.api.idempotency import KEY_RULE, idempotency_key
from agentledger.api.request_scope import state
from agentledger.api.requests import AppendEventsBody, ClaimBody, CreateChildBody, HeartbeatBody
from agentledger.api.responses import AppendEventsOut, ChildOut, ClaimOut, HeartbeatOut
from agentledger.core.errors import IllegalTransition, ValidationFailed
from ingest.event_types import DATA_MODELS, EXECUTOR_APPENDABLE
from ingest.events import AppendKey, append_events_alone
from ingest.leases import claim_runs, heartbeat
from ingest.runs import create_child_run, idempotency_key_hash

EXECUTORS = ("executor", "admin")


@api.route("/executor/claim", "POST", summary="Lease queued runs (per-thread FIFO)",
           roles=EXECUTORS, body=ClaimBody, responses={200: ClaimOut}, errors=(422,),
           tag="executor")
def executor_claim(body: ClaimBody, raw_body):
    settings = state().settings
    notifier = state().notifier
    # Read before the claim, so that a run queued while it runs ends the wait at once.
    seen = notifier.queue_generation() if body.wait_seconds else 0
    with state().db.write() as s:
        claimed = claim_runs(s, body.executor_instance_id, max_runs=body.max_runs,
                             lease_seconds=body.lease_seconds or settings.lease_seconds)
    if not claimed and body.wait_seconds:
        _wait_for_the_queue(seen, body.wait_seconds)
    return jsonify({"runs": [
        {
            "run_id": c.run_id,
            "thread_id": c.thread_id,
            "root_run_id": c.root_run_id,
            "parent_run_id": c.parent_run_id,
            "input": c.input,
            "agent_execution_snapshot": c.agent_execution_snapshot,
            "context_pack_snapshot": c.context_pack_snapshot,
            "context": c.context,
            "history": c.history,
            "lease_expires_at": c.lease_expires_at.isoformat(),
        }
        for c in claimed
    ]})


def _wait_for_the_queue(seen: int, seconds: float) -> None:
    """Until a run is queued or a thread's run ends (either may make a run claimable), or
    ``seconds`` pass. Nothing is claimed after the wait: a server cannot tell that the caller
    went away meanwhile (a worker stopping), and a run claimed for nobody would wait for its
    lease to expire and end interrupted. The caller claims again instead, one request more per
    wake-up. An executor over HTTP thus starts a run within milliseconds of its queueing, not
    at its next poll."""
    notifier = state().notifier
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if notifier.wait_for_queue(seen, left) != seen:
            return


@api.route("/executor/runs/<run_id>/heartbeat", "POST", summary="Extend the lease",
           roles=EXECUTORS, body=HeartbeatBody, responses={200: HeartbeatOut},
           errors=(404, 409, 422), tag="executor")
def executor_heartbeat(run_id: str, body: HeartbeatBody, raw_body):
    with state().db.write() as s:
        # For as long as the claim leased it: the caller chose that (``lease_seconds``).
        beat = heartbeat(s, run_id, body.executor_instance_id)
    return jsonify({"lease_expires_at": beat.lease_expires_at.isoformat(),
                    "cancel_requested": beat.cancel_requested})


def _append_key() -> AppendKey | None:
    """The request's ``Idempotency-Key`` with the checksum of the request as sent (a retry of
    the same call sends the same bytes); None without a key."""
    key = idempotency_key(required=False)
    if key is None:
        return None
    return AppendKey(idempotency_key_hash(key), hashlib.sha256(request.get_data()).hexdigest())


@api.route("/executor/runs/<run_id>/events", "POST",
           summary="Append events; the whole batch or nothing", roles=EXECUTORS,
           body=AppendEventsBody, responses={200: AppendEventsOut}, errors=(404, 409, 422),
           tag="executor",
           headers={"Idempotency-Key": f"optional; {KEY_RULE}: the same append sent again "
                                       "(its answer lost) is answered, not written twice"})
def executor_events(run_id: str, body: AppendEventsBody, raw_body):
    batch = []
    for event in body.events:
        if event.type not in DATA_MODELS:
            raise ValidationFailed(f"unknown event type {event.type!r}")
        if event.type not in EXECUTOR_APPENDABLE:
            raise IllegalTransition(f"{event.type} is written by the ledger, not by executors")
        batch.append((event.type, event.data))
    result = append_events_alone(state().db, run_id, batch,
                                 executor_instance_id=body.executor_instance_id,
                                 key=_append_key())
    return jsonify({"seqs": result.seqs, "cancel_requested": result.cancel_requested})


@api.route("/executor/runs/<run_id>/children", "POST", summary="Delegate: create a child run",
           roles=EXECUTORS, body=CreateChildBody, responses={201: ChildOut},
           errors=(404, 409, 422), tag="executor",
           headers={"Idempotency-Key": f"optional; {KEY_RULE}: the same request sent again "
                                       "(its answer lost) answers the child it created"})
def executor_children(run_id: str, body: CreateChildBody, raw_body):
    key = _append_key()
    with state().db.write() as s:
        child_id = create_child_run(s, run_id, agent_id=body.agent_id, input=body.input,
                                    executor_instance_id=body.executor_instance_id, key=key)
    return jsonify({"run_id": child_id, "events_url": f"/api/agent-runs/{child_id}/events"}), 201
