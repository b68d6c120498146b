"""The benchmark suite runs end to end (``python -m bench --smoke --skip-peer``) on a fresh
PostgreSQL database and on a SQLite file, and writes every expected row. Speed is measured by
the bench, never asserted here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from agentledger.core.database import normalize_url
from bench.cancel import kinds_here

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"

EXPECTED = {
    "load": ["bulk import / demo seed (events/s)"],
    "reads": [
        "provenance", "run", "events page of 100", "run tree",
        "run list (agent + status + created_after 7d)", "status timeline, 24 h window (300 rows)",
        "interrupted runs, 7 d (page of 50)", "lease health",
        *(f"agent + version outcomes, {w}" for w in ("1h", "24h", "7d", "30d")),
    ],
    "dashboards": [f"page {p}: initial callbacks" for p in (
        "/", "/messages", "/messages/<message_id>", "/runs", "/runs/<run_id>", "/timeline",
        "/interrupted", "/leases", "/agents", "/audit")],
    "writes": ["run creation, 4 clients",
               "event appends, batches of 1, 4 clients (events/s)",
               "event appends, batches of 100, 4 clients (events/s)"],
    "sse": ["SSE append → client, PostgreSQL, 100 streams (p50 / p99)",
            "SSE append → client, SQLite, 100 streams (p50 / p99)"],
    "otlp": ["OTLP receive, batches of 512 spans (spans/s)",
             "OTLP duplicate export, batches of 512 spans (spans/s)"],
    "peer": ["one run end to end, concurrency 1 (p50)", "one run end to end, concurrency 1 (p95)",
             "trivial runs/s, concurrency 10", "trivial runs/s, concurrency 50"],
}


def bench_command(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """``python -m <args>`` from the repository, without this shell's AGENTLEDGER_ settings;
    it must exit 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
    env["PYTHONWARNINGS"] = "ignore"
    done = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
def fresh_pg_url():
    admin_url = normalize_url(os.environ.get("AGENTLEDGER_TEST_PG_URL", DEFAULT_PG_URL))
    try:
        psycopg.connect(_libpq(admin_url), autocommit=True, connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        if os.environ.get("AGENTLEDGER_REQUIRE_PG") == "1":
            pytest.fail(f"PostgreSQL not reachable: {exc}", pytrace=False)
        pytest.skip(f"PostgreSQL not reachable: {exc}")
    name = f"agentledger_benchsmoke_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    yield url  # the bench creates it (and its ``_peer`` and ``_cancel`` companions, which it drops)
    with psycopg.connect(_libpq(admin_url), autocommit=True) as admin:
        for db in (name, f"{name}_peer", f"{name}_cancel"):
            admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def _run_bench(url: str, out: Path) -> dict:
    bench_command("bench", "--db", url, "--smoke", "--skip-peer", "--out", str(out), timeout=400)
    assert (out / "latest.md").is_file() and (out / "latest.json").is_file()
    stamped = [p for p in out.iterdir() if p.name[0].isdigit()]
    assert {p.suffix for p in stamped} == {".md", ".json"}
    result = json.loads((out / "latest.json").read_text())
    found = {(r["section"], r["name"]): r for r in result["rows"]}
    for section, names in EXPECTED.items():
        for name in names:
            assert (section, name) in found, f"missing row {section} / {name}"
    assert not [r for r in result["rows"] if r["status"] == "error"]
    # Cancel latency: a row per agent kind this machine runs, each from every run it cancelled.
    cancels = [r for r in result["rows"] if r["section"] == "cancel"]
    assert sorted(r["name"].split(", ")[1] for r in cancels) == sorted(kinds_here())
    assert all(r["detail"]["ledger"]["max"] is not None for r in cancels)
    markdown = (out / "latest.md").read_text()
    assert result["config"]["smoke"] and "mode: smoke;" in markdown
    for names in EXPECTED.values():
        for name in names:
            assert name in markdown
    for key in ("cpus", "memory_gb", "python", "git_commit"):
        assert key in result["machine"]
    return result


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_smoke_bench_on_postgresql(fresh_pg_url, tmp_path):
    result = _run_bench(fresh_pg_url, tmp_path / "results")
    assert result["machine"]["postgresql"]
    rows = {(r["section"], r["name"]): r for r in result["rows"]}
    # PostgreSQL runs have the raw psycopg baseline beside the project's numbers.
    assert rows[("writes", "run creation, 4 clients")]["raw"]
    assert rows[("reads", "provenance")]["detail"]["raw"]["n"] > 0
    # The load says where its CPU went: the importer's processes and the local PostgreSQL's.
    load = rows[("load", "bulk import / demo seed (events/s)")]["detail"]
    assert load["importer_cpu_us_per_event"] > 0 and load["postgres_cpu_us_per_event"] > 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_smoke_bench_on_sqlite(tmp_path):
    result = _run_bench(f"sqlite:///{tmp_path / 'bench.db'}", tmp_path / "results")
    assert result["machine"]["database"] == "sqlite"


@pytest.mark.slow  # a bench command in a process of its own
@pytest.mark.timeout(300)
def test_sqlite_peer_bench_writes_its_rows(tmp_path):
    """``python -m bench.sqlite_peer``: the peer workload on a fresh SQLite file, its rows in a
    Markdown and a JSON file of their own (``latest.md`` is the full PostgreSQL run's)."""
    bench_command("bench.sqlite_peer", "--smoke", "--skip-peer", "--out", str(tmp_path),
                  timeout=240)
    [written] = tmp_path.glob("sqlite-peer-*.json")
    result = json.loads(written.read_text())
    assert result["machine"]["database"] == "sqlite"
    rows = {r["name"]: r for r in result["rows"]}
    assert rows["one run end to end, concurrency 1 (p50)"]["project"] > 0
    assert rows["trivial runs/s, concurrency 50"]["project"] > 0
    assert rows["server CPU per trivial run, concurrency 50 (ms)"]["project"] > 0
    assert not (tmp_path / "latest.md").exists()
    assert "| trivial runs/s, concurrency 50 |" in written.with_suffix(".md").read_text()


@pytest.mark.slow  # a bench command in a process of its own
@pytest.mark.timeout(300)
def test_ingest_cpu_bench_prints_every_operation_beside_raw(fresh_pg_url):
    done = bench_command("bench.ingest_cpu", "--db", fresh_pg_url, "--ops", "20", timeout=240)
    lines = {line.split("|")[1].strip(): line for line in done.stdout.splitlines()
             if line.startswith("| ") and not line.startswith("| operation")}
    assert set(lines) == {"run creation", "append, batch of 1", "append, batch of 100"}
    for line in lines.values():
        cells = [c.strip() for c in line.strip("|").split("|")[1:]]
        assert all(float(c) > 0 for c in cells), line


@pytest.mark.slow  # a bench command in a process of its own
@pytest.mark.timeout(300)
def test_storage_bench_sizes_plain_and_partitioned_tables_and_archives(fresh_pg_url):
    """``python -m bench.storage``: ``agent_run`` and ``message`` are plain tables, for which
    ``pg_partition_tree()`` returns no rows; they are sized all the same, beside the
    partitioned ``run_event``, before and after ``--archive-days``."""
    from agentledger.core.config import Settings
    from agentledger.core.migrate import upgrade
    from agentledger.demo import seed
    from bench.common import create_pg_database

    create_pg_database(fresh_pg_url)
    upgrade(fresh_pg_url)
    seed(Settings(database_url=fresh_pg_url), runs=30, days=40, seed=3)
    done = bench_command("bench.storage", "--db", fresh_pg_url, "--archive-days", "29", timeout=240)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip().strip("|").split("|")]
            for line in done.stdout.splitlines() if line.startswith("| ")}
    for table in ("run_event", "agent_run", "message"):
        count = int(rows[table][1].replace(",", ""))
        assert count > 0 and rows[table][4].endswith("MB"), rows[table]
    assert re.search(r"^[1-9][\d,]* runs and [1-9][\d,]* events archived in ", done.stdout,
                     re.MULTILINE), done.stdout


