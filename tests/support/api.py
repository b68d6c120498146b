"""Shared pieces of the HTTP API tests (``test_api_*.py``).

One small HTTP interface with two implementations, so the same helpers drive the Flask test
client (layer A) and a real ``agentledger serve`` process through ``requests`` (layer B):

- ``FlaskHttp`` / ``RequestsHttp``: ``request(method, path, token=…, json=…) -> Reply``;
- actor helpers that go through the routes only: ``open_session``, ``send``, ``claim_run``,
  ``append``, ``complete_run``, ``answer``;
- ``assert_error``: the exact error envelope of CONTRACT §5;
- ``ledger_state``: row counts and a run's head, to prove a refused request wrote nothing;
- ``SSEParser`` / ``SSEStream``: a real Server-Sent-Events parser over the raw byte stream;
- ``ServerProcess``: ``agentledger serve --no-worker`` on a free port (``support.processes``);
- ``wait_until`` / ``free_port``: re-exported from ``support.waiting`` / ``support.ports``.
"""

from __future__ import annotations

import itertools
import json as jsonlib
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from sqlalchemy import func, select

from agentledger.core.database import Database
from agentledger.core.schema import (
    AgentRun,
    ChatSession,
    ContextBlob,
    ConversationThread,
    Message,
    RunEvent,
)
from ingest.tokens import create_token
from support.ports import free_port as free_port  # re-exported for the API tests
from support.processes import ProcessManager
from support.waiting import wait_until as wait_until  # re-exported for the API tests

_UNSET: Any = object()
_counter = itertools.count(1)

TERMINAL_STATUSES = ("succeeded", "failed", "cancelled", "interrupted")
RUN_FIELDS = {
    "id", "session_id", "thread_id", "root_run_id", "parent_run_id", "owner_id", "agent_id",
    "agent_name", "agent_version", "status", "agent_execution_snapshot", "context_pack_snapshot",
    "last_event_seq", "executor_instance_id", "lease_expires_at", "final_message_id", "error",
    "created_at", "started_at", "finished_at", "events_url",
}
MESSAGE_FIELDS = {"id", "role", "content", "created_at", "run_id", "agent_id", "agent_name",
                  "agent_version"}
POSTED_FIELDS = {"message_id", "run_id", "events_url", "agent_id", "agent_name"}
SNAKE_CASE = re.compile(r"^[a-z][a-z0-9_]*$")


def unique(prefix: str = "k") -> str:
    """A value no other test of this process uses (idempotency keys, instance ids, titles)."""
    return f"{prefix}-{os.getpid()}-{next(_counter)}-{time.monotonic_ns()}"


# ---- HTTP --------------------------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return jsonlib.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def __repr__(self) -> str:  # readable assertion messages
        return f"<Reply {self.status} {self.body[:300]!r}>"


def _headers(token: str | None, headers: Mapping[str, str] | None) -> dict[str, str]:
    out = dict(headers or {})
    if token is not None:
        out.setdefault("Authorization", f"Bearer {token}")
    return out


class FlaskHttp:
    """Requests through a Flask test client."""

    def __init__(self, client):
        self.client = client

    def request(self, method: str, path: str, *, token: str | None = None, json: Any = _UNSET,
                data: bytes | str | None = None, headers: Mapping[str, str] | None = None,
                query: Mapping[str, Any] | None = None) -> Reply:
        kwargs: dict[str, Any] = {"method": method, "headers": _headers(token, headers)}
        if json is not _UNSET:
            kwargs["json"] = json
        if data is not None:
            kwargs["data"] = data
            kwargs["headers"].setdefault("Content-Type", "application/json")
        if query is not None:
            kwargs["query_string"] = dict(query)
        response = self.client.open(path, **kwargs)
        try:
            return Reply(response.status_code, response.headers, response.get_data())
        finally:
            response.close()


