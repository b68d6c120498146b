"""``agentledger.client`` against a real ``agentledger serve`` process, on SQLite and PostgreSQL.

Runs are executed by ``ExecutorClient.run_forever`` in a thread of the test (over HTTP, like a
worker on another host), except where a test drives the executor routes by hand. Faults come
from ``FaultProxy``, a TCP proxy between the client and the server that swallows an answer, cuts
a stream after some bytes or answers 503/429 itself.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest
from support.api import STANDARD_TOKENS, ServerProcess, make_tokens, unique, wait_until
from support.factories import make_agent
from support.fault_proxy import FaultProxy, canned

from agentledger.client import ApiError, ConnectionFailed, ExecutorClient, LedgerClient, RetryPolicy
from agentledger.core.config import Settings
from agentledger.core.database import Database

TERMINAL = ("run.completed", "run.failed", "run.cancelled", "run.interrupted")
FAST_RETRY = RetryPolicy(attempts=5, backoff=0.05, max_backoff=0.2)


@pytest.fixture(scope="module")
def server(module_db_url, tmp_path_factory):
    db = Database(module_db_url)
    tokens = make_tokens(db, STANDARD_TOKENS)
    make_agent(db, "echo", name="Echo")
    make_agent(db, "chatty", name="Chatty", kind="scripted", params={"steps": [
        step for i in range(12) for step in ({"say": f"part {i} of the answer; "}, {"sleep": 0.05})
    ]})
    make_agent(db, "sleeper", name="Sleeper", kind="scripted",
               params={"steps": [{"say": "thinking "}, {"sleep": 60}, {"say": "done"}]})
    make_agent(db, "boss", name="Boss", kind="scripted", params={"steps": [
        {"say": "asking "}, {"delegate": [{"agent_id": "echo", "input": "one"},
                                          {"agent_id": "echo", "input": "two"}]},
        {"say": "done"}]})
    proc = ServerProcess(module_db_url, tmp_path_factory.mktemp("client-server"))
    yield {"url": proc.base_url, "port": proc.port, "tokens": tokens, "db": db, "proc": proc}
    proc.stop()
    db.dispose()


@pytest.fixture
def alice(server):
    with LedgerClient(server["url"], server["tokens"]["alice"], retry=FAST_RETRY) as client:
        yield client


@contextmanager
def executing(server, *, concurrency: int = 4):
    """``ExecutorClient.run_forever`` in a thread, stopped (and its runs interrupted) at exit."""
    client = ExecutorClient(server["url"], server["tokens"]["executor"], unique("client-exec"))
    stop = threading.Event()
    settings = Settings(lease_seconds=10, heartbeat_seconds=1)
    ended: list[list[str]] = []
    thread = threading.Thread(target=lambda: ended.append(
        client.run_forever(concurrency, settings=settings, stop=stop)), daemon=True)
    thread.start()
    try:
        yield client
    finally:
        stop.set()
        thread.join(30)
        client.close()
        assert not thread.is_alive()


def assert_gapless_to_terminal(events: list[dict]) -> None:
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), events
    assert events[0]["type"] == "run.queued"
    assert [e["type"] in TERMINAL for e in events].count(True) == 1
    assert events[-1]["type"] in TERMINAL


def test_a_conversation_through_the_client(server, alice):
    session = alice.create_session("echo", title="client test")
    assert session["agent_id"] == "echo" and session["title"] == "client test"
    assert session["id"].startswith("sess_")
    with executing(server):
        posted = alice.send_message(session["id"], "hello from the client")
        assert set(posted) >= {"message_id", "run_id", "events_url", "agent_id", "agent_name"}
        run = alice.wait(posted["run_id"], timeout=60)
    assert run["status"] == "succeeded" and run["id"] == posted["run_id"]
    assert alice.get_run(posted["run_id"]) == run

    events = list(alice.stream_events(posted["run_id"]))
    assert_gapless_to_terminal(events)
    assert events[-1]["type"] == "run.completed"
    assert [e["data"]["text"] for e in events if e["type"] == "message.delta"] == [
        "hello from the client"]
    assert list(alice.stream_events(posted["run_id"], after_seq=3)) == events[3:]
    # starting at the terminal event: 204, an empty iterator
    assert list(alice.stream_events(posted["run_id"], after_seq=events[-1]["seq"])) == []

    tree = alice.tree(posted["run_id"])
    assert tree["root_run_id"] == posted["run_id"] and len(tree["nodes"]) == 1
    prov = alice.provenance(run["final_message_id"])
    assert prov["agent"]["id"] == "echo" and prov["run"]["id"] == posted["run_id"]
    assert prov["message"]["content"] == "hello from the client"


def test_wait_times_out_cancel_and_delegation(server, alice):
    session = alice.create_session("sleeper")
    with executing(server, concurrency=1):
        posted = alice.send_message(session["id"], "take your time")
        with pytest.raises(TimeoutError):
            alice.wait(posted["run_id"], timeout=0.5)
        wait_until(lambda: alice.get_run(posted["run_id"])["status"] == "running", timeout=30)
        assert alice.cancel(posted["run_id"]) == {"run_id": posted["run_id"],
                                                  "status": "cancelling"}
        # Harmless again: the same answer while the executor has not yet stopped the run, or
        # 409 run_terminal once it has (it notices a cancel within a second: a race by design).
        try:
            again = alice.cancel(posted["run_id"])
        except ApiError as exc:
            assert (exc.status, exc.code) == (409, "run_terminal"), exc
        else:
            assert again == {"run_id": posted["run_id"], "status": "cancelling"}
        assert alice.wait(posted["run_id"], timeout=30)["status"] == "cancelled"

        boss = alice.send_message(session["id"], "delegate", agent_id="boss")
        assert alice.wait(boss["run_id"], timeout=60)["status"] == "succeeded"
    with pytest.raises(ApiError) as refused:
        alice.cancel(posted["run_id"])
    assert (refused.value.status, refused.value.code) == (409, "run_terminal")
    nodes = alice.tree(boss["run_id"])["nodes"]
    assert [n["status"] for n in nodes] == ["succeeded"] * 3
    types = [e["type"] for e in alice.stream_events(boss["run_id"])]
    assert types.count("run.child_created") == 2 and types.count("run.child_finished") == 2


def test_errors_raise_api_error_with_status_code_and_message(server, alice):
    def refused(call) -> ApiError:
        with pytest.raises(ApiError) as caught:
            call()
        assert isinstance(caught.value.message, str) and caught.value.message
        return caught.value

    error = refused(lambda: alice.get_run("run_01nonexistent0000000000"))
    assert (error.status, error.code) == (404, "not_found")
    assert (refused(lambda: alice.create_session("no-such-agent")).code) == "unknown_agent"
    session = alice.create_session("echo")
    key = unique("same-key")
    alice.send_message(session["id"], "first", idempotency_key=key)
    error = refused(lambda: alice.send_message(session["id"], "different", idempotency_key=key))
    assert (error.status, error.code) == (409, "idempotency_conflict")
    error = refused(lambda: alice.send_message(session["id"], ""))
    assert (error.status, error.code) == (422, "validation_error")

    with LedgerClient(server["url"], "not-a-token") as stranger:
        error = refused(lambda: stranger.get_run("run_01nonexistent0000000000"))
        assert (error.status, error.code) == (401, "unauthenticated")
    with ExecutorClient(server["url"], server["tokens"]["alice"], "not-an-executor") as wrong:
        error = refused(lambda: wrong.claim())
        assert (error.status, error.code) == (403, "forbidden")
    with LedgerClient("http://127.0.0.1:9", "t", retry=RetryPolicy(attempts=2, backoff=0.01)) as gone:
        error = refused(lambda: gone.get_run("run_x"))
        assert isinstance(error, ConnectionFailed)
        assert (error.status, error.code) == (None, "connection_failed")


def _runs_of(server, session_id: str) -> list[dict]:
    with LedgerClient(server["url"], server["tokens"]["admin"]) as admin:
        return admin._json("GET", "/api/agent-runs", params={"session_id": session_id})["items"]


def test_a_send_retried_after_a_lost_answer_creates_exactly_one_run(server, alice):
    session = alice.create_session("echo")
    with FaultProxy(server["port"], {1: ("drop_answer",)}) as proxy, \
            LedgerClient(proxy.base_url, server["tokens"]["alice"], retry=FAST_RETRY) as flaky:
        posted = flaky.send_message(session["id"], "only once, please")
        assert proxy.faulted == [1] and proxy.connections == 2
    runs = _runs_of(server, session["id"])
    assert [r["id"] for r in runs] == [posted["run_id"]]
    again = alice.send_message(session["id"], "only once, please", idempotency_key=unique("k"))
    assert again["run_id"] != posted["run_id"]  # a new key is a new run


def test_a_send_is_retried_after_a_503_and_a_429_with_retry_after(server, alice):
    session = alice.create_session("echo")
    faults = {1: ("canned", canned(503, "Service Unavailable")),
              2: ("canned", canned(429, "Too Many Requests", headers={"Retry-After": "0"}))}
    with FaultProxy(server["port"], faults) as proxy, \
            LedgerClient(proxy.base_url, server["tokens"]["alice"], retry=FAST_RETRY) as flaky:
        posted = flaky.send_message(session["id"], "third time lucky")
        assert proxy.faulted == [1, 2] and proxy.connections == 3
        # creating a session carries no key: a 503 (which may have been applied) is not retried
        proxy.faults[proxy.connections + 1] = ("canned", canned(503, "Service Unavailable"))
        before = proxy.connections
        with LedgerClient(proxy.base_url, server["tokens"]["alice"], retry=FAST_RETRY) as once:
            with pytest.raises(ApiError) as caught:
                once.create_session("echo")
        assert (caught.value.status, caught.value.code) == (503, "unavailable")
        assert proxy.connections == before + 1
    assert [r["id"] for r in _runs_of(server, session["id"])] == [posted["run_id"]]


def test_a_successful_answer_that_is_no_json_raises_api_error(server, alice):
    """A captive portal or a proxy's page can answer 200: the client raised a bare
    ``JSONDecodeError`` (and ``KeyError`` for a stream frame without an event) where the
    contract promises ``ApiError``."""
    session = alice.create_session("echo")
    run_id = alice.send_message(session["id"], "hello")["run_id"]
    portal = canned(200, "OK", body=b"<html>Sign in to the hotel wifi</html>",
                    content_type="text/html")
    frame = canned(200, "OK", body=b"id: 1\nevent: run.queued\ndata: <b>rewritten</b>\n\n",
                   content_type="text/event-stream")
    with FaultProxy(server["port"], {1: ("canned", portal), 2: ("canned", portal),
                                     3: ("canned", frame)}) as proxy, \
            LedgerClient(proxy.base_url, server["tokens"]["alice"], retry=FAST_RETRY) as client, \
            ExecutorClient(proxy.base_url, server["tokens"]["executor"], "portal-exec",
                           retry=FAST_RETRY) as executor:
        for call, shown in ((lambda: client.get_run(run_id), "Sign in to the hotel wifi"),
                            (lambda: executor.claim(), "Sign in to the hotel wifi"),
                            (lambda: list(client.stream_events(run_id)), "<b>rewritten</b>")):
            with pytest.raises(ApiError) as caught:
                call()
            assert (caught.value.status, caught.value.code) == (200, "unexpected_response")
            assert shown in caught.value.message
        assert proxy.faulted == [1, 2, 3]


def test_a_read_after_a_503_waits_the_retry_after_it_names(server, alice):
    """``database_unavailable`` answers 503 with ``Retry-After: 1``: a safe request comes back
    after that second, not after the policy's first, shorter backoff."""
    session = alice.create_session("echo")
    run_id = alice.send_message(session["id"], "hello")["run_id"]
    faults = {1: ("canned", canned(503, "Service Unavailable", headers={"Retry-After": "1"}))}
    with FaultProxy(server["port"], faults) as proxy, \
            LedgerClient(proxy.base_url, server["tokens"]["alice"], retry=FAST_RETRY) as flaky:
        started = time.monotonic()
        assert flaky.get_run(run_id)["id"] == run_id
        assert time.monotonic() - started >= 0.95
        assert proxy.faulted == [1] and proxy.connections == 2


