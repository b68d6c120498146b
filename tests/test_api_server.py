"""The API served by a real ``agentledger serve --no-worker`` process (gunicorn), on SQLite and
PostgreSQL, driven with ``requests`` and read with a real Server-Sent-Events parser.

One server per database for the whole module; tests keep apart through their own sessions,
idempotency keys and executor instance ids. The server runs with
``AGENTLEDGER_SSE_KEEPALIVE_SECONDS=1`` so the keep-alive comment can be observed quickly.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from dataclasses import dataclass

import psycopg
import pytest
import requests
from sqlalchemy import func, select
from sqlalchemy.engine import make_url
from support.api import (
    STANDARD_TOKENS,
    RequestsHttp,
    ServerProcess,
    SSEStream,
    answer,
    append,
    assert_envelope,
    assert_error,
    claim_run,
    complete_run,
    event_frames_as_dicts,
    make_tokens,
    open_session,
    post_message,
    unique,
    wait_until,
)

from agentledger.core.config import Settings
from agentledger.core.database import Database
from agentledger.core.schema import AgentRun, Message, RunEvent
from ingest.events import append_events

pytestmark = pytest.mark.timeout(120)


@dataclass
class World:
    server: ServerProcess
    db: Database
    http: RequestsHttp
    tokens: dict

    def __getattr__(self, name):
        tokens = self.__dict__.get("tokens", {})
        if name in tokens:
            return tokens[name]
        raise AttributeError(name)

    @property
    def base(self) -> str:
        return self.server.base_url

    def stream(self, run_id: str, *, token: str | None = None, **kw) -> SSEStream:
        return SSEStream(self.base, f"/api/agent-runs/{run_id}/events",
                         token=self.alice if token is None else token, **kw)

    def stored_events(self, run_id: str) -> list[dict]:
        reply = self.http.request("GET", f"/api/agent-runs/{run_id}/events", token=self.admin,
                                  query={"limit": 500})
        assert reply.status == 200, reply
        return reply.json()["events"]


@pytest.fixture(scope="module")
def server(module_db_url, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("server")
    process = ServerProcess(module_db_url, workdir,
                            env={"AGENTLEDGER_SSE_KEEPALIVE_SECONDS": "1"})
    yield process
    process.stop()


@pytest.fixture(scope="module")
def world(server, module_db_url):
    db = Database(module_db_url)
    http = RequestsHttp(server.base_url)
    try:
        tokens = make_tokens(db, STANDARD_TOKENS)
        reply = http.request("POST", "/api/agents", token=tokens["admin"],
                             json={"id": "echo", "name": "Echo", "kind": "echo"})
        assert reply.status in (201, 409), reply
        yield World(server, db, http, tokens)
    finally:
        http.close()
        db.dispose()


def _running_run(world: World, content: str = "stream me") -> tuple[str, str]:
    """A fresh run in its own session, claimed by a fresh executor instance."""
    chat = open_session(world.http, world.alice)["id"]
    run = post_message(world.http, world.alice, chat, content)["run_id"]
    instance = unique("exec")
    claim_run(world.http, world.executor, run, instance)
    return run, instance


def _finished_run(world: World, deltas: int = 7) -> str:
    run, instance = _running_run(world)
    complete_run(world.http, world.executor, run, instance=instance, claim=False,
                 texts=[f"part{i} " for i in range(deltas)])
    return run


# ---- basics ------------------------------------------------------------------------------------


def test_health_and_json_errors_over_http(world, module_db_url):
    health = world.http.request("GET", "/api/health")
    assert health.status == 200
    assert health.json() == {"status": "ok", "database": "sqlite" if module_db_url.startswith(
        "sqlite") else "postgresql"}
    assert_error(world.http.request("GET", "/api/sessions"), 401, "unauthenticated")
    assert_error(world.http.request("GET", "/api/nowhere", token=world.alice), 404, "not_found")
    reply = world.http.request("DELETE", "/api/agents", token=world.admin)
    assert reply.status == 405 and assert_envelope(reply)["code"] == "method_not_allowed"
    assert_error(world.http.request("POST", "/api/sessions", token=world.alice, data=b"{bad"),
                 400, "invalid_request")


def test_an_oversized_body_is_413_over_http(world):
    chat = open_session(world.http, world.alice)["id"]
    big = b'{"content": "' + b"x" * (2 * 1024 * 1024) + b'"}'
    reply = world.http.request("POST", f"/api/sessions/{chat}/messages", token=world.alice,
                               data=big, headers={"Idempotency-Key": unique()})
    assert_error(reply, 413, "payload_too_large")
    history = world.http.request("GET", f"/api/sessions/{chat}/messages", token=world.alice)
    assert history.json()["items"] == []


def test_the_printed_admin_login_link_works(world):
    url = world.server.admin_login_url()
    assert url and url.startswith(world.base + "/login?token=")
    with requests.Session() as browser:
        with browser.get(url, allow_redirects=False, timeout=10) as login:
            assert login.status_code in (302, 303)
        with browser.get(world.base + "/api/agent-runs", timeout=10) as runs:
            assert runs.status_code == 200 and "items" in runs.json()


def test_a_full_conversation_over_http(world):
    chat = open_session(world.http, world.alice, title="over http")["id"]
    posted, answer_id = answer(world.http, world.alice, world.executor, chat, "ping",
                               texts=("po", "ng"))
    history = world.http.request("GET", f"/api/sessions/{chat}/messages", token=world.alice)
    assert [(m["role"], m["content"]) for m in history.json()["items"]] == [
        ("user", "ping"), ("assistant", "pong")]
    prov = world.http.request("GET", f"/api/messages/{answer_id}/provenance", token=world.viewer)
    assert prov.json()["run"]["id"] == posted["run_id"]


# ---- Server-Sent Events ------------------------------------------------------------------------


def test_stream_headers_and_retry_hint(world):
    run, _ = _running_run(world)
    with world.stream(run) as stream:
        assert stream.status == 200
        assert stream.headers["Content-Type"].split(";")[0].strip() == "text/event-stream"
        assert stream.headers["Cache-Control"] == "no-cache"
        assert stream.headers["X-Accel-Buffering"] == "no"
        first = stream.next_frame()
        assert first is not None and first.retry is not None and first.retry > 0
        assert not first.is_event
        events = stream.read_events(2)
        assert [(f.id, f.event) for f in events] == [("1", "run.queued"), ("2", "run.started")]
    assert not stream.parser.unknown_fields


def test_stream_receives_events_appended_after_it_connected_and_closes_after_the_terminal(world):
    run, instance = _running_run(world)
    with world.stream(run) as stream:
        assert [f.event for f in stream.read_events(2)] == ["run.queued", "run.started"]
        latencies = []
        for i in range(5):
            reply = append(world.http, world.executor, run, instance,
                           [("message.delta", {"text": f"d{i}"})])
            assert reply.status == 200, reply
            posted_at = time.monotonic()
            frame = stream.next_event()
            latencies.append(time.monotonic() - posted_at)
            assert frame is not None and frame.event == "message.delta"
            assert frame.json()["data"] == {"text": f"d{i}"} and frame.id == str(3 + i)
        reply = append(world.http, world.executor, run, instance, [("run.completed", {})])
        assert reply.status == 200
        final = stream.next_event()
        assert final.event == "run.completed" and final.id == "8"
        assert stream.next_event() is None and stream.closed_by_server
        assert not stream.parser.pending
    print(f"append-to-frame latencies: {[round(x, 3) for x in latencies]}")
    assert [e["seq"] for e in event_frames_as_dicts(
        [f for f in stream.frames if f.is_event])] == list(range(1, 9))


def test_events_written_by_another_process_reach_the_stream_promptly(world):
    """The test process appends through ``ingest`` directly: on PostgreSQL only NOTIFY (or the
    1 s safety poll) can wake the server's stream; on SQLite its short poll does."""
    run, instance = _running_run(world)
    latencies = []
    with world.stream(run) as stream:
        stream.read_events(2)
        for i in range(5):
            time.sleep(0.05 * i)
            with world.db.write() as s:
                append_events(s, run, [("message.delta", {"text": f"x{i}"})],
                              executor_instance_id=instance)
            written_at = time.monotonic()
            frame = stream.next_event()
            latencies.append(time.monotonic() - written_at)
            assert frame.event == "message.delta" and frame.json()["data"]["text"] == f"x{i}"
        with world.db.write() as s:
            append_events(s, run, [("run.completed", {})], executor_instance_id=instance)
        assert stream.next_event().event == "run.completed"
        assert stream.next_event() is None
    # Every event reached the stream (within the stream's read timeout). How fast is reported:
    # on PostgreSQL NOTIFY wakes the stream, without it only the 1 s safety poll would.
    print(f"{world.db.dialect}: write-to-frame latencies {[round(x, 3) for x in latencies]}, "
          f"median {statistics.median(latencies):.3f}s")


