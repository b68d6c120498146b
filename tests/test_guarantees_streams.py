"""No gaps in streams (the guarantees table, docs/guarantees.md: "streams").

A real ``agentledger serve`` on each database. 50 runs × 200 events; each run's event stream is
read over a raw socket and cut at random byte offsets of the response body (often in the middle
of a frame), 10 times per run (500 reconnects); every reconnect sends the ``Last-Event-ID`` of
the last *complete* frame received. The reassembled events must equal the stored ones exactly:
no event skipped, none repeated. Runs 0-4 are still being written while they are read (the last
half of their events and the terminal event arrive during the cuts).

Then a real browser: headless Chromium logs in with a viewer token, and an ``EventSource`` on
``/api/agent-runs/<id>/events`` (cookie-authenticated, same origin) collects a live run; after the
terminal event the server closes, the browser reconnects, gets 204 and ends in ``CLOSED`` (2),
having seen every event exactly once.

``GUARANTEE_SEED`` replays the cut offsets; ``SOAK=1`` runs 200 runs × 20 cuts.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest
from support.api import ServerProcess, SSEParser, make_tokens
from support.factories import make_agent
from support.guarantees import event_batch, seed_runs, seeded_random, soak

from agentledger.api.stream import RETRY_MS
from agentledger.api.stream import frame as encode_frame
from agentledger.core.database import Database
from ingest.event_types import DATA_MODELS
from ingest.events import append_events
from queries.run_events import events_page

RUNS = soak(50, 200)
EVENTS = 200
CUTS = soak(10, 20)
LIVE = 5


@pytest.fixture(scope="module")
def served(module_db_url, tmp_path_factory):
    db = Database(module_db_url)
    make_agent(db, "echo")
    tokens = make_tokens(db, {"alice": ("alice", "user"), "viewer": ("auditor", "viewer")})
    server = ServerProcess(module_db_url, tmp_path_factory.mktemp("streams"))
    try:
        yield db, server, tokens
    finally:
        server.stop()
        db.dispose()
        assert "Traceback" not in server.log(), server.log()[-4000:]


def stored_events(db: Database, run_id: str) -> list[dict]:
    out: list[dict] = []
    with db.read() as s:
        while True:
            page = events_page(s, run_id, after_seq=len(out), limit=500)
            out.extend(page.events)
            if not page.events:
                return out


def read_until(port: int, path: str, token: str, last_id: int | None, cut: int | None,
               timeout: float = 20) -> tuple[int, bytes]:
    """GET the stream over a raw HTTP/1.0 socket; stop after ``cut`` body bytes (None: to the
    end). Returns (status, body bytes received)."""
    headers = [f"GET {path} HTTP/1.0", "Host: 127.0.0.1", "Accept: text/event-stream",
               f"Authorization: Bearer {token}"]
    if last_id is not None:
        headers.append(f"Last-Event-ID: {last_id}")
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        sock.sendall(("\r\n".join(headers) + "\r\n\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed before the headers: {data!r}"
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        while cut is None or len(body) < cut:
            chunk = sock.recv(min(65536, cut - len(body)) if cut is not None else 65536)
            if not chunk:
                break
            body += chunk
        return status, body if cut is None else body[:cut]
    finally:
        sock.close()


def reassemble(db: Database, server: ServerProcess, token: str, run_id: str, rng, cuts: int,
               stats: dict, live: bool) -> list[dict]:
    path = f"/api/agent-runs/{run_id}/events"
    events: list[dict] = []
    last_id: int | None = None
    sizes: list[int] | None = None
    for attempt in range(cuts + 1):
        final = attempt == cuts
        cut = None
        if not final:
            # within the bytes already stored (so every cut is a real disconnect, never the
            # server's own close): mostly in the next few frames, sometimes far into the stream
            if live or sizes is None:  # a finished run's stream is read from the db once
                sizes = [len(encode_frame(e).encode()) for e in stored_events(db, run_id)]
            stored = len(f"retry: {RETRY_MS}\n\n") + sum(sizes[len(events):])
            cut = rng.randint(1, max(1, min(stored - 1, 600 if rng.random() < 0.8 else stored)))
        status, body = read_until(server.port, path, token, last_id, cut)
        if status == 204:
            assert final or last_id is not None, "204 before any event"
            stats["204"] += 1
            break
        assert status == 200, (status, body[:200])
        parser = SSEParser()
        frames = [f for f in parser.feed(body) if f.is_event]
        if not final:
            stats["reconnects"] += 1
            stats["mid_frame"] += int(parser.pending)
        for frame in frames:
            event = frame.json()
            assert frame.id == str(event["seq"]) and frame.event == event["type"], frame
            events.append(event)
            last_id = event["seq"]
    return events


def test_reconnects_at_random_byte_offsets_reassemble_the_stored_stream(served):
    db, server, tokens = served
    rng = seeded_random(f"streams-{db.dialect}")
    started = time.monotonic()
    finished_runs = seed_runs(db, rng, runs=RUNS - LIVE, events_per_run=EVENTS)
    live_runs = seed_runs(db, rng, runs=LIVE, events_per_run=EVENTS // 2 + 2, finish=False)
    instance = None
    with db.read() as s:
        from agentledger.core.schema import AgentRun

        instance = s.get(AgentRun, live_runs[0]).executor_instance_id

    stop = threading.Event()
    errors: list[BaseException] = []

    def writer():
        try:
            wrng = seeded_random(f"streams-writer-{db.dialect}")
            remaining = {r: EVENTS - (EVENTS // 2 + 2) for r in live_runs}
            while remaining and not stop.is_set():
                run_id = wrng.choice(sorted(remaining))
                n = min(remaining[run_id], wrng.randint(1, 12))
                batch = event_batch(wrng, n)
                if n == remaining[run_id]:
                    batch[-1] = ("run.completed", {})
                with db.write() as s:
                    append_events(s, run_id, batch, executor_instance_id=instance)
                remaining[run_id] -= n
                if not remaining[run_id]:
                    del remaining[run_id]
                time.sleep(wrng.uniform(0, 0.02))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    stats = {"reconnects": 0, "mid_frame": 0, "204": 0}
    ok = 0
    try:
        for run_id in live_runs + finished_runs:
            got = reassemble(db, server, tokens["alice"], run_id, rng, CUTS, stats,
                              live=run_id in live_runs)
            if run_id in live_runs:
                # a live run may still be growing when its last read started: finish it
                while got[-1]["type"] != "run.completed":
                    status, body = read_until(server.port, f"/api/agent-runs/{run_id}/events",
                                              tokens["alice"], got[-1]["seq"], None)
                    assert status == 200
                    got += [f.json() for f in SSEParser().feed(body) if f.is_event]
            expected = stored_events(db, run_id)
            assert len(expected) == EVENTS, (run_id, len(expected))
            assert got == expected, f"run {run_id}: reassembled != stored"
            ok += 1
    finally:
        stop.set()
        thread.join(30)
    assert not errors, errors
    elapsed = time.monotonic() - started
    print(f"[streams {db.dialect}] {ok}/{RUNS} runs reassembled == stored; "
          f"{stats['reconnects']} reconnects ({stats['mid_frame']} cut mid-frame); "
          f"{elapsed:.1f}s")
    assert ok == RUNS
    assert stats["reconnects"] == RUNS * CUTS
    assert stats["mid_frame"] >= stats["reconnects"] // 2


# ---- a real browser ---------------------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

COLLECT = """
const [url, types, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
const seen = [];
const states = [];
const source = new EventSource(url);
for (const type of types) {
  source.addEventListener(type, (e) => seen.push({id: e.lastEventId, data: e.data}));
}
source.onerror = () => states.push(source.readyState);
const deadline = Date.now() + 40000;
const timer = setInterval(() => {
  if (source.readyState === 2 || Date.now() > deadline) {
    clearInterval(timer);
    done({state: source.readyState, seen: seen, errors: states});
  }
}, 50);
"""


def browser():
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("needs Debian chromium and chromium-driver")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(60)
    return driver


def test_browser_event_source_reaches_closed_after_the_terminal_event(served):
    db, server, tokens = served
    rng = seeded_random(f"streams-browser-{db.dialect}")
    [run_id] = seed_runs(db, rng, runs=1, events_per_run=50, finish=False)
    from agentledger.core.schema import AgentRun

    with db.read() as s:
        instance = s.get(AgentRun, run_id).executor_instance_id
    driver = browser()
    try:
        driver.get(f"{server.base_url}/login?token={tokens['viewer']}")
        driver.get(f"{server.base_url}/api/health")  # a light same-origin page
        rest = event_batch(rng, 149) + [("run.completed", {})]

        def finish_later():
            time.sleep(1.0)
            for start in range(0, len(rest), 25):
                with db.write() as s:
                    append_events(s, run_id, rest[start:start + 25],
                                  executor_instance_id=instance)
                time.sleep(0.05)

        writer = threading.Thread(target=finish_later, daemon=True)
        writer.start()
        types = sorted(DATA_MODELS)  # every event type there is: a listener for each
        result = driver.execute_async_script(COLLECT, f"/api/agent-runs/{run_id}/events", types)
        writer.join(30)
    finally:
        driver.quit()
    expected = stored_events(db, run_id)
    assert len(expected) == 200
    got = [json.loads(item["data"]) for item in result["seen"]]
    assert [item["id"] for item in result["seen"]] == [str(e["seq"]) for e in got]
    assert result["state"] == 2, result["state"]  # EventSource.CLOSED
    assert got == expected  # every event exactly once, in order
    print(f"[streams browser {db.dialect}] EventSource CLOSED after {len(got)} events, "
          f"error/readyState transitions {result['errors']}")