def test_stream_events_resumes_across_cut_connections(server, alice):
    session = alice.create_session("chatty")
    cuts = {n: ("cut", 700) for n in (1, 2, 3, 4)}
    with executing(server), FaultProxy(server["port"], cuts) as proxy, \
            LedgerClient(proxy.base_url, server["tokens"]["alice"], retry=FAST_RETRY) as flaky:
        posted = alice.send_message(session["id"], "tell me a long story")
        streamed = list(flaky.stream_events(posted["run_id"]))
        assert proxy.faulted == [1, 2, 3, 4] and proxy.connections >= 5
    assert_gapless_to_terminal(streamed)
    stored = alice.events(posted["run_id"], limit=500)["events"]
    assert streamed == stored
    assert sum(e["type"] == "message.delta" for e in streamed) == 12


def test_executor_client_drives_the_executor_routes(server, alice):
    session = alice.create_session("echo")
    posted = alice.send_message(session["id"], "by hand")
    run_id = posted["run_id"]
    with ExecutorClient(server["url"], server["tokens"]["executor"], unique("hand")) as ex:
        claimed = []
        wait_until(lambda: claimed.extend(ex.claim(max_runs=100)) or
                   any(r["run_id"] == run_id for r in claimed), timeout=10)
        mine = next(r for r in claimed if r["run_id"] == run_id)
        assert mine["input"] == "by hand" and mine["agent_execution_snapshot"]["kind"] == "echo"
        for other in claimed:
            if other["run_id"] != run_id:
                ex.append(other["run_id"], [("run.completed", {})])
        beat = ex.heartbeat(run_id)
        assert beat["cancel_requested"] is False and beat["lease_expires_at"]
        assert ex.append(run_id, [{"type": "message.delta", "data": {"text": "by "}}])["seqs"] == [3]
        child = ex.create_child(run_id, "echo", "a sub-question")
        assert child["events_url"] == f"/api/agent-runs/{child['run_id']}/events"
        # an executor follows its child: the run and its events, of another owner's tree
        assert ex.get_run(child["run_id"])["parent_run_id"] == run_id
        assert ex.events(child["run_id"])["events"][0]["type"] == "run.queued"
        wait_until(lambda: any(r["run_id"] == child["run_id"] for r in ex.claim(max_runs=10)),
                   timeout=10)
        ex.append(child["run_id"], [("message.delta", {"text": "sub"}), ("run.completed", {})])
        done = ex.append(run_id, [("message.delta", {"text": "hand"}), ("run.completed", {})])
        assert done["cancel_requested"] is False and len(done["seqs"]) == 2
        with pytest.raises(ApiError) as lost:
            ex.heartbeat(run_id)
        assert (lost.value.status, lost.value.code) == (409, "lease_lost")
        with pytest.raises(ApiError) as forbidden:  # it reads nothing else
            ex._http.request("GET", f"/api/agent-runs/{run_id}/tree")
        assert forbidden.value.code == "forbidden"
    run = alice.wait(run_id, timeout=10)
    assert run["status"] == "succeeded"
    assert alice.provenance(run["final_message_id"])["message"]["content"] == "by hand"