class RequestsHttp:
    """Requests to a real server with ``requests`` (one pooled session, closed by ``close``)."""

    def __init__(self, base_url: str, *, timeout: float = 30):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()

    def request(self, method: str, path: str, *, token: str | None = None, json: Any = _UNSET,
                data: bytes | str | None = None, headers: Mapping[str, str] | None = None,
                query: Mapping[str, Any] | None = None) -> Reply:
        kwargs: dict[str, Any] = {"headers": _headers(token, headers), "timeout": self.timeout}
        if json is not _UNSET:
            kwargs["json"] = json
        if data is not None:
            kwargs["data"] = data
            kwargs["headers"].setdefault("Content-Type", "application/json")
        if query is not None:
            kwargs["params"] = dict(query)
        with self.session.request(method, self.base_url + path, **kwargs) as response:
            return Reply(response.status_code, response.headers, response.content)

    def close(self) -> None:
        self.session.close()


# ---- assertions --------------------------------------------------------------------------------


def assert_error(reply: Reply, status: int, code: str) -> dict:
    """The response is exactly ``{"error": {"code": code, "message": <sentence>}}``."""
    assert reply.status == status, reply
    assert reply.headers.get("Content-Type", "").startswith("application/json"), reply.headers
    body = reply.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message"}, body
    assert body["error"]["code"] == code, body
    message = body["error"]["message"]
    assert isinstance(message, str) and message.strip(), body
    assert "Traceback" not in message and "<html" not in message.lower(), body
    return body["error"]


def assert_envelope(reply: Reply) -> dict:
    """Any error status: the envelope, with some snake_case code."""
    body = reply.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert SNAKE_CASE.match(body["error"]["code"]), body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"], body
    return body["error"]


def assert_iso_utc(value: str) -> None:
    from datetime import datetime

    moment = datetime.fromisoformat(value)
    assert moment.tzinfo is not None and moment.utcoffset() is not None, value


# ---- database observations ---------------------------------------------------------------------

COUNTED = {
    "agent_run": AgentRun, "message": Message, "run_event": RunEvent, "chat_session": ChatSession,
    "conversation_thread": ConversationThread, "context_blob": ContextBlob,
}


def row_counts(db: Database) -> dict[str, int]:
    with db.read() as s:
        return {
            name: s.execute(select(func.count()).select_from(model)).scalar_one()
            for name, model in COUNTED.items()
        }


def run_head(db: Database, run_id: str) -> tuple[str, int, str | None, str | None]:
    """(status, last_event_seq, executor_instance_id, lease_expires_at) straight from the row."""
    with db.read() as s:
        row = s.execute(
            select(AgentRun.status, AgentRun.last_event_seq, AgentRun.executor_instance_id,
                   AgentRun.lease_expires_at).where(AgentRun.id == run_id)
        ).one()
    return row.status, row.last_event_seq, row.executor_instance_id, (
        row.lease_expires_at.isoformat() if row.lease_expires_at else None
    )


def ledger_state(db: Database, run_id: str | None = None) -> tuple:
    """Everything a refused request must leave untouched."""
    return (row_counts(db), run_head(db, run_id) if run_id else None)


