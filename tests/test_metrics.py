"""``GET /metrics`` (CONTRACT §9) and the alerting rules in ``deploy/prometheus``.

The exposition is parsed with prometheus_client's own parser and linted by ``promtool check
metrics``; the ledger figures are compared with the lease page's query; the rules pass ``promtool
check rules`` and their unit tests. Two slow tests use real processes: a real Prometheus server
scraping a real ``agentledger serve`` with a bearer token, and a two-worker ``serve`` whose
request histogram adds up over both workers.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select
from support import history as h
from support.api import FlaskHttp, ServerProcess, free_port, make_tokens, wait_until

from agentledger.core.config import Settings
from agentledger.core.schema import AgentRun
from queries.lease_health import lease_health

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "agentledger-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "agentledger-rules.test.yml"
ROLES = {"admin": ("root", "admin"), "viewer": ("auditor", "viewer"), "user": ("alice", "user"),
         "executor": ("exec-svc", "executor")}
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed "
                                    "(Debian: apt-get install prometheus)")


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, frozenset(s.labels.items()))] = s.value
    return found


def value(found, name: str, **labels) -> float:
    return found[(name, frozenset(labels.items()))]


@pytest.fixture
def ledger(db):
    """Finished, interrupted, queued and running runs, one lease at risk, one expired."""
    now = datetime.now(UTC)
    h.agent(db, "planner")
    h.agent(db, "searcher")

    def chat(agent="planner"):
        return h.chat(db, owner="alice", agent_id=agent, when=now - timedelta(hours=2))

    for n in range(2):
        h.answered(db, chat(), "q", "a", owner="alice", when=now - timedelta(minutes=30 + n))
    failed = h.ask(db, chat("searcher"), "q", owner="alice", when=now - timedelta(minutes=20))
    h.start(db, failed.run_id, now - timedelta(minutes=20))
    h.fail(db, failed.run_id, now - timedelta(minutes=19))
    gone = h.ask(db, chat("searcher"), "q", owner="alice", when=now - timedelta(minutes=10))
    h.start(db, gone.run_id, now - timedelta(minutes=10), "w-restarted")
    h.executor_gone(db, "w-restarted", now - timedelta(minutes=9), "service_restart")
    h.ask(db, chat(), "waiting", owner="alice", when=now - timedelta(seconds=120))
    for executor, started, lease in (("w-live", now, 600),
                                     ("w-dead", now - timedelta(seconds=60), 30)):
        run = h.ask(db, chat(), "q", owner="alice", when=started - timedelta(seconds=1))
        h.start(db, run.run_id, started, executor, lease_seconds=lease)
    return chat


def lease_at_risk(db, chat) -> None:
    """A lease with 9.5 s left, made just before a scrape (at risk below 10 s)."""
    started = datetime.now(UTC)
    run = h.ask(db, chat(), "q", owner="alice", when=started - timedelta(seconds=1))
    h.start(db, run.run_id, started, "w-slow", lease_seconds=9.5)


@pytest.fixture
def app(db):
    from agentledger.app_factory import create_app

    created = []

    def make(**settings):
        found = create_app(Settings(database_url=db.url, secret_key="metrics-tests", **settings),
                           database=db)
        created.append(found)
        return FlaskHttp(found.test_client())

    yield make
    for found in created:
        found.extensions["agentledger"].close()


def test_the_ledger_figures_at_scrape_time(db, ledger, app):
    http = app()
    viewer = make_tokens(db, {"viewer": ROLES["viewer"]})["viewer"]
    lease_at_risk(db, ledger)
    reply = http.request("GET", "/metrics", token=viewer)
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    found = samples(reply.text)
    assert value(found, "agentledger_runs", status="queued") == 1
    assert value(found, "agentledger_runs", status="running") == 3
    assert value(found, "agentledger_runs", status="cancelling") == 0
    assert value(found, "agentledger_runs_finished_total", agent_id="planner", status="succeeded") == 2
    assert value(found, "agentledger_runs_finished_total", agent_id="searcher", status="failed") == 1
    assert value(found, "agentledger_runs_finished_total", agent_id="searcher",
                 status="interrupted") == 1
    assert value(found, "agentledger_runs_interrupted_total", reason="service_restart") == 1
    assert value(found, "agentledger_runs_interrupted_total", reason="lease_expired") == 0
    assert 119 <= value(found, "agentledger_run_queue_oldest_seconds") < 600
    assert value(found, "agentledger_leases_live") == 2
    assert value(found, "agentledger_leases_at_risk") == 1
    assert value(found, "agentledger_leases_expired_unreconciled") == 1
    assert 29 <= value(found, "agentledger_reconcile_lag_seconds") < 600
    with db.read() as s:  # the figures the lease page shows (the at-risk lease may end meanwhile)
        page = lease_health(s)
    assert page.live_leases + page.expired_unreconciled == 3
    assert page.queued == value(found, "agentledger_runs", status="queued")


@needs_promtool
def test_the_exposition_passes_promtool_check_metrics(db, ledger, app):
    http = app(metrics_public=True)
    http.request("GET", "/api/health")
    text = http.request("GET", "/metrics").text
    done = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "agentledger_http_request_duration_seconds_bucket" in text


def test_who_may_scrape(db, app):
    keys = make_tokens(db, ROLES)
    http = app()
    assert http.request("GET", "/metrics").status == 401
    assert http.request("GET", "/metrics").json()["error"] == {
        "code": "unauthenticated", "message": "send Authorization: Bearer <token> of a viewer or "
        "admin, or set AGENTLEDGER_METRICS_PUBLIC=1 on the server"}
    assert http.request("GET", "/metrics", token="al_not-a-token").json()["error"][
        "message"] == "the token is not valid (unknown or revoked)"
    for role, status in (("user", 403), ("executor", 403), ("viewer", 200), ("admin", 200)):
        assert http.request("GET", "/metrics", token=keys[role]).status == status, role
    assert app(metrics_public=True).request("GET", "/metrics").status == 200


@pytest.mark.parametrize("raw", ["true", "yes", "ON"])
def test_metrics_public_is_on_for_any_yes(db, raw, monkeypatch):
    from agentledger.app_factory import create_app

    monkeypatch.setenv("AGENTLEDGER_METRICS_PUBLIC", raw)
    found = create_app(Settings.from_env(database_url=db.url, secret_key="metrics-tests"),
                       database=db)
    try:
        assert found.test_client().get("/metrics").status_code == 200
    finally:
        found.extensions["agentledger"].close()


def test_requests_are_timed_by_url_rule_and_streams_are_counted(db, app):
    from agentledger.web.metrics import HTTP_DURATION

    keys = make_tokens(db, ROLES)
    http = app(metrics_public=True)
    route = "/api/agent-runs/<run_id>"
    before = HTTP_DURATION.labels(route, "GET", "404")._sum.get()  # noqa: SLF001
    for n in range(3):
        assert http.request("GET", f"/api/agent-runs/run_missing{n}", token=keys["admin"]).status == 404
    found = samples(http.request("GET", "/metrics").text)
    labels = {"route": route, "method": "GET", "status": "404"}
    assert value(found, "agentledger_http_request_duration_seconds_count", **labels) >= 3
    assert value(found, "agentledger_http_request_duration_seconds_sum", **labels) > before
    assert not any("run_missing" in str(key) for key in found)  # never the raw path

    h.agent(db, "planner")
    chat = h.chat(db, owner="alice", agent_id="planner")
    run = h.ask(db, chat, "q", owner="alice", when=datetime.now(UTC))
    client = http.client
    stream = client.get(f"/api/agent-runs/{run.run_id}/events", buffered=False,
                        headers={"Accept": "text/event-stream",
                                 "Authorization": f"Bearer {keys['viewer']}"})
    chunks = iter(stream.response)
    assert next(chunks).startswith(b"retry:")
    opened = samples(http.request("GET", "/metrics").text)
    assert value(opened, "agentledger_event_streams_open") >= 1
    stream.close()
    closed = samples(http.request("GET", "/metrics").text)
    assert value(closed, "agentledger_event_streams_open") == value(
        opened, "agentledger_event_streams_open") - 1


def test_a_path_nothing_serves_is_unmatched_whatever_the_method(db, app):
    """The dashboards' catch-all rule answers any GET (the page shell, known page or not): only
    a dashboard page counts as that rule, any other path as ``unmatched``, as for other methods."""
    keys = make_tokens(db, ROLES)
    http = app(metrics_public=True)

    def counts() -> dict[tuple[str, str, str], float]:
        found = samples(http.request("GET", "/metrics").text)
        return {(labels["route"], labels["method"], labels["status"]): n
                for (name, pairs), n in found.items()
                if name == "agentledger_http_request_duration_seconds_count"
                for labels in [dict(pairs)]}

    asked = [("GET", "/no/such/page"), ("HEAD", "/no/such/page"), ("OPTIONS", "/no/such/page"),
             ("POST", "/no/such/page"), ("GET", "/api/no-such-route"),
             ("DELETE", "/api/no-such-route"), ("GET", "/runs"), ("GET", "/runs/run_missing"),
             ("GET", "/")]
    before = counts()
    answered = {}
    for method, path in asked:
        reply = http.request(method, path, token=keys["viewer"])
        answered[method, path] = str(reply.status)
    grew = {key: n - before.get(key, 0) for key, n in counts().items() if n != before.get(key, 0)}
    grew[("/metrics", "GET", "200")] -= 1  # the scrape that read the first counts
    grew = {key: n for key, n in grew.items() if n}
    expected: dict[tuple[str, str, str], float] = {}
    for method, path in asked:
        route = {"/runs": "/<path:path>", "/runs/run_missing": "/<path:path>", "/": "/"}.get(
            path, "unmatched")
        key = (route, method, answered[method, path])
        expected[key] = expected.get(key, 0) + 1
    assert grew == expected
    assert answered["GET", "/no/such/page"] == "200"  # the shell: Dash shows its 404 page


def test_a_request_a_hook_refuses_is_timed_too(db, app):
    """A browser POST without its CSRF header is refused before any route runs (403): it is
    counted and timed under its route like any other answer."""
    keys = make_tokens(db, ROLES)
    http = app(metrics_public=True)
    client = http.client
    assert client.get(f"/login?token={keys['user']}").status_code == 303  # a cookie session
    labels = {"route": "/api/sessions", "method": "POST", "status": "403"}
    before = samples(http.request("GET", "/metrics").text).get(
        ("agentledger_http_request_duration_seconds_count", frozenset(labels.items())), 0)
    for _ in range(2):
        refused = client.post("/api/sessions", json={"agent_id": "planner"})
        assert refused.status_code == 403 and refused.json["error"]["code"] == "forbidden"
    after = value(samples(http.request("GET", "/metrics").text),
                  "agentledger_http_request_duration_seconds_count", **labels)
    assert after == before + 2


@needs_promtool
def test_the_alerting_rules_pass_promtool():
    checked = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 7 rules found" in checked.stdout
    tested = subprocess.run([PROMTOOL, "test", "rules", str(RULE_TESTS)], capture_output=True,
                            text=True, timeout=120, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    for line in RULES.read_text().splitlines():
        if line.strip().startswith("- alert:"):
            name = line.split(":", 1)[1].strip()
            assert f"alertname: {name}" in RULE_TESTS.read_text(), f"{name} has no unit test"
    rules = RULES.read_text().count("- alert:")
    assert RULES.read_text().count("runbook: docs/operations.md#") == rules
    anchors = (ROOT / "docs" / "operations.md").read_text().lower()
    for line in RULES.read_text().splitlines():
        if "runbook: docs/operations.md#" in line:
            anchor = line.split("#", 1)[1].strip()
            assert f"### {anchor.replace('-', ' ')}" in anchors, f"no runbook section {anchor}"


# ---- real processes --------------------------------------------------------------------------


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian: prometheus)")
def test_a_real_prometheus_scrapes_a_real_server(db, db_url, tmp_path):
    h.agent(db, "planner")
    for n in range(2):
        chat = h.chat(db, owner="alice", agent_id="planner")
        run = h.ask(db, chat, "q", owner="alice", when=datetime.now(UTC))
        h.start(db, run.run_id, datetime.now(UTC), f"w-{n}", lease_seconds=3600)
    viewer = make_tokens(db, {"viewer": ROLES["viewer"]})["viewer"]
    server = ServerProcess(db_url, tmp_path)
    prometheus = None
    try:
        port = free_port()
        shutil.copy(RULES, tmp_path / RULES.name)
        config = tmp_path / "prometheus.yml"
        # One slow /metrics answer (a busy machine) must not mark the target down or the series
        # stale: the scrape may take as long as the interval, and the test waits for one scrape.
        config.write_text(f"""