def test_run_forever_under_the_name_of_recorded_runs_stops_at_the_first_claim(server, alice):
    # A claim's terms are the worker's own: refused once, refused forever. It stops and says
    # why instead of asking again every second.
    session = alice.create_session("echo")
    run_id = alice.send_message(session["id"], "who takes this?")["run_id"]
    with ExecutorClient(server["url"], server["tokens"]["executor"], "otlp:checkout") as ex:
        started = time.monotonic()
        with pytest.raises(ApiError) as refused:
            ex.run_forever(1, settings=Settings(lease_seconds=10, heartbeat_seconds=1),
                           stop=threading.Event())
    assert (refused.value.status, refused.value.code) == (422, "validation_error")
    assert "must not start with 'otlp:'" in refused.value.message
    assert time.monotonic() - started < 10
    assert alice.get_run(run_id)["executor_instance_id"] != "otlp:checkout"


def test_an_append_or_child_whose_answer_was_lost_is_sent_again_and_written_once(server, alice):
    """Appends and children carry an ``Idempotency-Key``: the server took the first send of
    each (the proxy swallowed its answer), and the retry is answered with what it wrote."""
    session = alice.create_session("echo")
    run_id = alice.send_message(session["id"], "lost answers")["run_id"]
    instance = unique("lost")
    token = server["tokens"]["executor"]
    with ExecutorClient(server["url"], token, instance) as ex:
        claimed: list[dict] = []
        wait_until(lambda: claimed.extend(ex.claim(max_runs=100)) or
                   any(r["run_id"] == run_id for r in claimed), timeout=10)
        for other in claimed:
            if other["run_id"] != run_id:
                ex.append(other["run_id"], [("run.completed", {})])
    answers = []
    lost = {1: ("drop_answer",), 3: ("drop_answer",), 5: ("drop_answer",)}
    with FaultProxy(server["port"], lost) as proxy:
        # a client each, so that each request opens a connection of its own
        with ExecutorClient(proxy.base_url, token, instance, retry=FAST_RETRY) as flaky:
            answers.append(flaky.append(run_id, [("message.delta", {"text": "once "})]))
        with ExecutorClient(proxy.base_url, token, instance, retry=FAST_RETRY) as flaky:
            child = flaky.create_child(run_id, "echo", "a sub-question")
        with ExecutorClient(proxy.base_url, token, instance, retry=FAST_RETRY) as flaky:
            answers.append(flaky.append(run_id, [("message.delta", {"text": "only"}),
                                                 ("run.completed", {})]))
        assert proxy.faulted == [1, 3, 5] and proxy.connections == 6
    assert [a["seqs"] for a in answers] == [[3], [5, 6]]
    events = alice.events(run_id, limit=500)["events"]
    assert [e["type"] for e in events] == ["run.queued", "run.started", "message.delta",
                                           "run.child_created", "message.delta",
                                           "run.completed"]
    assert events[3]["data"]["child_run_id"] == child["run_id"]
    assert [n["run_id"] for n in alice.tree(run_id)["nodes"]] == [run_id, child["run_id"]]
    alice.cancel(child["run_id"])
    run = alice.get_run(run_id)
    assert run["status"] == "succeeded"
    assert alice.provenance(run["final_message_id"])["message"]["content"] == "once only"