def make_tokens(db: Database, specs: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """``{"alice": ("alice", "user"), …}`` → ``{"alice": "<token>", …}``, in one transaction."""
    out = {}
    with db.write() as s:
        for name, (owner, role) in specs.items():
            _, out[name] = create_token(s, owner_id=owner, role=role)
    return out


STANDARD_TOKENS = {
    "admin": ("root", "admin"),
    "alice": ("alice", "user"),
    "bob": ("bob", "user"),
    "viewer": ("auditor", "viewer"),
    "executor": ("exec-svc", "executor"),
}


# ---- actors (through the routes only) ----------------------------------------------------------


def create_agent(http, admin: str, agent_id: str, *, name: str | None = None, kind: str = "echo",
                 **extra) -> dict:
    reply = http.request("POST", "/api/agents", token=admin,
                         json={"id": agent_id, "name": name or agent_id.title(), "kind": kind,
                               **extra})
    assert reply.status == 201, reply
    return reply.json()


def open_session(http, token: str, agent_id: str = "echo", title: str | None = None) -> dict:
    body: dict[str, Any] = {"agent_id": agent_id}
    if title is not None:
        body["title"] = title
    reply = http.request("POST", "/api/sessions", token=token, json=body)
    assert reply.status == 201, reply
    return reply.json()


def send(http, token: str, session_id: str, content: str = "hello", *, key: str | None = None,
         agent_id: str | None = None, context: list | None = None, expect: int | None = 202) -> Reply:
    body: dict[str, Any] = {"content": content}
    if agent_id is not None:
        body["agent_id"] = agent_id
    if context is not None:
        body["context"] = context
    reply = http.request("POST", f"/api/sessions/{session_id}/messages", token=token, json=body,
                         headers={"Idempotency-Key": key or unique("key")})
    if expect is not None:
        assert reply.status == expect, reply
    return reply


def post_message(http, token: str, session_id: str, content: str = "hello", **kw) -> dict:
    return send(http, token, session_id, content, **kw).json()


def claim_run(http, executor: str, run_id: str, instance: str, *, lease_seconds: float | None = None) -> dict:
    """Claim queued runs until ``run_id`` is among them; returns its claim entry."""
    body: dict[str, Any] = {"executor_instance_id": instance, "max_runs": 100}
    if lease_seconds is not None:
        body["lease_seconds"] = lease_seconds
    reply = http.request("POST", "/api/executor/claim", token=executor, json=body)
    assert reply.status == 200, reply
    runs = {r["run_id"]: r for r in reply.json()["runs"]}
    assert run_id in runs, f"{run_id} was not claimable; claimed {sorted(runs)}"
    return runs[run_id]


def append(http, executor: str, run_id: str, instance: str, events: list[tuple[str, dict]]) -> Reply:
    return http.request(
        "POST", f"/api/executor/runs/{run_id}/events", token=executor,
        json={"executor_instance_id": instance,
              "events": [{"type": t, "data": d} for t, d in events]},
    )


def complete_run(http, executor: str, run_id: str, *, texts=("the answer",),
                 instance: str | None = None, claim: bool = True) -> dict:
    """Claim (unless ``claim=False``: already held by ``instance``), stream deltas, complete.

    Returns the events route's 200 body (``seqs``, ``cancel_requested``).
    """
    instance = instance or unique("exec")
    if claim:
        claim_run(http, executor, run_id, instance)
    events = [("message.delta", {"text": t}) for t in texts] + [("run.completed", {})]
    reply = append(http, executor, run_id, instance, events)
    assert reply.status == 200, reply
    return reply.json()


def answer(http, user: str, executor: str, session_id: str, content: str = "question", *,
           agent_id: str | None = None, texts=("the answer",)) -> tuple[dict, str]:
    """Post a message and let an executor answer it; returns (202 body, assistant message id)."""
    posted = post_message(http, user, session_id, content, agent_id=agent_id)
    instance = unique("exec")
    claim_run(http, executor, posted["run_id"], instance)
    reply = append(http, executor, posted["run_id"], instance,
                   [("message.delta", {"text": t}) for t in texts] + [("run.completed", {})])
    assert reply.status == 200, reply
    final = http.request("GET", f"/api/agent-runs/{posted['run_id']}", token=user).json()
    assert final["status"] == "succeeded", final
    return posted, final["final_message_id"]


def list_all(http, token: str, path: str, *, limit: int, query: Mapping[str, Any] | None = None,
             max_pages: int = 1000) -> tuple[list[dict], int]:
    """Follow ``next_cursor`` to the end; returns (items in order, number of pages)."""
    items: list[dict] = []
    cursor = None
    for pages in range(1, max_pages + 1):
        params = {**(query or {}), "limit": limit}
        if cursor:
            params["cursor"] = cursor
        reply = http.request("GET", path, token=token, query=params)
        assert reply.status == 200, reply
        body = reply.json()
        assert set(body) == {"items", "next_cursor"}, body
        assert len(body["items"]) <= limit
        items.extend(body["items"])
        cursor = body["next_cursor"]
        if cursor is None:
            return items, pages
        assert body["items"], "a page with a next_cursor must not be empty"
    raise AssertionError("paging did not end")


# ---- Server-Sent Events ------------------------------------------------------------------------


@dataclass
class SSEFrame:
    """One dispatched block: the fields seen between two blank lines, and its comments."""

    id: str | None = None
    event: str | None = None
    data_lines: list[str] = field(default_factory=list)
    retry: int | None = None
    comments: list[str] = field(default_factory=list)
    has_data: bool = False

    @property
    def data(self) -> str | None:
        return "\n".join(self.data_lines) if self.has_data else None

    def json(self) -> Any:
        return jsonlib.loads(self.data)

    @property
    def is_event(self) -> bool:
        return self.has_data


_LINE_END = re.compile(rb"\r\n|\n|\r")


class SSEParser:
    """The event-stream format of the HTML standard, over raw bytes fed in arbitrary chunks.

    Lines end with CRLF, LF or CR; a blank line dispatches the block. ``field: value`` (one
    optional space after the colon), ``:`` starts a comment; ``data`` lines accumulate.
    Comments and ``retry`` are kept on the frame so tests can see keep-alives and hints.
    """

    def __init__(self):
        self.buffer = b""
        self.current = SSEFrame()
        self.touched = False
        self.unknown_fields: list[str] = []

    def feed(self, chunk: bytes) -> list[SSEFrame]:
        self.buffer += chunk
        frames: list[SSEFrame] = []
        while True:
            match = _LINE_END.search(self.buffer)
            if match is None:
                break
            if match.group() == b"\r" and match.end() == len(self.buffer):
                break  # maybe the first half of CRLF: wait for the next chunk
            line = self.buffer[:match.start()].decode("utf-8")
            self.buffer = self.buffer[match.end():]
            frame = self._line(line)
            if frame is not None:
                frames.append(frame)
        return frames

    @property
    def pending(self) -> bool:
        """An unfinished block (bytes or fields without the closing blank line)."""
        return bool(self.buffer) or self.touched

    def _line(self, line: str) -> SSEFrame | None:
        if line == "":
            if not self.touched:
                return None
            frame, self.current, self.touched = self.current, SSEFrame(), False
            return frame
        self.touched = True
        if line.startswith(":"):
            self.current.comments.append(line[1:].lstrip(" "))
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self.current.data_lines.append(value)
            self.current.has_data = True
        elif name == "event":
            self.current.event = value
        elif name == "id":
            if "\x00" not in value:
                self.current.id = value
        elif name == "retry":
            if value.isdigit():
                self.current.retry = int(value)
        else:
            self.unknown_fields.append(name)
        return None


class SSEStream:
    """One ``GET …/events`` with ``Accept: text/event-stream`` on a real server."""

    def __init__(self, base_url: str, path: str, *, token: str | None = None,
                 last_event_id: str | int | None = None, session: requests.Session | None = None,
                 read_timeout: float = 10, query: Mapping[str, Any] | None = None):
        self._own_session = session is None
        self.session = session or requests.Session()
        headers = {"Accept": "text/event-stream"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        self.read_timeout = read_timeout
        self.parser = SSEParser()
        self.frames: list[SSEFrame] = []
        self.closed_by_server = False
        try:
            self.response = self.session.get(base_url.rstrip("/") + path, headers=headers,
                                             params=dict(query or {}), stream=True,
                                             timeout=(5, read_timeout))
        except BaseException:
            self._close_session()
            raise
        self._chunks = self.response.iter_content(chunk_size=None) if self.response.status_code == 200 else iter(())
        self._ready: list[SSEFrame] = []

    @property
    def status(self) -> int:
        return self.response.status_code

    @property
    def headers(self):
        return self.response.headers

    def next_frame(self) -> SSEFrame | None:
        """The next frame, or None when the server closed the stream."""
        while not self._ready:
            try:
                chunk = next(self._chunks)
            except StopIteration:
                self.closed_by_server = True
                return None
            self._ready.extend(self.parser.feed(chunk))
        frame = self._ready.pop(0)
        self.frames.append(frame)
        return frame

    def next_event(self, timeout: float | None = None) -> SSEFrame | None:
        """The next frame that carries data (skipping retry hints and comments), or None when
        the server closed the stream. Keep-alive comments do not extend ``timeout``."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.read_timeout)
        while True:
            frame = self.next_frame()
            if frame is None or frame.is_event:
                return frame
            if time.monotonic() > deadline:
                raise AssertionError(f"no event within {self.read_timeout}s, only comments/hints")

    def read_events(self, count: int) -> list[SSEFrame]:
        out = []
        for _ in range(count):
            frame = self.next_event()
            assert frame is not None, f"stream closed after {len(out)} of {count} events"
            out.append(frame)
        return out

    def read_to_end(self) -> list[SSEFrame]:
        out = []
        while (frame := self.next_event()) is not None:
            out.append(frame)
        return out

    def _close_session(self) -> None:
        if self._own_session:
            self.session.close()

    def close(self) -> None:
        try:
            if hasattr(self, "response"):
                self.response.close()
        finally:
            self._close_session()

    def __enter__(self) -> SSEStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def event_frames_as_dicts(frames: list[SSEFrame]) -> list[dict]:
    """Each event frame's data, after checking that ``id`` and ``event`` agree with it."""
    out = []
    for frame in frames:
        body = frame.json()
        assert frame.id == str(body["seq"]), frame
        assert frame.event == body["type"], frame
        out.append(body)
    return out


# ---- a real server process ---------------------------------------------------------------------


class ServerProcess:
    """``agentledger serve --no-worker`` on a free port: one ``ProcessManager`` server (its own
    process group, log file, ``/api/health`` wait), stopped with ``SIGINT`` then ``SIGKILL``."""

    def __init__(self, database_url: str, workdir: Path, *, env: Mapping[str, str] | None = None,
                 startup_timeout: float = 60, args: tuple[str, ...] = ()):
        self.manager = ProcessManager(workdir)
        try:
            self.proc = self.manager.serve(database_url, timeout=startup_timeout, threads=None,
                                           args=args, AGENTLEDGER_SECRET_KEY="api-tests-secret",
                                           **dict(env or {}))
        except BaseException:
            self.manager.close()
            raise
        assert self.proc.port is not None and self.proc.base_url is not None
        self.port: int = self.proc.port
        self.base_url: str = self.proc.base_url
        self.process = self.proc.popen
        self.log_path = self.proc.log_path

    def log(self) -> str:
        return self.proc.log()

    def admin_login_url(self) -> str | None:
        found = re.search(r"admin login: (\S+)", self.log())
        return found.group(1) if found else None

    def stop(self) -> None:
        try:
            self.proc.stop()
        finally:
            self.manager.close()


# ---- layer A: the Flask app on a test database -------------------------------------------------


class FlaskApi:
    """``create_app`` on one test database, with the standard tokens and an ``echo`` agent.

    ``request`` makes it usable wherever the helpers above take an ``http``.
    """

    def __init__(self, db: Database, database_url: str, **settings):
        from agentledger.app_factory import create_app
        from agentledger.core.config import Settings
        from support.factories import make_agent

        self.db = db
        self.settings = Settings(database_url=database_url, secret_key="api-tests-secret",
                                 **settings)
        self.app = create_app(self.settings, database=db, dashboards=False)
        self.client = self.app.test_client()
        self.http = FlaskHttp(self.client)
        self.tokens = make_tokens(db, STANDARD_TOKENS)
        make_agent(db, "echo", name="Echo")

    def __getattr__(self, name: str) -> str:
        tokens = self.__dict__.get("tokens", {})
        if name in tokens:
            return tokens[name]
        raise AttributeError(name)

    def token(self, owner: str, role: str = "user") -> str:
        return make_tokens(self.db, {"t": (owner, role)})["t"]

    def request(self, method: str, path: str, **kw) -> Reply:
        return self.http.request(method, path, **kw)

    def get(self, path: str, token: str | None = None, **kw) -> Reply:
        return self.http.request("GET", path, token=token, **kw)

    def post(self, path: str, token: str | None = None, **kw) -> Reply:
        return self.http.request("POST", path, token=token, **kw)

    def close(self) -> None:
        self.app.extensions["agentledger"].close()
