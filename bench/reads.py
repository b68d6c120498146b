"""The reads behind the API routes and dashboard pages: ``queries`` in-process, HTTP, raw SQL.

Each read is timed ``iterations`` times (after 2 warm-up calls) on ids sampled at random from
the data set, cycling through the sample: ``queries.*`` in a ``Database.read()`` transaction,
the HTTP route (when the API has one) with a viewer token on a keep-alive session, and the
equivalent hand-written SQL through psycopg in one transaction (PostgreSQL only).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from agentledger.core.database import Database
from agentledger.core.rollup_periods import minutes_readable_from
from bench import baseline
from bench.common import Row, Sizes, latency_ms, latency_ratio, libpq, log, timed
from queries.agent_outcomes import agent_outcomes
from queries.common import TimeWindow
from queries.interrupted_runs import InterruptedFilters, interrupted_runs
from queries.lease_health import lease_health
from queries.outcome_windows import split_window
from queries.provenance import message_provenance
from queries.run_events import events_page
from queries.run_tree import run_tree
from queries.runs import RunFilters, get_run, list_runs
from queries.status_timeline import status_timeline

WINDOWS = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7),
           "30d": timedelta(days=30)}


@dataclass
class Samples:
    messages: list[str]     # assistant messages
    runs: list[str]         # runs with ≥ 5 events
    trees: list[str]        # runs of a delegation tree (any node)
    agent_id: str
    status: str


def sample(db: Database, k: int = 200, *, created_after: datetime | None = None) -> Samples:
    """Ids picked at random (a table scan or two, once); with ``created_after``, only among
    messages and runs created since then."""
    since = {"since": created_after} if created_after is not None else {}
    recent = " AND created_at >= :since" if created_after is not None else ""
    with db.read() as s:
        def ids(sql: str) -> list[str]:
            return [r[0] for r in s.execute(text(sql), {"k": k, **since}).all()]

        def sampled(table: str, where: str) -> list[str]:
            where += recent
            # Random pages first (TABLESAMPLE): ORDER BY random() sorts the whole table, which
            # at 5M runs outlasts the read statement timeout. A small table may give too few
            # rows that way, and is cheap to sort.
            found = []
            if db.is_postgres:
                found = ids(f"SELECT id FROM {table} TABLESAMPLE SYSTEM (1) WHERE {where} "
                            "ORDER BY random() LIMIT :k")
            if len(found) < k:
                found = ids(f"SELECT id FROM {table} WHERE {where} ORDER BY random() LIMIT :k")
            return found

        messages = sampled("message", "role = 'assistant'")
        runs = sampled("agent_run", "last_event_seq >= 5")
        trees = sampled("agent_run", "parent_run_id IS NOT NULL")
        top = s.execute(text("SELECT agent_id, count(*) FROM agent_run GROUP BY agent_id"
                             " ORDER BY count(*) DESC LIMIT 1")).first()
    return Samples(messages or ["none"], runs or ["none"], trees or runs or ["none"],
                   top[0] if top else "none", "succeeded")


def _edge_note(db: Database, start: datetime) -> str:
    """How much of an outcome window (``start`` to now) is scanned run by run: the partial
    minute (or, for a window starting before the minutes the rollup keeps, the partial hour)
    at its start (``queries.outcome_windows``), which depends on the moment the bench reads
    at; rows of different runs compare only with it in view."""
    edges = split_window(TimeWindow(start, None),
                         minutes_from=minutes_readable_from(datetime.now(UTC))).edges
    if not edges:
        return "; start edge: none (the window starts on a whole minute)"
    seconds = sum((e.end - e.start).total_seconds() for e in edges if e.end and e.start)
    with db.read() as s:
        runs = sum(s.execute(text("SELECT count(*) FROM agent_run WHERE created_at >= :a "
                                  "AND created_at < :b"), {"a": e.start, "b": e.end}).scalar_one()
                   for e in edges)
    span = f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"
    return f"; start edge scanned run by run: {span}, {runs:,} runs"


def _cycle(values: list[str]) -> Callable[[], str]:
    it = itertools.cycle(values)
    return lambda: next(it)


def run(db: Database, base_url: str | None, viewer_token: str, pg: bool, sizes: Sizes, *,
        hot_since: datetime | None = None) -> list[Row]:
    """Every read, timed. ``hot_since``: point reads only of what was created since then, each
    sampled id read once before the timed calls (the hot set, in cache as it is in a
    deployment that serves it); otherwise ids from all history, mostly read for the first
    time."""
    import requests

    picked = sample(db, max(sizes.point_reads, 50), created_after=hot_since)
    point_reads = ("provenance", "run", "events page of 100", "run tree")
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {viewer_token}"
    raw_conn = None
    if pg:
        import psycopg

        raw_conn = psycopg.connect(libpq(db.url))
    now = datetime.now(UTC)
    day_ago = now - timedelta(days=1)
    week_ago = now - timedelta(days=7)

    def q(fn) -> Callable[[], None]:
        def call() -> None:
            with db.read() as s:
                fn(s)
        return call

    def h(path_fn) -> Callable[[], None] | None:
        if base_url is None:  # in-process reads only (no server started)
            return None

        def call() -> None:
            reply = http.get(base_url + path_fn())
            if reply.status_code != 200:
                raise RuntimeError(f"{reply.status_code} {reply.text[:200]}")
            reply.content  # noqa: B018 - the whole body is read
        return call

    def r(fn) -> Callable[[], None] | None:
        if raw_conn is None:
            return None

        def call() -> None:
            with raw_conn.transaction():
                fn(raw_conn)
        return call

    msg, rn, tr = _cycle(picked.messages), _cycle(picked.runs), _cycle(picked.trees)
    agent, status = picked.agent_id, picked.status
    reads: list[tuple[str, int, Callable | None, Callable | None, Callable | None, str, float | None]] = [
        ("provenance", sizes.point_reads,
         q(lambda s: message_provenance(s, msg())), h(lambda: f"/api/messages/{msg()}/provenance"),
         r(lambda c: baseline.provenance(c, msg())), "HTTP p95 ≤ 10 ms", 10.0),
        ("run", sizes.point_reads,
         q(lambda s: get_run(s, rn())), h(lambda: f"/api/agent-runs/{rn()}"),
         r(lambda c: baseline.run(c, rn())), "HTTP p95 ≤ 10 ms", 10.0),
        ("events page of 100", sizes.point_reads,
         q(lambda s: events_page(s, rn(), limit=100)),
         h(lambda: f"/api/agent-runs/{rn()}/events?limit=100"),
         r(lambda c: baseline.events_page(c, rn())), "HTTP p95 ≤ 10 ms", 10.0),
        ("run tree", sizes.point_reads,
         q(lambda s: run_tree(s, tr())), h(lambda: f"/api/agent-runs/{tr()}/tree"),
         r(lambda c: baseline.tree(c, tr())), "HTTP p95 ≤ 10 ms", 10.0),
        ("run list (agent + status + created_after 7d)", sizes.list_reads,
         q(lambda s: list_runs(s, RunFilters(status=status, agent_id=agent,
                                             created_after=week_ago))),
         h(lambda: f"/api/agent-runs?agent_id={agent}&status={status}&created_after="
                   + week_ago.isoformat().replace("+00:00", "Z")),
         r(lambda c: baseline.run_list(c, agent, status, week_ago)), "", None),
        ("status timeline, 24 h window (300 rows)", sizes.list_reads,
         q(lambda s: status_timeline(s, TimeWindow(day_ago, None))), None,
         r(lambda c: baseline.status_timeline(c, day_ago)), "", None),
        ("interrupted runs, 7 d (page of 50)", sizes.list_reads,
         q(lambda s: interrupted_runs(s, InterruptedFilters(window=TimeWindow(week_ago, None)))),
         None, r(lambda c: baseline.interrupted(c, week_ago)), "", None),
        ("lease health", sizes.list_reads, q(lambda s: lease_health(s)), None,
         r(lambda c: baseline.lease_health(c)), "", None),
    ]
    extra_notes: dict[str, str] = {}
    for label, delta in WINDOWS.items():
        start = now - delta
        extra_notes[f"agent + version outcomes, {label}"] = _edge_note(db, start)
        reads.append((f"agent + version outcomes, {label}", sizes.outcome_reads,
                      q(lambda s, start=start: agent_outcomes(s, TimeWindow(start, None))), None,
                      r(lambda c, start=start: baseline.outcomes(c, start)),
                      "queries p95 ≤ 20 ms", 20.0))
    rows = []
    for name, n, project, over_http, raw, target, limit in reads:
        if n == 0:
            continue
        log(f"read: {name} ×{n}")
        warmup = n if hot_since is not None and name in point_reads else 2
        found = {"queries": latency_ms(timed(project, n, warmup=warmup))}
        if over_http is not None:
            found["http"] = latency_ms(timed(over_http, n))
        if raw is not None:
            found["raw"] = latency_ms(timed(raw, n))
        judged = found["http"] if "http" in found and "HTTP" in target else found["queries"]
        status_ = "n/a"
        if limit is not None:
            status_ = "pass" if judged["p95"] <= limit else "miss"
        raw_p95 = found.get("raw", {}).get("p95")
        rows.append(Row(
            "reads", name, "ms p95", judged["p95"], raw_p95,
            latency_ratio(found["queries"]["p95"], raw_p95), found, target, status_,
            "project = " + ("HTTP" if judged is found.get("http") else "queries") +
            "; ratio = raw p95 / queries p95" + extra_notes.get(name, "")))
    if raw_conn is not None:
        raw_conn.close()
    return rows