global:
  scrape_interval: 5s
  scrape_timeout: 5s
  evaluation_interval: 5s
rule_files: ["{RULES.name}"]
scrape_configs:
  - job_name: agentledger
    metrics_path: /metrics
    authorization:
      type: Bearer
      credentials: "{viewer}"
    static_configs:
      - targets: ["127.0.0.1:{server.port}"]
""")
        log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below
        prometheus = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
        api = f"http://127.0.0.1:{port}/api/v1"

        seen = {}

        def scraped():
            """The value Prometheus holds is 2 and its one target is up, both at once."""
            try:
                reply = requests.get(f"{api}/query", params={"query": "agentledger_leases_live"},
                                     timeout=5).json()
                targets = requests.get(f"{api}/targets", timeout=5).json()["data"]["activeTargets"]
            except (requests.RequestException, ValueError, KeyError):
                return None
            result = reply.get("data", {}).get("result", [])
            seen["leases_live"] = [float(r["value"][1]) for r in result]
            seen["health"] = [t["health"] for t in targets]
            return seen == {"leases_live": [2.0], "health": ["up"]}

        wait_until(scraped, timeout=90, interval=0.5, message=lambda: (
            f"agentledger_leases_live == 2 from an up target (last seen {seen})\n"
            + (tmp_path / "prometheus.log").read_text()[-3000:]))
        groups = requests.get(f"{api}/rules", timeout=5).json()["data"]["groups"]
        assert len(groups[0]["rules"]) == 7
    finally:
        if prometheus is not None:
            _stop(prometheus)
            log.close()
        server.stop()


@pytest.mark.slow
def test_two_workers_add_up_their_request_histograms(pg_url, tmp_path):
    from agentledger.core.database import Database

    db = Database(pg_url)
    try:
        viewer = make_tokens(db, {"viewer": ROLES["viewer"]})["viewer"]
    finally:
        db.dispose()
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    (metrics_dir / "histogram_999999.db").write_bytes(b"left over from an earlier server")
    server = ServerProcess(pg_url, tmp_path, args=("--workers", "2"),
                           env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)})
    try:
        assert not (metrics_dir / "histogram_999999.db").exists()  # cleaned at start
        auth = {"Authorization": f"Bearer {viewer}"}

        def health_count() -> float:
            with requests.get(server.base_url + "/metrics", headers=auth, timeout=10) as reply:
                assert reply.status_code == 200, reply.text
                found = samples(reply.text)
            return found.get(("agentledger_http_request_duration_seconds_count", frozenset(
                {"route": "/api/health", "method": "GET", "status": "200"}.items())), 0.0)

        before = health_count()

        def hit(_):
            with requests.get(server.base_url + "/api/health", timeout=10) as reply:
                return reply.status_code

        sent = 0
        deadline = time.monotonic() + 120
        with ThreadPoolExecutor(8) as pool:
            while True:
                assert set(pool.map(hit, range(40))) == {200}
                sent += 40
                pids = {p.name.split("_")[-1] for p in metrics_dir.glob("histogram_*.db")}
                if len(pids) >= 2 or time.monotonic() > deadline:
                    break
        assert len(pids) >= 2, "every request reached the same worker"
        assert health_count() - before == sent
        # A second server given the same directory is refused before it empties it: the first
        # keeps its workers' samples, and neither would add up the other's processes.
        files = {p.name for p in metrics_dir.glob("*.db")}
        environment = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
        second = subprocess.run(
            [sys.executable, "-m", "agentledger.cli", "serve", "--port", str(free_port()),
             "--workers", "1", "--no-worker"],
            env={**environment, "AGENTLEDGER_DATABASE_URL": pg_url,
                 "AGENTLEDGER_SECRET_KEY": "api-tests-secret",
                 "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)},
            capture_output=True, text=True, timeout=120)
        assert second.returncode == 2 and second.stdout == "", second
        assert second.stderr == (
            f"agentledger: PROMETHEUS_MULTIPROC_DIR {metrics_dir} is in use by another "
            f"agentledger serve (pid {server.process.pid}); give each server a directory of its "
            "own\n"), second.stderr
        assert files <= {p.name for p in metrics_dir.glob("*.db")}
        assert health_count() - before == sent
    finally:
        server.stop()
    assert os.path.isdir(metrics_dir)


def test_serve_takes_its_metrics_directory_for_itself(tmp_path, monkeypatch):
    """The lock behind the refusal above, in one process: a directory a running ``serve``
    holds is refused with a line naming its pid, and nothing in it is removed; once released,
    the next ``serve`` takes it and starts it clean. A path that names no directory is one line
    too, and a missing directory is made."""
    from agentledger import server
    from agentledger.core.config import StartupError

    shared = tmp_path / "made-if-missing"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(shared))
    monkeypatch.setattr(server, "_metrics_lock", None)
    server._prepare_metrics_dir()
    first = server._metrics_lock
    assert first is not None
    try:
        assert (shared / server.METRICS_LOCK_NAME).read_text() == f"{os.getpid()}\n"
        (shared / "counter_1.db").write_bytes(b"a live worker's samples")
        with pytest.raises(StartupError) as refused:
            server._prepare_metrics_dir()
        assert str(refused.value) == (
            f"PROMETHEUS_MULTIPROC_DIR {shared} is in use by another agentledger serve (pid "
            f"{os.getpid()}); give each server a directory of its own")
        assert (shared / "counter_1.db").exists()
    finally:
        first.close()
    server._prepare_metrics_dir()
    server._metrics_lock.close()
    assert not (shared / "counter_1.db").exists()

    a_file = tmp_path / "a-file"
    a_file.write_text("")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(a_file))
    with pytest.raises(StartupError) as refused:
        server._prepare_metrics_dir()
    assert str(refused.value) == f"cannot use PROMETHEUS_MULTIPROC_DIR {a_file}: Not a directory"


def test_interruptions_stay_counted_after_their_runs_are_archived(db, ledger, app, tmp_path):
    """A counter never goes back: archiving moves interrupted runs out of the live tables, not
    out of agentledger_runs_interrupted_total (nor runs_finished_total)."""
    from agentledger.archive import archive_command

    http = app()
    viewer = make_tokens(db, {"viewer": ROLES["viewer"]})["viewer"]
    chat = h.chat(db, owner="alice", agent_id="planner")
    run = h.ask(db, chat, "q", owner="alice", when=datetime.now(UTC))
    h.start(db, run.run_id, datetime.now(UTC), "w-crashed")
    h.executor_gone(db, "w-crashed", datetime.now(UTC), "lease_expired")

    def interrupted() -> tuple[float, float, float]:
        found = samples(http.request("GET", "/metrics", token=viewer).text)
        return (value(found, "agentledger_runs_interrupted_total", reason="service_restart"),
                value(found, "agentledger_runs_interrupted_total", reason="lease_expired"),
                value(found, "agentledger_runs_finished_total", agent_id="searcher",
                      status="interrupted"))

    before = interrupted()
    assert before == (1, 1, 1)
    with db.read() as s:
        live = s.execute(select(func.count()).select_from(AgentRun)
                         .where(AgentRun.status == "interrupted")).scalar_one()
    assert live == 2
    archive_command(Settings(database_url=db.url), older_than_days=0, out=str(tmp_path),
                    batch_size=100, dry_run=False)
    with db.read() as s:
        assert s.execute(select(func.count()).select_from(AgentRun)
                         .where(AgentRun.status == "interrupted")).scalar_one() == 0
    assert interrupted() == before