def test_reconnecting_at_every_position_reassembles_the_stored_events(world):
    run = _finished_run(world, deltas=7)
    stored = world.stored_events(run)
    assert len(stored) == 10 and stored[-1]["type"] == "run.completed"

    for seen in range(len(stored) + 1):
        # read `seen` events, drop the connection, resume with Last-Event-ID
        with world.stream(run) as first:
            head = first.read_events(seen)
        last_id = head[-1].id if head else None
        if seen == len(stored):
            with world.stream(run, last_event_id=last_id) as again:
                assert again.status == 204 and again.response.content == b""
            continue
        with world.stream(run, last_event_id=last_id) as second:
            assert second.status == 200
            tail = second.read_to_end()
            assert second.closed_by_server and not second.parser.pending
        assembled = event_frames_as_dicts(head + tail)
        assert assembled == stored, f"resume after {seen} events"

    for start in range(len(stored)):
        with world.stream(run, last_event_id=start) as stream:
            assert event_frames_as_dicts(stream.read_to_end()) == stored[start:]
    for at_or_after_terminal in (10, 11, 500):
        with world.stream(run, last_event_id=at_or_after_terminal) as stream:
            assert stream.status == 204
        with world.stream(run, query={"after_seq": at_or_after_terminal}) as stream:
            assert stream.status == 204