# Ids that would name another route, or none, if they went into a path as they are.
HOSTILE_IDS = ("run/../../sessions", "x/tree", "..", ".", "%2E%2E", "x?limit=1", "x#frag",
               "x%2Ftree", "", "sp ace", "é")


def test_an_id_is_one_path_segment_and_never_reaches_another_route(server, alice):
    session = alice.create_session("echo")
    posted = alice.send_message(session["id"], "mine")
    run_id = posted["run_id"]
    ids = (*HOSTILE_IDS, f"{run_id}/tree", f"{run_id}/events", f"{run_id}?x=1", f"{run_id}#x",
           f"../{run_id}", f"{session['id']}/messages")
    calls = {
        "get_run": alice.get_run, "cancel": alice.cancel, "tree": alice.tree,
        "events": alice.events, "provenance": alice.provenance,
        "stream_events": lambda i: list(alice.stream_events(i)),
        "wait": lambda i: alice.wait(i, timeout=10),
        "send_message": lambda i: alice.send_message(i, "never posted"),
    }
    with ExecutorClient(server["url"], server["tokens"]["executor"], unique("ids")) as ex:
        calls |= {
            "executor.heartbeat": ex.heartbeat,
            "executor.append": lambda i: ex.append(i, [("message.delta", {"text": "x"})]),
            "executor.create_child": lambda i: ex.create_child(i, "echo", "x"),
            "executor.memory": lambda i: ex.memory(i, "checkpoints/get", {}),
            "executor.get_run": ex.get_run, "executor.events": ex.events,
        }
        for bad in ids:
            for name, call in calls.items():
                with pytest.raises(ApiError) as caught:
                    call(bad)
                error = caught.value
                assert (error.status, error.code) == (404, "not_found"), (name, bad, error)
                # the whole id, as one segment: never a run, tree or list of another route
                assert bad in error.message, (name, bad, error.message)
    # nothing was posted to the session, and the run is untouched
    assert [r["id"] for r in _runs_of(server, session["id"])] == [run_id]
    assert alice.get_run(run_id)["status"] == "queued"
    alice.cancel(run_id)


