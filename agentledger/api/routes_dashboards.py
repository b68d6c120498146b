"""The JSON twins of the dashboards (CONTRACT §9): what each page shows, as JSON.

Each route calls the very ``queries`` function its page calls, with the page's filters and its
default time window, so a chart and its twin can never disagree. Lists are bounded and paged
like every list (``limit`` ≤ 500, ``cursor``, ``{"items", "next_cursor"}``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flask import jsonify

from agentledger.api import api
from agentledger.api.request_scope import state
from agentledger.api.requests import (
    AgentOutcomesQuery,
    InterruptedQuery,
    LeasesQuery,
    MessageSearchQuery,
    OverviewQuery,
    TimelineQuery,
)
from agentledger.api.responses import (
    AgentOutcomesList,
    InterruptedList,
    LeaseHealthOut,
    MessageSearchList,
    OverviewOut,
    TimelineList,
)
from agentledger.core.vocabulary import DASHBOARD_ROLES
from queries import agent_outcomes as outcomes_module
from queries.common import BadCursor, TimeWindow, decode_cursor, encode_cursor, iso, preset_window
from queries.interrupted_runs import InterruptedFilters, interrupted_runs, interruption_trend
from queries.lease_health import lease_health
from queries.message_search import MessageSearch, search_messages
from queries.overview import overview
from queries.status_timeline import TimelineFilters, status_timeline

# Each page's default window (dashboards/pages/*.py ``DEFAULT_WINDOW``; a test keeps them equal).
DEFAULT_WINDOWS = {"overview": "7d", "messages": "all", "timeline": "24h", "interrupted": "14d",
                   "agents": "30d"}


def _window(preset: str | None, after: datetime | None, before: datetime | None,
            page: str) -> TimeWindow:
    """Explicit bounds when either is given, else the preset (the page's default) ending now."""
    if after is not None or before is not None:
        return TimeWindow(after, before)
    return preset_window(preset or DEFAULT_WINDOWS[page], datetime.now(UTC))


def _window_out(window: TimeWindow) -> dict[str, str | None]:
    return {"start": iso(window.start), "end": iso(window.end)}


@api.route("/overview", "GET", summary="The overview page: runs by status over time, unfinished "
           "runs, recent interruptions, lease health", roles=DASHBOARD_ROLES, query=OverviewQuery,
           responses={200: OverviewOut}, tag="dashboards")
def overview_twin(query: OverviewQuery):
    window = _window(query.window, query.created_after, query.created_before, "overview")
    with state().db.read() as s:
        found = overview(s, window)
    return jsonify({
        "now": iso(found.now),
        "window": _window_out(window),
        "bucket_seconds": found.bucket_seconds,
        "status_buckets": found.status_buckets,
        "buckets_truncated": found.buckets_truncated,
        "totals": found.totals,
        "unfinished_runs": found.unfinished_runs,
        "unfinished_truncated": found.unfinished_truncated,
        "recent_interruptions": found.recent_interruptions,
        "leases": found.leases,
    })


@api.route("/messages", "GET", summary="Search assistant answers (the messages page)",
           roles=DASHBOARD_ROLES, query=MessageSearchQuery, responses={200: MessageSearchList},
           tag="dashboards")
def messages_twin(query: MessageSearchQuery):
    search = MessageSearch(
        text=query.q or None, session_id=query.session_id, owner_id=query.owner_id,
        agent_id=query.agent_id,
        window=_window(query.window, query.created_after, query.created_before, "messages"),
    )
    with state().db.read() as s:
        page = search_messages(s, search, limit=query.limit, cursor=query.cursor)
    return jsonify(page.as_dict())


@api.route("/timeline", "GET", summary="The status timeline: one row per run with its queued and "
           "running phases; oldest first within a page, each next page older",
           roles=DASHBOARD_ROLES, query=TimelineQuery, responses={200: TimelineList},
           tag="dashboards")
def timeline_twin(query: TimelineQuery):
    window = _window(query.window, query.created_after, query.created_before, "timeline")
    filters = TimelineFilters(status=query.status, agent_id=query.agent_id,
                              roots_only=query.roots_only)
    with state().db.read() as s:
        found = status_timeline(s, window, filters, limit=query.limit, cursor=query.cursor)
    return jsonify({"items": found.rows, "next_cursor": found.next_cursor, "total": found.total,
                    "now": iso(found.now), "window": _window_out(window)})


@api.route("/interrupted-runs", "GET", summary="Interrupted runs, most recent first, with the "
           "trend per day by reason", roles=DASHBOARD_ROLES, query=InterruptedQuery,
           responses={200: InterruptedList}, tag="dashboards")
def interrupted_twin(query: InterruptedQuery):
    window = _window(query.window, query.interrupted_after, query.interrupted_before,
                     "interrupted")
    filters = InterruptedFilters(window=window, reason=query.reason,
                                 executor_instance_id=query.executor_instance_id,
                                 agent_id=query.agent_id)
    with state().db.read() as s:
        page = interrupted_runs(s, filters, limit=query.limit, cursor=query.cursor)
        trend = interruption_trend(s, filters)
    return jsonify({
        **page.as_dict(),
        "trend": {"bucket_seconds": trend.bucket_seconds, "rows": trend.rows,
                  "by_reason": trend.by_reason, "truncated": trend.truncated},
        "window": _window_out(window),
    })


@api.route("/leases", "GET", summary="Lease health: executors, every live lease soonest to expire "
           "first, runs at risk, reconcile lag", roles=DASHBOARD_ROLES, query=LeasesQuery,
           responses={200: LeaseHealthOut}, tag="dashboards")
def leases_twin(query: LeasesQuery):
    with state().db.read() as s:
        health = lease_health(s, seen_within_minutes=query.seen_minutes,
                              at_risk_seconds=query.at_risk_seconds, limit=query.limit,
                              cursor=query.cursor)
    return jsonify({
        "items": health.leases,
        "next_cursor": health.next_cursor,
        **health.summary(),
        "executors": health.executors,
        "seen_within_minutes": health.seen_within_minutes,
        "at_risk_seconds": health.at_risk_seconds,
    })


def _outcome_key(item: dict[str, Any]) -> tuple[str, int]:
    # An agent's total (version None) comes first, then its versions in order.
    return item["agent_id"], item["version"] or 0


def _after(cursor: str | None) -> tuple[str, int] | None:
    if not cursor:
        return None
    agent_id, version = decode_cursor(cursor, 2)
    try:
        return agent_id, int(version)
    except ValueError as exc:
        raise BadCursor("cursor is not valid") from exc


@api.route("/agent-outcomes", "GET", summary="Outcomes per agent (version null) and per agent "
           "version: counts by terminal status, latency percentiles, tokens, cost",
           roles=DASHBOARD_ROLES, query=AgentOutcomesQuery, responses={200: AgentOutcomesList},
           tag="dashboards")
def agent_outcomes_twin(query: AgentOutcomesQuery):
    window = _window(query.window, query.created_after, query.created_before, "agents")
    after = _after(query.cursor)
    with state().db.read() as s:
        found = outcomes_module.agent_outcomes(s, window, agent_id=query.agent_id)
    items = sorted((o.as_dict() for o in (*found.agents, *found.versions)), key=_outcome_key)
    if after is not None:
        items = [i for i in items if _outcome_key(i) > after]
    more = len(items) > query.limit
    items = items[:query.limit]
    return jsonify({
        "items": items,
        "next_cursor": encode_cursor(*map(str, _outcome_key(items[-1]))) if more else None,
        "groups_truncated": found.groups_truncated,
        "window": _window_out(window),
    })