def test_spread_reports_each_run_and_whether_every_run_met_the_target(tmp_path):
    def run(stamp: str, p95: float, status: str) -> Path:
        path = tmp_path / f"{stamp}.json"
        path.write_text(json.dumps({"started_at": stamp, "rows": [
            {"section": "reads", "name": "agent + version outcomes, 1h", "unit": "ms p95",
             "project": p95, "target": "queries p95 ≤ 20 ms", "status": status},
            {"section": "reads", "name": "run list", "unit": "ms p95", "project": 3.0,
             "target": "", "status": "n/a"},
        ]}))
        return path

    files = [run("a", 7.5, "pass"), run("b", 21.0, "miss"), run("c", 9.25, "pass")]
    done = subprocess.run([sys.executable, "-m", "bench.spread", *map(str, files)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| reads")]
    assert len(rows) == 1  # rows without a target are not judged
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[3:6] == ["7.5", "21", "9.25"]
    assert cells[6] == "7.5 – 21"
    assert cells[8] == "no (pass, miss, pass)"


@pytest.mark.process  # the bench starts a real `agentledger serve`
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_lifecycle_bench_cuts_each_run_into_phases_in_causal_order(kind, request, tmp_path):
    """``python -m bench.lifecycle``: every run of the one-at-a-time part has every phase, the
    ledger's stamps fall between the client's moments (post start < run.queued, the terminal
    event < the stream's end), and the concurrent part runs without errors."""
    from bench.lifecycle import PHASES, measure, report

    url = (f"sqlite:///{tmp_path / 'unused.db'}" if kind == "sqlite"
           else request.getfixturevalue("fresh_pg_url"))
    found = measure(url, tmp_path, runs=6, clients=3, seconds=1.0, workers=1)
    single = found["single"]
    assert set(single) == set(PHASES) and all(len(v) == 6 for v in single.values())
    for i in range(6):
        assert single["to queued"][i] > 0 and single["delivery"][i] > 0
        assert single["queue wait"][i] >= 0 and single["execution"][i] >= 0
        assert single["total"][i] >= single["post"][i] + single["stream open"][i]
        assert single["total"][i] > single["queue wait"][i] + single["execution"][i]
    concurrent = found["concurrent"]
    assert concurrent["errors"] == 0 and concurrent["runs_per_s"] > 0
    assert concurrent["server_cpu_ms"] > 0 and concurrent["client_cpu_ms"] > 0
    if kind == "postgresql":
        assert concurrent["postgres_cpu_ms"] > 0 and concurrent["sessions_opened"] is not None
    else:
        assert concurrent["postgres_cpu_ms"] is None
    text = report(found)
    assert all(phase in text for phase in PHASES) and "3 clients at once" in text
