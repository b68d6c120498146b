"""Hostile input and tampering (the guarantees table, docs/guarantees.md: "fuzzing" and "tampering").

Fuzzing: schemathesis's own engine (the one its command line runs) tests every operation of
``/api/openapi.json`` on a real ``agentledger serve --no-worker`` process, once with an admin
bearer token and once anonymous, through every phase: examples (skipped by schemathesis: the
document declares none), coverage (boundary and invalid values of every parameter, undeclared
methods), fuzzing and stateful (chains of calls that reuse returned ids). Every check runs but
``positive_data_acceptance``: schema-valid requests may still be refused with a semantic 404/409/
422 (an unknown agent, a run that is not this executor's) that a schema cannot express. The number
of examples per operation is fixed up front, not a time budget: 25, ``FUZZ_EXAMPLES=n`` sets
another count, ``SOAK=1`` runs 500; the stateful phase runs a fifth as many scenarios of up to
six calls each. Generation is deterministic, so a failure reproduces.

Tampering: 10,000 clean events verify with 0 problems; then, with the append-only triggers
dropped, one payload is edited, one event deleted and two seqs swapped, each in a different run
chosen at random: ``agentledger verify`` exits 1 and names exactly the damaged (run, seq) pairs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

import pytest
from sqlalchemy import text
from support.api import ServerProcess, make_tokens
from support.factories import make_agent
from support.guarantees import seed_runs, seeded_random, soak

from agentledger.core.database import Database

# ---- fuzzing ----------------------------------------------------------------------------------

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.engine import Status, events, from_schema  # noqa: E402

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES") or soak(25, 500))
# The stateful phase counts scenarios (chains of up to STATEFUL_STEPS calls), not examples.
STATEFUL_SCENARIOS = max(1, EXAMPLES // 5)
STATEFUL_STEPS = 6
PHASES = ["examples", "coverage", "fuzzing", "stateful"]
EXCLUDED_CHECKS = ["positive_data_acceptance"]
# Checks that must have judged at least one response (proof that the full set ran).
MUST_RUN = {"not_a_server_error", "status_code_conformance", "content_type_conformance",
            "response_schema_conformance", "response_headers_conformance",
            "negative_data_rejection", "unsupported_method"}


@pytest.fixture(scope="module")
def fuzz_target(module_db_url, tmp_path_factory):
    db = Database(module_db_url)
    make_agent(db, "echo", name="Echo")
    tokens = make_tokens(db, {"admin": ("root", "admin")})
    server = ServerProcess(module_db_url, tmp_path_factory.mktemp("fuzz"),
                           env={"AGENTLEDGER_RUN_RATE_LIMIT": "0"})
    yield db, server, tokens
    server.stop()
    db.dispose()


def run_schemathesis(base_url: str, headers: dict[str, str]):
    """All phases and checks of schemathesis on the live server: (failures, phases, checks run)."""
    schema = schemathesis.openapi.from_url(f"{base_url}/api/openapi.json")
    config = schema.config
    if headers:
        config.update(headers=headers)
    config.phases.update(phases=PHASES)
    config.generation.update(max_examples=EXAMPLES, deterministic=True)
    config.checks.update(excluded_check_names=EXCLUDED_CHECKS)
    # an over-long URL (a long, multi-byte parameter) is refused with 414: a rejection too
    config.checks.negative_data_rejection.expected_statuses = [
        *config.checks.negative_data_rejection.expected_statuses, "414", "431"]
    for phase in (config.phases.examples, config.phases.coverage, config.phases.fuzzing,
                  config.phases.stateful):
        phase.checks.update(excluded_check_names=EXCLUDED_CHECKS)
    config.phases.stateful.generation.update(max_examples=STATEFUL_SCENARIOS, deterministic=True)
    config.phases.stateful.max_steps = STATEFUL_STEPS
    failures: list[str] = []
    phases: dict[str, str] = {}
    checks_run: set[str] = set()
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            for nodes in event.recorder.checks.values():
                for node in nodes:
                    checks_run.add(node.name)
                    if node.status == Status.FAILURE:
                        failure = node.failure_info.failure
                        failures.append(f"[{event.phase.value}] {event.label}: {node.name}: "
                                        f"{failure.title}\n{failure.message}\n"
                                        f"{node.failure_info.code_sample}"[:3000])
            if event.status == Status.ERROR:
                failures.append(f"[{event.phase.value}] {event.label}: scenario error")
        elif isinstance(event, (events.NonFatalError, events.FatalError)):
            failures.append(f"{type(event).__name__}: {getattr(event, 'label', '')}: "
                            f"{getattr(event, 'value', event)!r}"[:3000])
        elif isinstance(event, events.PhaseFinished):
            phases[event.phase.name.value] = event.status.value
    return failures, phases, checks_run


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("who", ["admin", "anonymous"])
def test_schemathesis_finds_no_failures(fuzz_target, who):
    db, server, tokens = fuzz_target
    headers = {"Authorization": f"Bearer {tokens['admin']}"} if who == "admin" else {}
    started = time.monotonic()
    failures, phases, checks_run = run_schemathesis(server.base_url, headers)
    elapsed = time.monotonic() - started
    print(f"[fuzz {who} {db.dialect}] phases {phases}, {EXAMPLES} examples per operation, "
          f"checks {sorted(checks_run)}, {len(failures)} failures, {elapsed:.1f}s")
    for phase in ("coverage", "fuzzing", "stateful"):
        assert phases.get(phase) in ("success", "failure"), phases  # the phase ran
    expected_checks = MUST_RUN | ({"ignored_auth"} if who == "admin" else set())
    assert expected_checks <= checks_run, sorted(checks_run)
    assert "positive_data_acceptance" not in checks_run
    assert failures == [], "\n\n".join(failures)


@pytest.mark.parametrize("path, body", [
    ("/api/executor/claim", {"executor_instance_id": "a\u0000"}),
    ("/api/executor/runs/run_x/heartbeat", {"executor_instance_id": "\u0000"}),
    ("/api/executor/runs/run_x/events", {"executor_instance_id": "\ud800",
                                         "events": [{"type": "message.delta", "data": {}}]}),
    ("/api/executor/runs/run_x/children", {"executor_instance_id": "\u0000", "agent_id": "echo",
                                           "input": "x"}),
])
def test_found_by_fuzzing_nul_in_an_executor_instance_id_is_422_not_500(api, path, body):
    """schemathesis found this on PostgreSQL (text cannot hold NUL): a 500 before the fix."""
    reply = api.post(path, token=api.executor, json=body)
    assert reply.status == 422 and reply.json()["error"]["code"] == "validation_error", reply


# ---- tampering --------------------------------------------------------------------------------

AGENTLEDGER = shutil.which("agentledger")
CLEAN_RUNS = soak(50, 250)
EVENTS_PER_RUN = 200


def verify(db_url: str, *args: str) -> tuple[int, set[tuple[str, int]], str]:
    assert AGENTLEDGER, "the agentledger console script is not installed"
    done = subprocess.run([AGENTLEDGER, "verify", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "AGENTLEDGER_DATABASE_URL": db_url})
    named = {(m.group(1), int(m.group(2)))
             for m in re.finditer(r"^TAMPERED run (\S+) seq (\d+):", done.stdout, re.M)}
    return done.returncode, named, done.stdout + done.stderr


@pytest.fixture
def unguarded(db):
    """The run_event append-only triggers dropped (put back afterwards on PostgreSQL, whose
    database the test session shares)."""
    with db.engine.begin() as conn:
        if db.is_postgres:
            definition = conn.execute(text(
                "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgname = "
                "'run_event_append_only' AND tgrelid = 'run_event'::regclass")).scalar_one()
            conn.exec_driver_sql("DROP TRIGGER run_event_append_only ON run_event")
        else:
            conn.exec_driver_sql("DROP TRIGGER run_event_no_update")
            conn.exec_driver_sql("DROP TRIGGER run_event_no_delete")
    yield db
    if db.is_postgres:
        with db.engine.begin() as conn:
            conn.exec_driver_sql(definition)


def tamper(db: Database, sql: str, **params) -> None:
    with db.engine.begin() as conn:
        assert conn.execute(text(sql), params).rowcount >= 1, sql


def test_verify_names_exactly_the_tampered_run_and_seq(unguarded, db_url, soak_loop):
    db = unguarded
    rng = seeded_random(f"tamper-{db.dialect}")
    make_agent(db, "echo")
    started = time.monotonic()
    runs = seed_runs(db, rng, runs=CLEAN_RUNS, events_per_run=EVENTS_PER_RUN)
    seeded = time.monotonic() - started
    code, named, out = verify(db_url)
    total = CLEAN_RUNS * EVENTS_PER_RUN
    assert code == 0 and named == set(), out
    assert f"{CLEAN_RUNS} runs, {total} events" in out, out

    edit_run, delete_run, swap_run = rng.sample(runs, 3)
    expected: set[tuple[str, int]] = set()
    cases = 0

    seq = rng.randint(1, EVENTS_PER_RUN)
    tamper(db, "UPDATE run_event SET data = :d WHERE run_id = :r AND seq = :s",
           d='{"text": "a forged answer"}', r=edit_run, s=seq)
    expected.add((edit_run, seq))
    code, named, out = verify(db_url)
    assert code == 1 and named == expected, out
    cases += 1

    seq = rng.randint(1, EVENTS_PER_RUN)
    tamper(db, "DELETE FROM run_event WHERE run_id = :r AND seq = :s", r=delete_run, s=seq)
    expected.add((delete_run, seq))
    code, named, out = verify(db_url)
    assert code == 1 and named == expected, out
    cases += 1

    low, high = sorted(rng.sample(range(1, EVENTS_PER_RUN + 1), 2))
    for old, new in ((low, -1), (high, low), (-1, high)):
        tamper(db, "UPDATE run_event SET seq = :new WHERE run_id = :r AND seq = :old",
               r=swap_run, old=old, new=new)
    expected.add((swap_run, low))
    code, named, out = verify(db_url)
    assert code == 1 and named == expected, out
    cases += 1

    for victim, seq in expected:  # and each run on its own names only itself
        code, named, out = verify(db_url, "--run", victim)
        assert code == 1 and named == {(victim, seq)}, out
    clean = next(r for r in runs if r not in {edit_run, delete_run, swap_run})
    assert verify(db_url, "--run", clean)[:2] == (0, set())
    print(f"[tamper {db.dialect}] {cases}/3 cases named exactly; 0 false positives on "
          f"{total} clean events (seeded in {seeded:.1f}s)")