def test_last_event_id_wins_over_after_seq(world):
    run = _finished_run(world, deltas=3)
    with world.stream(run, query={"after_seq": 1}) as stream:
        assert [f.json()["seq"] for f in stream.read_to_end()] == [2, 3, 4, 5, 6]
    with world.stream(run, query={"after_seq": 1}, last_event_id=4) as stream:
        assert [f.json()["seq"] for f in stream.read_to_end()] == [5, 6]


def test_resume_of_a_live_stream_misses_nothing_written_while_disconnected(world):
    run, instance = _running_run(world)
    append(world.http, world.executor, run, instance, [("message.delta", {"text": "a"})])
    with world.stream(run) as stream:
        head = stream.read_events(3)
    for text in ("b", "c", "d"):  # while nobody listens
        append(world.http, world.executor, run, instance, [("message.delta", {"text": text})])
    with world.stream(run, last_event_id=head[-1].id) as stream:
        middle = stream.read_events(3)
        append(world.http, world.executor, run, instance,
               [("message.delta", {"text": "e"}), ("run.completed", {})])
        tail = stream.read_to_end()
    assert event_frames_as_dicts(head + middle + tail) == world.stored_events(run)
    assert [f.json()["seq"] for f in head + middle + tail] == list(range(1, 9))


def test_idle_streams_get_keep_alive_comments(world):
    run, _ = _running_run(world)
    with world.stream(run, read_timeout=5) as stream:
        stream.read_events(2)
        started = time.monotonic()
        frame = stream.next_frame()
        waited = time.monotonic() - started
        assert frame is not None and not frame.is_event
        assert frame.comments == ["keep-alive"], frame  # before the 5 s read timeout
        print(f"first keep-alive after {waited:.2f}s (configured: 1 s)")
        second = stream.next_frame()
        assert second.comments == ["keep-alive"]


def test_keepalive_setting_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("AGENTLEDGER_SSE_KEEPALIVE_SECONDS", raising=False)
    assert Settings.from_env().sse_keepalive_seconds == 15.0
    monkeypatch.setenv("AGENTLEDGER_SSE_KEEPALIVE_SECONDS", "2.5")
    assert Settings.from_env().sse_keepalive_seconds == 2.5
    monkeypatch.setenv("AGENTLEDGER_SSE_KEEPALIVE_SECONDS", "0")
    with pytest.raises(SystemExit):
        Settings.from_env()


def test_streams_are_404_for_other_owners_and_401_without_credentials(world):
    run, _ = _running_run(world)
    with world.stream(run, token=world.bob) as stream:
        assert_error(_reply(stream.response), 404, "not_found")
    with world.stream(run, token="al_not-a-token") as stream:
        assert_error(_reply(stream.response), 401, "unauthenticated")
    with SSEStream(world.base, f"/api/agent-runs/{run}/events") as anonymous:
        assert_error(_reply(anonymous.response), 401, "unauthenticated")
    with world.stream(run, last_event_id="not-a-number") as stream:
        assert_error(_reply(stream.response), 400, "invalid_request")


