"""``GET /metrics``: Prometheus text exposition (CONTRACT §9).

Two kinds of figures:

- the ledger's, read from the database at scrape time (``queries.metrics``), so every server of a
  deployment answers for all of it and nothing is lost when a process restarts;
- this server's own, kept per process: ``agentledger_http_request_duration_seconds`` (a
  histogram labelled with the URL rule, never the raw path, so ids do not explode the label
  set) and ``agentledger_event_streams_open``.

Under ``agentledger serve`` several gunicorn processes answer the same port, so a scrape must add
up every process's figures, not report whichever process it reached: ``serve`` sets
``PROMETHEUS_MULTIPROC_DIR`` (a fresh directory) before any worker imports prometheus_client,
each process writes its samples to files there, and a scrape merges them with
``MultiProcessCollector``. Without the variable (tests, embedded use) the figures of this one
process are exported directly.
"""

from __future__ import annotations

import fnmatch
import os
import re
import time

from flask import Blueprint, Flask, Response, g, request
from prometheus_client import (
    CollectorRegistry,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client import multiprocess as prometheus_multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from agentledger.core.errors import Forbidden, Unauthenticated
from agentledger.core.vocabulary import DASHBOARD_ROLES
from agentledger.web.app_state import state
from agentledger.web.principal import authenticate
from queries.metrics import ledger_figures

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# The route label of a request nothing serves, and the dashboards' catch-all rule.
UNMATCHED = "unmatched"
DASHBOARD_CATCH_ALL = "/<path:path>"
# The classic text format (0.0.4), which every Prometheus release scrapes; ``generate_latest``
# writes exactly that.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# ``*_created`` series add a sample per label set that no rule of ours reads.
disable_created_metrics()

# Per-process metrics: created once per process, registered in no global registry (each scrape
# builds its own), so any number of apps in one process share them without clashing.
HTTP_DURATION = Histogram(
    "agentledger_http_request_duration_seconds",
    "Time to produce each HTTP response (streams: until the response starts)",
    ["route", "method", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=None,
)
STREAMS_OPEN = Gauge(
    "agentledger_event_streams_open",
    "Server-Sent-Events streams open now",
    registry=None,
    multiprocess_mode="livesum",
)

metrics_blueprint = Blueprint("metrics", __name__)


class LedgerCollector:
    """The ledger's figures, read through ``queries.metrics`` when collected."""

    def __init__(self, figures):
        self.figures = figures

    def collect(self):
        f = self.figures
        runs = GaugeMetricFamily("agentledger_runs", "Runs not finished now, by status",
                                 labels=["status"])
        for status, count in f.runs_by_status.items():
            runs.add_metric([status], count)
        yield runs
        finished = CounterMetricFamily("agentledger_runs_finished",
                                       "Runs that ended, by agent and terminal status",
                                       labels=["agent_id", "status"])
        for (agent_id, status), count in f.finished.items():
            finished.add_metric([agent_id, status], count)
        yield finished
        yield GaugeMetricFamily("agentledger_run_queue_oldest_seconds",
                                "How long the oldest queued run has waited (0: none waits)",
                                value=f.queue_oldest_seconds)
        yield GaugeMetricFamily("agentledger_leases_live", "Running runs whose lease has not ended",
                                value=f.leases.live_leases)
        yield GaugeMetricFamily("agentledger_leases_at_risk",
                                "Live leases ending within the at-risk margin (10 s)",
                                value=f.leases.at_risk)
        yield GaugeMetricFamily("agentledger_leases_expired_unreconciled",
                                "Runs still active although their lease has ended",
                                value=f.leases.expired_unreconciled)
        yield GaugeMetricFamily("agentledger_reconcile_lag_seconds",
                                "Now minus the oldest expired lease not yet reconciled (0: none)",
                                value=f.reconcile_lag_seconds)
        interrupted = CounterMetricFamily("agentledger_runs_interrupted",
                                          "Runs that ended interrupted, by reason",
                                          labels=["reason"])
        for reason, count in f.interrupted_by_reason.items():
            interrupted.add_metric([reason], count)
        yield interrupted


def metrics_public() -> bool:
    return state().settings.metrics_public


def exposition() -> bytes:
    """The whole text exposition: the ledger's figures and every process's own."""
    with state().db.read() as s:
        figures = ledger_figures(s)
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get(MULTIPROC_ENV):
        prometheus_multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(HTTP_DURATION)
        registry.register(STREAMS_OPEN)
    registry.register(LedgerCollector(figures))
    return generate_latest(registry)


@metrics_blueprint.get("/metrics")
def metrics_view():
    if not metrics_public():
        try:
            principal = authenticate()
        except Unauthenticated:
            if request.headers.get("Authorization"):
                raise  # a token was sent: the usual "not valid" answer
            raise Unauthenticated("send Authorization: Bearer <token> of a viewer or admin, or "
                                  "set AGENTLEDGER_METRICS_PUBLIC=1 on the server") from None
        if principal.role not in DASHBOARD_ROLES:
            raise Forbidden(f"the {principal.role} role may not read /metrics")
    return Response(exposition(), mimetype=None, content_type=CONTENT_TYPE)


def _started() -> None:
    g.agentledger_request_started = time.perf_counter()


def route_label() -> str:
    """The ``route`` label of this request: its URL rule, or ``unmatched`` when nothing serves
    its path. The dashboards serve their pages through one catch-all rule (Dash's
    ``/<path:path>``) that answers any GET with the page shell, known page or not, so a request
    that matched it counts as that rule only when its path is a dashboard page."""
    rule = request.url_rule
    if rule is None or (rule.rule == DASHBOARD_CATCH_ALL and not _dashboard_page(request.path)):
        return UNMATCHED
    return rule.rule


def _dashboard_page(path: str) -> bool:
    """Whether Dash shows a registered page (not its 404) for ``path``, matched as Dash matches
    it: a page's ``path``, or its ``path_template`` with each ``<variable>`` as a wildcard."""
    import dash

    wanted = path.strip("/")
    for page in dash.page_registry.values():
        template = page.get("path_template")
        if template and fnmatch.fnmatchcase(wanted, re.sub("<.*?>", "*", template.strip("/"))):
            return True
        if wanted == page["path"].strip("/"):
            return True
    return False


def _observed(response: Response) -> Response:
    started = g.pop("agentledger_request_started", None)
    if started is not None:
        HTTP_DURATION.labels(route_label(), request.method, str(response.status_code)).observe(
            time.perf_counter() - started)
    return response


def install_metrics(app: Flask) -> None:
    app.register_blueprint(metrics_blueprint)
    app.after_request(_observed)


def start_request_clock_first(app: Flask) -> None:
    """Start each request's clock in the first before-request hook of all (call it once every
    other hook is registered): a request that an earlier hook answers itself, such as a CSRF
    refusal, is then timed and counted like any other (``after_request`` sees every response)."""
    app.before_request_funcs.setdefault(None, []).insert(0, _started)
