"""Sessions, their history, and posting a message (which creates a run)."""

from __future__ import annotations

from flask import jsonify, request

from agentledger.api import api
from agentledger.api.idempotency import KEY_RULE, idempotency_key
from agentledger.api.operations import READERS, WRITERS
from agentledger.api.request_scope import actor, owner_scope, principal, read_one, state
from agentledger.api.requests import CreateSessionBody, ListQuery, PatchSessionBody, PostMessageBody
from agentledger.api.responses import MessageList, PostMessageOut, SessionList, SessionOut
from agentledger.core.errors import NotFound
from ingest.admin_log import record
from ingest.runs import ContextItem, post_message_alone
from ingest.sessions import create_session, delete_session, update_session
from queries.sessions import get_session, list_sessions, session_messages


def _session_or_404(session_id: str, *, after_write: bool = False):
    if after_write:
        with state().db.read(primary=True) as s:
            found = get_session(s, session_id, visible_to=owner_scope())
    else:
        found = read_one(get_session, session_id, visible_to=owner_scope())
    if found is None:
        raise NotFound(f"session {session_id} does not exist")
    return found


@api.route("/sessions", "POST", summary="Open a session (its thread is created with it)",
           roles=WRITERS, body=CreateSessionBody, responses={201: SessionOut}, errors=(422,),
           tag="sessions")
def sessions_create(body: CreateSessionBody, raw_body):
    with state().db.write() as s:
        session_id = create_session(s, owner_id=principal().owner_id, agent_id=body.agent_id,
                                    title=body.title)
    return jsonify(_session_or_404(session_id, after_write=True)), 201


@api.route("/sessions", "GET", summary="List sessions (yours; everyone's for viewers/admins)",
           roles=READERS, query=ListQuery, responses={200: SessionList}, tag="sessions")
def sessions_index(query: ListQuery):
    with state().db.read() as s:
        page = list_sessions(s, visible_to=owner_scope(), limit=query.limit, cursor=query.cursor)
    return jsonify(page.as_dict())


@api.route("/sessions/<session_id>", "GET", summary="One session", roles=READERS,
           responses={200: SessionOut}, errors=(404,), tag="sessions")
def sessions_detail(session_id: str):
    return jsonify(_session_or_404(session_id))


@api.route("/sessions/<session_id>", "PATCH", summary="Rename, or change the default agent",
           roles=WRITERS, body=PatchSessionBody, responses={200: SessionOut},
           errors=(404, 422), tag="sessions")
def sessions_patch(session_id: str, body: PatchSessionBody, raw_body):
    changes = {k: raw_body[k] for k in ("title", "agent_id") if k in raw_body}
    if changes.get("agent_id", "") is None:
        from agentledger.core.errors import ValidationFailed

        raise ValidationFailed("agent_id: a session always has a default agent; it cannot be null")
    with state().db.write() as s:
        update_session(s, session_id, owner_id=owner_scope(), **changes)
    return jsonify(_session_or_404(session_id, after_write=True))


@api.route("/sessions/<session_id>", "DELETE", summary="Hide a session from its owner (kept for audit)",
           roles=WRITERS, responses={204: None}, errors=(404,), tag="sessions")
def sessions_delete(session_id: str):
    with state().db.write() as s:
        delete_session(s, session_id, owner_id=owner_scope())
        record(s, actor(), "session.deleted", "session", session_id)
    return "", 204


@api.route("/sessions/<session_id>/messages", "GET", summary="The conversation, in order",
           roles=READERS, query=ListQuery, responses={200: MessageList}, errors=(404,),
           tag="sessions")
def messages_index(session_id: str, query: ListQuery):
    page = read_one(session_messages, session_id, visible_to=owner_scope(), limit=query.limit,
                    cursor=query.cursor)
    if page is None:
        raise NotFound(f"session {session_id} does not exist")
    return jsonify(page.as_dict())


@api.route("/sessions/<session_id>/messages", "POST",
           summary="Send a message: creates exactly one run per Idempotency-Key",
           roles=WRITERS, body=PostMessageBody, responses={202: PostMessageOut},
           errors=(404, 409, 422, 429), tag="sessions",
           headers={"Idempotency-Key": f"required; {KEY_RULE}"})
def messages_post(session_id: str, body: PostMessageBody, raw_body):
    key = idempotency_key(required=True)
    assert key is not None
    context = [ContextItem(c.id, c.title, c.content, c.version) for c in body.context or []]
    posted = post_message_alone(
        state().db,
        owner_id=principal().owner_id,
        session_id=session_id,
        idempotency_key=key,
        request=(request.path, raw_body),
        content=body.content,
        agent_id=body.agent_id,
        context=context,
        visible_to=owner_scope(),
        rate_limit_per_minute=state().settings.run_rate_limit,
    )
    response = jsonify(posted.response())
    response.status_code = 202
    if posted.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response