def test_a_browser_streams_with_the_login_cookie_alone(world):
    run, instance = _running_run(world)
    with requests.Session() as browser:
        with browser.get(world.base + "/login", params={"token": world.alice},
                         allow_redirects=False, timeout=10) as login:
            assert login.status_code in (302, 303)
            assert "agentledger_session" in browser.cookies
        with SSEStream(world.base, f"/api/agent-runs/{run}/events", session=browser) as stream:
            assert stream.status == 200
            assert "Authorization" not in stream.response.request.headers
            stream.read_events(2)
            append(world.http, world.executor, run, instance, [("run.completed", {"content": "ok"})])
            assert [f.event for f in stream.read_to_end()] == ["run.completed"]


# ---- concurrency -------------------------------------------------------------------------------


def _parallel(count: int, work) -> list:
    barrier = threading.Barrier(count)
    results: list = [None] * count
    errors: list = []

    def run(i):
        try:
            barrier.wait(timeout=30)
            results[i] = work(i)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    return results


def _post_raw(world: World, chat: str, key: str, content: str):
    with requests.Session() as client:
        with client.post(f"{world.base}/api/sessions/{chat}/messages", json={"content": content},
                         headers={"Authorization": f"Bearer {world.alice}", "Idempotency-Key": key},
                         timeout=60) as reply:
            return reply.status_code, reply.headers.get("Idempotent-Replayed"), reply.json()


def _count(db: Database, model, *where) -> int:
    with db.read() as s:
        return s.execute(select(func.count()).select_from(model).where(*where)).scalar_one()


def test_32_concurrent_duplicate_posts_create_exactly_one_run(world):
    chat = open_session(world.http, world.alice)["id"]
    key = unique("dup")
    results = _parallel(32, lambda i: _post_raw(world, chat, key, "only once"))
    statuses = [status for status, _, _ in results]
    assert statuses == [202] * 32, statuses
    bodies = [body for _, _, body in results]
    assert all(body == bodies[0] for body in bodies)
    replayed = [flag for _, flag, _ in results]
    assert replayed.count("true") == 31 and replayed.count(None) == 1
    run_id = bodies[0]["run_id"]
    assert _count(world.db, AgentRun, AgentRun.session_id == chat) == 1
    assert _count(world.db, Message, Message.session_id == chat) == 1
    assert _count(world.db, RunEvent, RunEvent.run_id == run_id) == 1
    listed = world.http.request("GET", "/api/agent-runs", token=world.alice,
                                query={"session_id": chat}).json()["items"]
    assert [r["id"] for r in listed] == [run_id]


def test_concurrent_different_requests_under_one_key_create_one_run_and_conflict(world):
    chat = open_session(world.http, world.alice)["id"]
    key = unique("race")
    results = _parallel(16, lambda i: _post_raw(world, chat, key, f"version {i}"))
    statuses = sorted(status for status, _, _ in results)
    assert statuses == [202] + [409] * 15, statuses
    for status, _, body in results:
        if status == 409:
            assert body["error"]["code"] == "idempotency_conflict"
    assert _count(world.db, AgentRun, AgentRun.session_id == chat) == 1
    assert _count(world.db, Message, Message.session_id == chat) == 1


def _pg_transactions_held_idle(db: Database) -> int:
    """Connections sitting in an open transaction for more than half a second (a stream's own
    short read transaction is "idle in transaction" only for the moments between its queries)."""
    url = make_url(db.url)
    conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid() "
            "AND clock_timestamp() - state_change > interval '500 milliseconds'"
        ).fetchone()[0]


