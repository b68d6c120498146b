"""The admin action log (read-only)."""

from __future__ import annotations

from flask import jsonify

from agentledger.api import api
from agentledger.api.request_scope import state
from agentledger.api.requests import AdminActionsQuery
from agentledger.api.responses import AdminActionList
from queries.admin_actions import ActionFilters, admin_actions


@api.route("/admin-actions", "GET", summary="Who did what and when: tokens, agents, cancels, deletions",
           roles=("viewer", "admin"), query=AdminActionsQuery, responses={200: AdminActionList},
           tag="admin")
def admin_actions_index(query: AdminActionsQuery):
    filters = ActionFilters(action=query.action, actor=query.actor, target_id=query.target_id,
                            since=query.since, until=query.until)
    with state().db.read() as s:
        page = admin_actions(s, filters, limit=query.limit, cursor=query.cursor)
    return jsonify(page.as_dict())