def test_a_key_the_server_would_refuse_raises_value_error_before_sending(server, alice):
    session = alice.create_session("echo")
    for bad in ("", "x" * 256, "é" * 256, " lead", "trail ", "tab\tx", "new\nline", "nul\x00",
                "nel\x85"):
        with pytest.raises(ValueError, match="printable characters"):
            alice.send_message(session["id"], "refused", idempotency_key=bad)
    assert _runs_of(server, session["id"]) == []
    # the edges of what the server accepts (beyond ASCII: sent as UTF-8)
    for good in ("k", "x" * 255, "a b", "~!@#$%^&*()[]{}<>?/\\|'\"`", "clé-€", "é" * 255):
        alice.send_message(session["id"], "accepted", idempotency_key=good)
    assert len(_runs_of(server, session["id"])) == 6
    run = alice.send_message(session["id"], "accepted", idempotency_key="clé-€")["run_id"]
    runs = _runs_of(server, session["id"])
    assert len(runs) == 6 and run in [r["id"] for r in runs]  # the same key: the same run


def test_a_failed_send_names_its_key_so_that_a_retry_creates_no_second_run(server, alice):
    session = alice.create_session("echo")
    # every answer is lost: the message is recorded, the client never learns it
    lost = {n: ("drop_answer",) for n in range(1, 10)}
    with FaultProxy(server["port"], lost) as proxy, \
            LedgerClient(proxy.base_url, server["tokens"]["alice"],
                         retry=RetryPolicy(attempts=2, backoff=0.01)) as flaky:
        with pytest.raises(ConnectionFailed) as caught:
            flaky.send_message(session["id"], "did it arrive?")
        assert proxy.faulted == [1, 2]
    key = caught.value.idempotency_key
    assert key and key.startswith("alc-")
    again = alice.send_message(session["id"], "did it arrive?", idempotency_key=key)
    assert [r["id"] for r in _runs_of(server, session["id"])] == [again["run_id"]]
    # an answered error names the key too (here the caller's own)
    with pytest.raises(ApiError) as conflict:
        alice.send_message(session["id"], "something else", idempotency_key=key)
    assert (conflict.value.code, conflict.value.idempotency_key) == ("idempotency_conflict", key)
    alice.cancel(again["run_id"])