def test_many_open_streams_do_not_block_other_requests(world):
    """40 idle streams: more than either database's connection pool holds (SQLite 5+10,
    PostgreSQL 10+20 per engine), so a stream that kept a connection while waiting would starve
    the other requests."""
    chat = open_session(world.http, world.alice)["id"]
    runs = [post_message(world.http, world.alice, chat, f"m{i}")["run_id"] for i in range(40)]
    streams: list[SSEStream] = []
    try:
        for run in runs:
            stream = world.stream(run)
            streams.append(stream)
            assert stream.status == 200
            assert stream.next_frame().retry is not None
            assert stream.next_event().event == "run.queued"
        for _ in range(3):
            for method, path in (("GET", "/api/health"), ("GET", f"/api/agent-runs/{runs[0]}"),
                                 ("GET", f"/api/sessions/{chat}")):
                started = time.monotonic()
                reply = world.http.request(method, path, token=world.alice)
                elapsed = time.monotonic() - started
                # answered at all (a starved request would hang until the client's timeout)
                assert reply.status == 200, (path, reply)
                print(f"{path} with 40 open streams: {elapsed:.3f}s")
            if world.db.is_postgres:
                assert _pg_transactions_held_idle(world.db) == 0
            time.sleep(0.3)
        # an event still reaches its own stream among the 40
        assert world.http.request("POST", f"/api/agent-runs/{runs[-1]}/cancel",
                                  token=world.alice).json()["status"] == "cancelled"
        assert [f.event for f in streams[-1].read_to_end()] == ["run.cancelled"]
        # and every stream ends with its run
        for run in runs[:-1]:
            assert world.http.request("POST", f"/api/agent-runs/{run}/cancel",
                                      token=world.admin).status == 202
        for stream in streams[:-1]:
            assert [f.event for f in stream.read_to_end()] == ["run.cancelled"]
            assert stream.closed_by_server
    finally:
        for stream in streams:
            stream.close()
    assert wait_until(lambda: world.http.request("GET", "/api/health").status == 200)


def _reply(response):
    from support.api import Reply

    return Reply(response.status_code, response.headers, response.content)


# ---- request lines and headers beyond the limits: JSON, never gunicorn's HTML page -------------


def _raw(world: World, method: str, target: str, headers: dict[str, str]) -> tuple[int, dict, bytes]:
    """One request on its own connection (gunicorn closes it after refusing a request)."""
    with requests.request(method, world.base + target, headers=headers, timeout=30) as response:
        return response.status_code, dict(response.headers), response.content


def _assert_json_error(status: int, headers: dict, body: bytes, expected: int, code: str) -> None:
    assert status == expected, (status, body[:300])
    assert headers.get("Content-Type", "").startswith("application/json"), headers
    error = json.loads(body)["error"]
    assert error["code"] == code and error["message"], error


@pytest.mark.parametrize("length, status, code", [
    (5_000, 400, "invalid_request"),   # over gunicorn's default 4,094: the app's own validation
    (8_100, 414, "invalid_request"),   # over the app's MAX_URL_BYTES: the app's 414
    (20_000, 414, "invalid_request"),  # over gunicorn's limit: its refusal, in JSON
])
def test_an_over_long_url_is_answered_in_json(world, length, status, code):
    target = "/api/agent-runs?agent_id=" + "a" * length
    _assert_json_error(*_raw(world, "GET", target, {"Authorization": f"Bearer {world.admin}"}),
                       status, code)


@pytest.mark.parametrize("headers", [
    {"X-Big": "b" * 10_000},                    # over the app's field limit
    {"X-Big": "b" * 40_000},                    # over gunicorn's field limit
    {f"X-Many-{i}": "x" for i in range(150)},   # over the app's field count
    {f"X-Many-{i}": "x" for i in range(300)},   # over gunicorn's field count
], ids=["app-field-size", "server-field-size", "app-field-count", "server-field-count"])
def test_over_large_headers_are_answered_in_json(world, headers):
    _assert_json_error(*_raw(world, "GET", "/api/health", headers), 431, "invalid_request")


def test_requests_under_the_limits_are_served(world):
    status, _, body = _raw(world, "GET", "/api/agent-runs?cursor=" + "c" * 1_900,
                           {"Authorization": f"Bearer {world.admin}", "X-Fine": "f" * 4_000})
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_request"  # bad cursor
    assert _raw(world, "GET", "/api/health", {f"X-H-{i}": "x" for i in range(60)})[0] == 200


def test_a_keep_alive_connection_idle_for_seconds_still_serves_the_next_request(world):
    """A pooled connection reused after a pause is still open (gunicorn's default closed idle
    ones after 2 s, and a request sent as it closed was reset)."""
    import http.client

    from agentledger.server import KEEPALIVE_SECONDS

    assert KEEPALIVE_SECONDS > 3  # the pause below is within it
    port = int(world.base.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"Authorization": f"Bearer {world.alice}"}
        for pause in (0, 3):
            time.sleep(pause)
            connection.request("GET", "/api/sessions", headers=headers)
            reply = connection.getresponse()
            reply.read()
            assert reply.status == 200
        assert connection.sock is not None  # the same socket served both
    finally:
        connection.close()
