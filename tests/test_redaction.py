"""Redaction before hashing (CONTRACT §9, ``AGENTLEDGER_REDACT``): what each detector catches and
leaves, refused settings, and, on both databases, that no detected value reaches any table on any
write path (message posts with context, executor events, child runs, answers, the bulk import,
OTLP spans) while every chain still verifies; without redaction the values are written as given."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text
from support.api import FlaskApi, append, claim_run, open_session, send
from support.factories import make_agent

from agentledger.core.config import Settings
from agentledger.core.database import Database
from agentledger.core.evidence_format import verify_bundle
from agentledger.core.redaction import Redactor, luhn_valid, parse_rules
from agentledger.core.schema import AgentRun, ChatSession, OtlpConversation, OtlpSpan
from ingest.bulk_import import ImportedEvent, ImportedRun, ImportedSession, bulk_import
from ingest.otlp import receive_spans
from ingest.otlp.wire import ReceivedSpan
from ingest.runs import ContextItem
from queries.chain_verification import verify_chains

EVERYTHING = r"email,phone,card,secret,re:ACME-\d{4}"

# Planted values, by the marker that must replace them.
EMAIL = "jane.doe+billing@example.com"
PHONE = "+1 (415) 555-0134"
PHONE_US = "415-555-0188"
CARD = "4111 1111 1111 1111"
OPENAI_KEY = "sk-proj-Q7x2Lm9Pa4Rt8Zk1Vb6N"
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
GITHUB = "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
BEARER = "Bearer eyJhbGciOiJIUzI1NiJ9.payload-part.signature-part"
PEM = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"
CUSTOM = "ACME-7731"
PLANTED = (EMAIL, PHONE, PHONE_US, CARD, OPENAI_KEY, AWS_KEY, GITHUB, "eyJhbGciOiJIUzI1NiJ9",
           "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC", CUSTOM, "jane.doe", "4111", "0134", "0188",
           "Q7x2Lm9P", "IOSFODNN7", "A1b2C3d4", "7731")


def _redact(text_: str, spec: str = EVERYTHING) -> str:
    return Redactor(parse_rules(spec)).text(text_)


# ---- the detectors ---------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "kind"), [
    (EMAIL, "email"), ("a.b@sub.example.org", "email"),
    (PHONE, "phone"), (PHONE_US, "phone"), ("(212) 555-0100", "phone"), ("212.555.0100", "phone"),
    ("+44 20 7946 0958", "phone"), ("+4915112345678", "phone"),
    (CARD, "card"), ("5500-0055-5555-5559", "card"), ("378282246310005", "card"),
    (OPENAI_KEY, "secret"), ("sk-ant-api03-abcdefghijklmnopqrstuv", "secret"), (AWS_KEY, "secret"),
    (GITHUB, "secret"), (BEARER, "secret"), (PEM, "secret"),
    ("xoxb-1234567890-abcdefghij", "secret"), (CUSTOM, "re"),
])
def test_each_detector_replaces_what_it_is_for(given, kind):
    assert _redact(f"before {given} after") == f"before [REDACTED:{kind}] after"


@pytest.mark.parametrize("kept", [
    "2026-12-01T11:13:37.123456Z", "192.168.100.200", "version 1.2.3", "order 12345678",
    "4111 1111 1111 1112",  # fails the Luhn check
    "run_01m8rmqpfz0qw7eecdrg5n8rdc", "msg_01m8rmrwe2k7w95y88r136zr79", "1700000000000",
    "sk-short", "not an @ address", "price 1,234.56", "ACME-12", "+1 2 3", "UTC+05:30",
    "+12 3456 7890 1234 5678 90",  # more digits than any phone number
])
def test_what_the_detectors_leave_alone(kept):
    assert _redact(kept) == kept


def test_luhn():
    assert luhn_valid("4111111111111111") and luhn_valid("79927398713")
    assert not luhn_valid("4111111111111112")


def test_only_the_named_detectors_apply_and_json_is_redacted_recursively():
    redactor = Redactor(parse_rules("email"))
    value = {"to": [EMAIL, {"cc": EMAIL, "n": 3}], EMAIL: CARD, "ok": True}
    assert redactor.value(value) == {"to": ["[REDACTED:email]", {"cc": "[REDACTED:email]", "n": 3}],
                                     EMAIL: CARD, "ok": True}
    assert redactor.count == 2
    assert parse_rules("") == () and parse_rules(" , ") == ()


@pytest.mark.parametrize(("raw", "patterns", "kinds"), [
    ("re:a{1,2}", ["a{1,2}"], []),
    ("re:[0-9]{3,},email", ["[0-9]{3,}"], ["email"]),
    ("email, re:x{2,3} ,phone,re:Smith, John,card", ["x{2,3}", "Smith, John"],
     ["email", "card", "phone"]),
    ("re:a{1,2},re:b{3,},secret", ["a{1,2}", "b{3,}"], ["secret"]),
    ("re:x,", ["x"], []), ("re:x, ,email", ["x"], ["email"]),
    ("re:Dear[,]email", ["Dear[,]email"], []), ("re:,x", [",x"], []),
])
def test_a_comma_that_does_not_start_a_detector_stays_in_its_pattern(raw, patterns, kinds):
    rules = parse_rules(raw)
    assert [r.pattern.pattern for r in rules if r.kind == "re"] == patterns
    assert sorted(r.kind for r in rules if r.kind != "re") == sorted(kinds)


def test_a_pattern_with_a_comma_redacts_what_it_says():
    assert _redact("ids 12345 and 12, mail jane@example.com", "re:[0-9]{3,},email") == (
        "ids [REDACTED:re] and 12, mail [REDACTED:email]")
    assert _redact("aa a b", "re:a{2,2}") == "[REDACTED:re] a b"


def test_markers_stay_whole_and_a_second_pass_changes_nothing():
    # [A-Z]{5,} matches REDACTED inside the marker the email detector leaves: it mangled it into
    # "[[REDACTED:re]:email]", more with every pass (the answer is its redacted deltas, redacted
    # again), and counted each mangling as a value.
    redactor = Redactor(parse_rules("email,re:[A-Z]{5,},re:email|re"))
    once = redactor.text("mail x@y.com code ABCDEF, re email")
    assert once == "mail [REDACTED:email] code [REDACTED:re], [REDACTED:re] [REDACTED:re]"
    assert redactor.count == 4
    assert redactor.text(once) == once and redactor.count == 4
    assert redactor.value({"a": [once, "ABCDEF"]}) == {"a": [once, "[REDACTED:re]"]}


def test_an_empty_match_found_in_a_text_is_never_replaced():
    # Only the start check stands between such a pattern and a marker between two characters;
    # one it cannot see (nothing in its sample text is a Z) must not insert any either.
    redactor = Redactor(parse_rules("re:(?=Z)|QQ"))
    assert redactor.text("aZb QQ Z") == "aZb [REDACTED:re] Z" and redactor.count == 1


@pytest.mark.parametrize(("raw", "says"), [
    ("emails", "unknown detector 'emails'"), ("email,ssn", "unknown detector 'ssn'"),
    ("re:", "re: needs a pattern"), ("re:(", "not a valid regular expression"),
    ("re:x*", "matches the empty string"), ("re:,email", "re: needs a pattern"),
    # Empty matches inside a text, not of an empty text: markers between every two words.
    (r"re:\b", "matches the empty string"), ("re:(?=x)", "matches the empty string"),
    ("re:a,,b", "unknown detector 'b'"),
    ("re:a{1,2},emial", "'emial' after the pattern 're:a{1,2}' looks like the detector 'email'"),
    ("re:a,Phone", "looks like the detector 'phone'"),
    ("re:a,RE:b", "looks like a second pattern"),
    (r"re:[0-9]{3\x2c}", "writes the comma of a {m,n} quantifier as \\x2c"),
])
def test_an_invalid_setting_is_refused_at_start_with_a_clear_message(monkeypatch, raw, says):
    monkeypatch.setenv("AGENTLEDGER_REDACT", raw)
    with pytest.raises(SystemExit) as refused:
        Settings.from_env()
    assert says in str(refused.value) and "AGENTLEDGER_REDACT" in str(refused.value)
    env = {**os.environ, "AGENTLEDGER_REDACT": raw}
    done = subprocess.run([sys.executable, "-m", "agentledger.cli", "db", "upgrade"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("agentledger: AGENTLEDGER_REDACT")
    assert says in done.stderr and "Traceback" not in done.stderr


# ---- every write path, on both databases ------------------------------------------------------


def _all_cells(db: Database) -> list[tuple[str, str]]:
    """Every value of every table, read with plain SQL (not through the API or queries)."""
    from agentledger.core.schema import Base

    cells = []
    with db.engine.connect() as connection:
        for table in Base.metadata.sorted_tables:
            for row in connection.execute(text(f"SELECT * FROM {table.name}")):
                # Text and JSON only: a planted fragment such as "0134" can turn up by chance in
                # the digits of a float (a latency sum of 0.013426 s), which no detector redacts.
                cells.extend((table.name, leaf) for value in row for leaf in _leaves(value)
                             if not _MACHINE_MADE.fullmatch(leaf))
    return cells


def _leaves(value) -> list[str]:
    """The strings a cell holds: itself, or each key and string of a JSON document (PostgreSQL
    hands jsonb over parsed, SQLite as text), so a timestamp inside an event's payload is judged
    on its own like one in a column."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str) and value[:1] in "{[":
        try:
            value = json.loads(value)
        except ValueError:
            return [value]
    if isinstance(value, dict):
        return [leaf for key, item in value.items() for leaf in (str(key), *_leaves(item))]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value] if isinstance(value, str) else []


# Values the ledger makes itself, never from input: hashes (hex), ids, and on SQLite the text of
# a timestamp. Their digits hold a four-digit fragment by chance (a 64-digit hash does about
# once in a thousand), which would read as a leak.
_MACHINE_MADE = re.compile(
    r"[0-9a-f]{64}"
    r"|[a-z]+_[0-9a-z]{26}"
    r"|\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:?\d\d|Z)?"
)


def _write_everything(db: Database, url: str, *, redacted: bool) -> dict:
    api = FlaskApi(db, url)
    try:
        make_agent(db, "helper")
        chat = open_session(api, api.alice)
        context = [{"id": "crm", "title": f"Customer {EMAIL}", "content": f"card {CARD}, {CUSTOM}"},
                   {"id": "keys", "title": "Deploy notes", "content": f"{PEM}\naws {AWS_KEY}"}]
        # The test's own identifiers are fixed and digit-free (the database is this test's alone):
        # one made by `unique` holds a pid and a clock reading, whose digits hold a planted
        # fragment such as "7731" by chance, which would read as a leak.
        key = "redaction-first"
        content = f"Mail {EMAIL} or call {PHONE}; my key is {OPENAI_KEY}"
        first = send(api, api.alice, chat["id"], content, key=key, context=context)
        again = send(api, api.alice, chat["id"], content, key=key, context=context)
        assert again.headers.get("Idempotent-Replayed") == "true"  # a replay is still a replay
        assert again.json() == first.json()
        run_id = first.json()["run_id"]

        instance = "exec-redaction"
        claimed = claim_run(api, api.executor, run_id, instance)
        assert (EMAIL not in claimed["input"]) is redacted
        assert ("[REDACTED:email]" in claimed["input"]) is redacted
        reply = append(api, api.executor, run_id, instance, [
            ("tool.call", {"name": "crm", "input": {"query": {"who": [EMAIL, PHONE_US]},
                                                     "auth": BEARER}}),
            ("tool.result", {"name": "crm", "output": {"token": GITHUB, "rows": 2}}),
            ("message.delta", {"text": "Your card "}),
            ("message.delta", {"text": f"{CARD} is on file; reach us at {EMAIL}."}),
        ])
        assert reply.status == 200, reply
        child = api.post(f"/api/executor/runs/{run_id}/children", api.executor,
                         json={"executor_instance_id": instance, "agent_id": "helper",
                               "input": f"email {EMAIL} about {CUSTOM}"})
        assert child.status == 201, child
        child_id = child.json()["run_id"]
        claim_run(api, api.executor, child_id, instance)
        assert append(api, api.executor, child_id, instance, [
            ("run.failed", {"error": {"code": "agent_error", "message": f"bad key {OPENAI_KEY}"}}),
        ]).status == 200
        done = append(api, api.executor, run_id, instance, [("run.completed", {})])
        assert done.status == 200, done

        # A second answer given as explicit content, on a run of its own.
        second = send(api, api.alice, chat["id"], "and again?", key="redaction-second").json()["run_id"]
        claim_run(api, api.executor, second, instance)
        assert append(api, api.executor, second, instance, [
            ("run.completed", {"content": f"Sure: {PHONE} / {AWS_KEY}"})]).status == 200

        t0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
        imported_child = ImportedRun(
            agent_id="helper", agent_version=1, input=f"look up {EMAIL}",
            created_at=t0 + timedelta(seconds=2), events=[
                ImportedEvent("run.started", {"executor_instance_id": "ext-2"}, t0 + timedelta(seconds=2)),
                ImportedEvent("run.completed", {"content": f"found {PHONE_US}"}, t0 + timedelta(seconds=3))])
        imported = ImportedRun(
            agent_id="echo", agent_version=1, input=f"history with {CARD}", created_at=t0,
            session=ImportedSession(owner_id="alice", agent_id="echo", created_at=t0),
            context=[ContextItem("old", "Old notes", f"{GITHUB} {CUSTOM}")],
            idempotency_key="import-1", children=[imported_child], events=[
                ImportedEvent("run.started", {"executor_instance_id": "ext-1"}, t0 + timedelta(seconds=1)),
                ImportedEvent("run.child_created", {"child_run_id": imported_child.id,
                                                    "agent_id": "helper"}, t0 + timedelta(seconds=2)),
                ImportedEvent("run.child_finished", {"child_run_id": imported_child.id,
                                                     "status": "succeeded"}, t0 + timedelta(seconds=3)),
                ImportedEvent("tool.call", {"name": "vault", "input": {"secret": OPENAI_KEY}},
                              t0 + timedelta(seconds=4)),
                ImportedEvent("message.delta", {"text": f"mail {EMAIL}"}, t0 + timedelta(seconds=5)),
                ImportedEvent("run.completed", {}, t0 + timedelta(seconds=6))])
        bulk_import(db, [imported])

        admin_view = api.get(f"/api/agent-runs/{run_id}", api.admin).json()
        owner_view = api.get(f"/api/agent-runs/{run_id}", api.alice).json()
        answer = api.get(f"/api/agent-runs/{run_id}", api.alice).json()["final_message_id"]
        bundle = api.get(f"/api/messages/{answer}/evidence", api.viewer).json()
        counts = {r: api.get(f"/api/agent-runs/{r}", api.admin).json()["redaction_count"]
                  for r in (run_id, child_id, second, imported.id, imported_child.id)}
        return {"admin": admin_view, "owner": owner_view, "bundle": bundle, "counts": counts}
    finally:
        api.close()


def test_with_redaction_no_table_holds_a_detected_value_and_chains_verify(db, db_url):
    redacting = Database(db_url, redaction_rules=parse_rules(EVERYTHING))
    try:
        seen = _write_everything(redacting, db_url, redacted=True)
        cells = _all_cells(redacting)
        leaks = [(table, value[:120]) for table, value in cells
                 for planted in PLANTED if planted in value]
        assert not leaks, leaks
        assert any("[REDACTED:secret]" in v for t, v in cells if t == "context_blob")
        assert any("[REDACTED:card]" in v for t, v in cells if t == "message")
        assert any("[REDACTED:email]" in v for t, v in cells if t == "run_event")
        with redacting.read(transaction=True) as s:
            report = verify_chains(s)
        assert report.ok and report.runs_checked == 5, report.problems
        assert verify_bundle(seen["bundle"]).ok
        # Post: content (email, phone, key) + context (email, card, custom, PEM, AWS key) = 8;
        # events: 2 (tool.call) + 1 (Bearer) + 1 (GitHub) + 2 (card, email in the delta) = 6.
        root, child, second, imp, imp_child = seen["counts"].values()
        assert root == 14 and child == 3 and second == 2 and imp == 5 and imp_child == 2
        assert seen["admin"]["redaction_count"] == 14
        assert "redaction_count" not in seen["owner"]
    finally:
        redacting.dispose()


def test_without_redaction_values_are_written_as_given(db, db_url):
    seen = _write_everything(db, db_url, redacted=False)
    cells = [value for _, value in _all_cells(db)]
    for planted in (EMAIL, CARD, OPENAI_KEY, AWS_KEY, GITHUB, CUSTOM, PHONE_US):
        assert any(planted in value for value in cells), planted
    assert not any("[REDACTED:" in value for value in cells)
    assert set(seen["counts"].values()) == {0}
    with db.read(transaction=True) as s:
        assert verify_chains(s).ok


def test_log_lines_are_redacted(db_url, caplog):
    import logging

    from agentledger.core import redaction

    previous = logging.getLogRecordFactory()
    try:
        Database.from_settings(Settings(database_url=db_url, redact="email,secret")).dispose()
        with caplog.at_level(logging.WARNING, logger="agentledger.test"):
            try:
                raise ValueError(f"agent choked on {OPENAI_KEY}")
            except ValueError:
                logging.getLogger("agentledger.test").exception("run for %s failed", EMAIL)
        logged = caplog.text
        assert EMAIL not in logged and OPENAI_KEY not in logged
        assert "[REDACTED:email]" in logged and "[REDACTED:secret]" in logged
        assert isinstance(logging.getLogRecordFactory(), redaction._RedactingRecords)
    finally:
        logging.setLogRecordFactory(previous)


# ---- the OTLP receiver ------------------------------------------------------------------------


def _otlp_span(trace: int, span: int, parent: int | None, attrs: dict, start_ms: int,
               end_ms: int, *, name: str, status_message: str | None = None) -> ReceivedSpan:
    t0 = datetime(2026, 12, 1, 9, tzinfo=UTC)
    return ReceivedSpan(f"{trace:032x}", f"{span:016x}", None if parent is None else f"{parent:016x}",
                        "svc-zz9", name, t0 + timedelta(milliseconds=start_ms),
                        t0 + timedelta(milliseconds=end_ms), 2 if status_message else 0,
                        status_message, attrs)


def _otlp_agent(conversation: str, **attrs) -> dict:
    return {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "helper",
            "gen_ai.conversation.id": conversation, **attrs}


def test_otlp_spans_are_redacted_before_they_are_stored_and_conversations_stay_apart(db_url):
    """Every text of a span (attributes at any depth, name, status message, service) is stored
    redacted. A conversation id that redaction changes is keyed by the digest of the id as sent:
    two addresses stay two conversations, titled with the redacted id; an id redaction leaves
    alone is the key itself."""
    redacting = Database(db_url, redaction_rules=parse_rules("email,phone,card,secret,re:zz[0-9]+"))
    try:
        erin, judy = "conv-erin@example.com", "conv-judy@example.com"
        whole = [  # one export of a whole trace: stored already recorded
            _otlp_span(1, 1, None, _otlp_agent(
                erin, **{"input.value": "otlp carol@example.com zz42",
                         "output.value": "answer dave@example.com",
                         "app.nested": {"to": ["frank@example.com", {"cc": "zz7"}], "n": 3}}),
                0, 100, name="invoke_agent for gina@example.com"),
            _otlp_span(1, 2, 1, {"gen_ai.operation.name": "execute_tool",
                                 "gen_ai.tool.name": "mail",
                                 "gen_ai.tool.call.arguments": '{"to": "hank@example.com"}'},
                       10, 20, name="execute_tool mail", status_message="no mailbox ivy@example.com")]
        assert receive_spans(redacting, "owner", whole).runs_written == 1
        # A trace in two exports (the general path reads the stored spans back), another address.
        child = _otlp_span(2, 2, 1, {"gen_ai.operation.name": "chat", "gen_ai.output.messages":
                                     json.dumps([{"role": "assistant", "parts": [
                                         {"type": "text", "content": "to kim@example.com"}]}])},
                           10, 20, name="chat")
        assert receive_spans(redacting, "owner", [child]).runs_written == 0
        assert receive_spans(redacting, "owner", [_otlp_span(
            2, 1, None, _otlp_agent(judy, **{"input.value": "hi"}), 0, 100,
            name="invoke_agent")]).runs_written == 1
        # The first address again, and an id redaction leaves alone (its forged key ignored).
        assert receive_spans(redacting, "owner", [_otlp_span(
            3, 1, None, _otlp_agent(erin), 0, 100, name="invoke_agent")]).runs_written == 1
        assert receive_spans(redacting, "owner", [_otlp_span(
            4, 1, None, _otlp_agent("plain-conv-1", **{
                "agentledger.conversation.key": "sha256:forged"}), 0, 100,
            name="invoke_agent")]).runs_written == 1

        cells = [value for _, value in _all_cells(redacting)]
        leaks = [v[:120] for v in cells if re.search(r"[a-z]+@example\.com|zz[0-9]", v)]
        assert not leaks, leaks
        with redacting.read() as s:
            sessions = {r.id: r.session_id for r in s.execute(select(AgentRun)).scalars()}
            keys = dict(s.execute(select(OtlpConversation.session_id,
                                         OtlpConversation.conversation_id)).tuples().all())
            titles = dict(s.execute(select(ChatSession.id, ChatSession.title)).tuples().all())
        by_trace = {}
        with redacting.read() as s:
            for trace in (1, 2, 3, 4):
                run_id = s.execute(select(OtlpSpan.run_id).where(
                    OtlpSpan.trace_id == f"{trace:032x}", OtlpSpan.parent_span_id.is_(None))
                ).scalar_one()
                by_trace[trace] = sessions[run_id]
        assert by_trace[1] == by_trace[3] != by_trace[2]
        # Each run counts the replacements in the spans it was built from, each span's service
        # name ("svc-zz9") one of them: trace 1's agent span (service, conversation id, 2 in its
        # input, its output, 2 nested, its name) and tool span (service, arguments, status
        # message); trace 2's two spans across two exports; trace 4's service name only.
        with redacting.read() as s:
            counts = {trace: s.execute(select(AgentRun.redaction_count).join(
                OtlpSpan, OtlpSpan.run_id == AgentRun.id).where(
                    OtlpSpan.trace_id == f"{trace:032x}", OtlpSpan.parent_span_id.is_(None))
            ).scalar_one() for trace in (1, 2, 3, 4)}
        assert counts == {1: 11, 2: 4, 3: 2, 4: 1}
        assert keys[by_trace[1]] == "sha256:" + hashlib.sha256(erin.encode()).hexdigest()
        assert keys[by_trace[2]] == "sha256:" + hashlib.sha256(judy.encode()).hexdigest()
        # The email detector takes "conv-erin@…" whole: both ids redact to the same text.
        assert titles[by_trace[1]] == titles[by_trace[2]] == "[REDACTED:email]"
        assert keys[by_trace[4]] == titles[by_trace[4]] == "plain-conv-1"
        assert any("[REDACTED:email]" in v for v in cells) and any("[REDACTED:re]" in v
                                                                   for v in cells)
        with redacting.read(transaction=True) as s:
            assert verify_chains(s).ok
    finally:
        redacting.dispose()
