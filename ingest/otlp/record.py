"""Buffering spans in ``otlp_span`` and writing a trace's runs once its agent spans are in.

A root run (with its child runs) is written when its top agent span has arrived and the chain
of spans above it is known to hold no agent span: it reaches the trace's root, or its trace
has been quiet for ``quiet_seconds`` (then the top agent span is written as a root; the
reconciler loop does this). Every span the tree uses is marked with its run in the same
transaction as the runs, under a compare-and-set on ``run_id IS NULL``, so two servers
receiving parts of one trace write it once. An export of whole new traces skips the buffering:
its spans go in already marked, with their runs (see "an export of whole new traces" below).
A span that arrives after the run it belongs to was written is kept and marked ``""`` (not
recorded) and counted as rejected.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import cast

import orjson
from sqlalchemy import (
    Select,
    String,
    Text,
    bindparam,
    func,
    insert,
    select,
    text,
    true,
    tuple_,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from agentledger.core import dialect
from agentledger.core.config import MAX_INSTANCE_ID_LENGTH
from agentledger.core.database import Database
from agentledger.core.errors import Conflict, LedgerError, ValidationFailed
from agentledger.core.hashing import storable_json
from agentledger.core.ids import new_id
from agentledger.core.redaction import NO_REDACTION, Redactor
from agentledger.core.schema import (
    Agent,
    AgentVersion,
    ChatSession,
    ConversationThread,
    OtlpConversation,
    OtlpSpan,
)
from agentledger.core.vocabulary import EXTERNAL_KIND, RECORDED_EXECUTOR_PREFIX
from ingest.agents import AgentDefinition, add_agent_version, register_agent
from ingest.bulk_import import BulkImporter, ImportedEvent, ImportedRun
from ingest.otlp import mapping
from ingest.otlp.wire import ReceivedSpan

log = logging.getLogger("ingest.otlp")

DEFAULT_QUIET_SECONDS = 60.0
# The longest model name an agent version holds (its column).
_MODEL_LENGTH = cast(String, AgentVersion.__table__.c.model.type).length or 200
NOT_RECORDED = ""  # run_id of a span kept but not recorded in any run
# Agent spans nested deeper than this are no run tree anyone delegated; such a trace is kept
# and refused (the tree is built, read and verified recursively in places, which a sender must
# not be able to push past Python's recursion limit).
MAX_RUN_DEPTH = 100
_INSERT_CHUNK = 500


@dataclass
class ExportOutcome:
    received: int = 0
    new: int = 0
    rejected: int = 0
    runs_written: int = 0
    messages: list[str] = field(default_factory=list)

    @property
    def error_message(self) -> str:
        return "; ".join(dict.fromkeys(self.messages))


@dataclass
class _Node:
    """One agent span that becomes a run, and the spans it owns."""

    row: _Span
    content: list[_Span] = field(default_factory=list)
    children: list[_Node] = field(default_factory=list)
    run_id: str = field(default_factory=lambda: new_id("run"))


def _clean(value, where: str):
    try:
        return storable_json(value, where), None
    except LedgerError as exc:
        return None, exc.message


def span_rows(owner_id: str, spans: list[ReceivedSpan],
              redactor: Redactor = NO_REDACTION) -> tuple[list[dict], list[str]]:
    """The ``otlp_span`` rows of the spans whose text can be stored (``received_at`` is set by
    the transaction that stores them), and the refusals. With an active ``redactor``
    (``AGENTLEDGER_REDACT``) every text a row holds is redacted here, before it is stored: the
    runs are built from these rows, so nothing downstream sees the text as sent."""
    rows, refusals = [], []
    redactor = redactor.for_run()  # its own count: the database's redactor is shared
    for span in spans:
        replaced_before = redactor.count
        attrs = span.attributes
        if mapping.CONVERSATION_KEY in attrs:  # the receiver's own key: never taken as sent
            attrs = {k: v for k, v in attrs.items() if k != mapping.CONVERSATION_KEY}
        name, status_message, service = span.name, span.status_message, span.service_name
        if redactor.active:
            attrs = _redacted_attributes(redactor, attrs)
            name = redactor.text(name)
            status_message = None if status_message is None else redactor.text(status_message)
            service = redactor.text(service)[:200]  # a marker may be longer than its match
        attrs, problem = _clean(attrs, f"span {span.span_id} attributes")
        name, problem2 = _clean(name, "span name")
        status_message, problem3 = _clean(status_message, "status message")
        service, problem4 = _clean(service, "service.name")
        problem = problem or problem2 or problem3 or problem4
        if problem:
            refusals.append(problem)
            continue
        rows.append({"trace_id": span.trace_id, "span_id": span.span_id,
                     "parent_span_id": span.parent_span_id, "owner_id": owner_id,
                     "service_name": service, "name": name, "start_at": span.start_at,
                     "end_at": span.end_at, "status_code": span.status_code,
                     "status_message": status_message, "attributes": attrs, "received_at": None,
                     "run_id": None, "redaction_count": redactor.count - replaced_before})
    return rows, refusals


def _redacted_attributes(redactor: Redactor, attrs: dict) -> dict:
    """Every string value redacted, at any depth (keys are names, kept as they are, as in event
    data). A conversation id that redaction changes is keyed by the digest of the id as sent
    (``mapping.CONVERSATION_KEY``): its redacted text alone would merge every conversation whose
    ids differ only inside a redacted value (two email addresses) into one."""
    redacted = redactor.value(attrs)
    sent = mapping.conversation_id(attrs)
    if sent is not None and mapping.conversation_id(redacted) != sent:
        redacted[mapping.CONVERSATION_KEY] = mapping.conversation_digest(sent)
    return redacted


def store_spans(session: Session, rows: list[dict]) -> list[tuple[str, str]]:
    """Insert the rows not stored yet (one statement); returns their (trace_id, span_id)s."""
    if not rows:
        return []
    if dialect.name(session) == "postgresql":
        return _insert_json(session, rows)
    new: list[tuple[str, str]] = []
    for start in range(0, len(rows), _INSERT_CHUNK):
        chunk = rows[start:start + _INSERT_CHUNK]
        stmt = dialect.insert_ignoring_conflicts(session, OtlpSpan.__table__,
                                                 ["trace_id", "span_id"])
        result = session.execute(stmt.returning(OtlpSpan.trace_id, OtlpSpan.span_id), chunk)
        new.extend((r.trace_id, r.span_id) for r in result)
    return new


# All rows as one JSON parameter that the server turns into rows: a short statement whatever the
# number of spans, so psycopg prepares it once. A multi-row VALUES list of 512 spans is ~100 kB
# of SQL that the driver re-parses on every request (half of the receiver's time), and array
# parameters are escaped element by element in Python; ``json.dumps`` is C.
_INSERT_JSON = text(
    f"INSERT INTO otlp_span ({', '.join(OtlpSpan.__table__.c.keys())}) "
    f"SELECT {', '.join(OtlpSpan.__table__.c.keys())} "
    "FROM json_populate_recordset(NULL::otlp_span, CAST(:rows AS json)) "
    "ON CONFLICT (trace_id, span_id) DO NOTHING RETURNING trace_id, span_id")


def _insert_json(session: Session, rows: list[dict]) -> list[tuple[str, str]]:
    result = session.execute(_INSERT_JSON, {"rows": _rows_json(rows)})
    return [(trace_id, span_id) for trace_id, span_id in result]


def _rows_json(rows: list[dict]) -> str:
    # orjson writes datetimes itself and is several times faster than ``json.dumps`` with a
    # ``default`` hook (a tenth of the receiver's time). It refuses integers beyond 64 bits,
    # which span attributes may hold: those exports take the standard library's way.
    try:
        return orjson.dumps(rows).decode()
    except orjson.JSONEncodeError:
        return json.dumps(rows, default=_iso)


def _iso(value):
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


# --- building the run trees of a trace ----------------------------------------------------------


def _ancestors(row: _Span, by_id: dict[str, _Span]):
    """The present spans above ``row``, nearest first, and whether the chain reaches the root."""
    chain, seen = [], {row.span_id}
    parent = row.parent_span_id
    while parent is not None:
        above = by_id.get(parent)
        if above is None or above.span_id in seen:
            return chain, False
        chain.append(above)
        seen.add(above.span_id)
        parent = above.parent_span_id
    return chain, True


def _agent_spans(rows: list[_Span]) -> set[str]:
    """The span ids of the trace's agent spans that become runs. Every agent span does, except
    a workflow container: a nameless OpenInference ``AGENT`` span with no agent span above it
    and a named agent span somewhere below it (the OpenAI Agents instrumentation's span of the
    whole workflow, above each agent's own span). A nameless ``AGENT`` span under an agent span,
    or with no named agent under it, is an agent of its own."""
    agents = {r.span_id for r in rows if mapping.is_agent_span(r.attributes)}
    candidates = {r.span_id for r in rows
                  if r.span_id in agents and mapping.is_workflow_candidate(r.attributes)}
    if not candidates:
        return agents  # nearly every trace: nothing else to look at
    by_id = {r.span_id: r for r in rows}
    containers: set[str] = set()
    for row in rows:
        if row.span_id not in agents or row.span_id in candidates:
            continue  # only named agent spans make the spans above them containers
        chain, _complete = _ancestors(row, by_id)
        for depth, above in enumerate(chain):
            if above.span_id in candidates and not any(
                    a.span_id in agents for a in chain[depth + 1:]):
                containers.add(above.span_id)
    return agents - containers


def _build(root: _Span, rows: list[_Span], agents: set[str]) -> _Node:
    """The run tree under ``root``: each span belongs to its nearest agent ancestor. Parent ids
    are the sender's: spans that name each other as parents (a cycle, over one export or
    several) are each placed once, under the first of them reached from ``root``."""
    children: dict[str, list[_Span]] = defaultdict(list)
    for row in rows:
        if row.parent_span_id is not None:
            children[row.parent_span_id].append(row)
    top = _Node(root)
    stack = [(root, top)]
    placed = {root.span_id}
    while stack:
        span, node = stack.pop()
        for child in children.get(span.span_id, []):
            if child.run_id is not None or child.span_id in placed:
                continue
            placed.add(child.span_id)
            if child.span_id in agents:
                sub = _Node(child)
                node.children.append(sub)
                stack.append((child, sub))
            else:
                node.content.append(child)
                stack.append((child, node))
    return top


def _trees(rows: list[_Span], *, quiet: bool, settled: bool = True) -> list[_Node]:
    """The run trees of one trace's spans that are ready to be written (see ``_tops``)."""
    if not (settled or quiet):
        return []
    agents = _agent_spans(rows)
    return [_build(top, rows, agents)
            for top in _tops(rows, agents, quiet=quiet, settled=settled)]


def _nodes(node: _Node):
    """Every node of the tree, parents before children (a loop: a sender's tree may be deeper
    than Python's recursion limit until ``_imported`` refuses it)."""
    stack = [node]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children))


@dataclass(frozen=True)
class _Observed:
    """What a run's spans show of its agent. ``None`` is "not captured": a trace that does not
    record its model (instructions, tools) says nothing about it, so it is never compared."""

    name: str
    model: str | None
    instructions: str | None
    tools: tuple[str, ...] | None

    def matches(self, current) -> bool:
        """Whether every field observed equals the current version's (a row with ``model``,
        ``instructions`` and ``tools``)."""
        return ((self.model is None or self.model == current.model)
                and (self.instructions is None or self.instructions == current.instructions)
                and (self.tools is None or list(self.tools) == list(current.tools or [])))

    def definition(self, current=None) -> AgentDefinition:
        """The version to record: the fields observed, and for the others the current version's
        values (a trace that did not capture the instructions does not mean they were dropped);
        nothing for them when the agent is new."""
        model, instructions, tools = self.model, self.instructions, self.tools
        if current is not None:
            model = current.model if model is None else model
            instructions = current.instructions if instructions is None else instructions
            kept = list(current.tools or []) if tools is None else list(tools)
        else:
            kept = list(tools or ())
        return AgentDefinition(name=self.name, kind=EXTERNAL_KIND, model=model,
                               instructions=instructions, tools=kept, params={"source": "otlp"})


def _observed(node: _Node) -> tuple[str, _Observed]:
    """The agent id (a slug) of the run of ``node`` and what its spans show of the agent: the
    id from ``gen_ai.agent.id`` (else the agent's name), the display name from
    ``gen_ai.agent.name`` (else the id); a span that names no agent is filed under its span
    name, else its service (``mapping.unnamed_agent``)."""
    attrs = node.row.attributes
    ident = mapping.agent_id(attrs) or mapping.unnamed_agent(node.row.name,
                                                             node.row.service_name)
    name = mapping.agent_display_name(attrs) or ident
    models = [s for s in sorted(node.content, key=lambda s: s.start_at)
              if mapping.is_model_span(s.attributes)]
    model = mapping.model_of(attrs)
    instructions = mapping.instructions_of(attrs)
    tools = mapping.tool_names(attrs)
    for span in models:
        model = model or mapping.model_of(span.attributes)
        instructions = instructions or mapping.instructions_of(span.attributes)
        if tools is None:
            tools = mapping.tool_names(span.attributes)
    return mapping.slug(ident), _Observed(name[:200], model, instructions,
                                          None if tools is None else tuple(tools))


def _ensure_agent(session: Session, agent_id: str, observed: _Observed) -> tuple[str, int]:
    """The (agent id, version) that records this observation, registering the agent as kind
    ``external`` or adding a version when an observed model, instructions or tools differ from
    the current version's. An id that belongs to an agent of another kind is not touched:
    ``<id>-external`` is used instead."""
    if observed.model is not None and len(observed.model) > _MODEL_LENGTH:
        raise ValidationFailed(f"the model name {observed.model[:40]!r}… is longer than "
                               f"{_MODEL_LENGTH} characters")
    for candidate in (agent_id, f"{agent_id[:54]}-external"):
        latest = session.execute(
            dialect.for_update(select(Agent.latest_version).where(Agent.id == candidate), session)
        ).scalar_one_or_none()
        if latest is None:
            try:  # an insert that ignores conflicts: a lost race leaves the transaction usable
                return candidate, register_agent(session, candidate, observed.definition())
            except Conflict:
                latest = session.execute(dialect.for_update(
                    select(Agent.latest_version).where(Agent.id == candidate), session)
                ).scalar_one()
        current = session.execute(select(AgentVersion).where(
            AgentVersion.agent_id == candidate, AgentVersion.version == latest)).scalar_one()
        if current.kind != EXTERNAL_KIND:
            continue
        if observed.matches(current):
            return candidate, latest
        return candidate, add_agent_version(session, candidate, observed.definition(current))
    raise Conflict(f"agent ids {agent_id!r} and {agent_id}-external belong to other kinds")


def _session_for(session: Session, owner_id: str, conversation: str, title: str,
                 agent_id: str, at: datetime) -> str:
    """The chat session of this owner's conversation (by its key), created (with its thread and
    the conversation id as stored for a title) on first use."""
    session_id = new_id("sess")
    stmt = dialect.insert_ignoring_conflicts(
        session, OtlpConversation.__table__, ["owner_id", "conversation_id"]
    ).values(owner_id=owner_id, conversation_id=conversation, session_id=session_id,
             created_at=at).returning(OtlpConversation.session_id)
    if session.execute(stmt).first() is None:
        return session.execute(select(OtlpConversation.session_id).where(
            OtlpConversation.owner_id == owner_id,
            OtlpConversation.conversation_id == conversation)).scalar_one()
    thread_id = new_id("thr")
    session.execute(insert(ConversationThread).values(id=thread_id, owner_id=owner_id,
                                                      created_at=at))
    session.execute(insert(ChatSession).values(
        id=session_id, owner_id=owner_id, title=title[:200], agent_id=agent_id,
        thread_id=thread_id, created_at=at, updated_at=at))
    return session_id


def _conversation(top: _Node) -> tuple[str, str] | None:
    """(key, title) of the root run's conversation: the top agent span's, else the first of its
    spans that names one."""
    conversation = mapping.conversation(top.row.attributes)
    for span in top.content:
        if conversation is not None:
            break
        conversation = mapping.conversation(span.attributes)
    return conversation


@dataclass
class _Known:
    """What the database says about the trees' agents and conversations, read in one query each."""

    definitions: dict[str, tuple[str, _Observed]]  # by run id: (agent id, what was observed)
    conversations: dict[str, tuple[str, str]]  # root run id -> (owner, conversation key)
    titles: dict[str, str]  # root run id -> its conversation id as stored (a new session's title)
    current: dict  # agent id -> its current version's row
    mapped: dict[tuple[str, str], str]  # (owner, conversation key) -> session id


def _read_known(s: Session, trees: list[tuple[_Node, int]]) -> _Known:
    definitions = {node.run_id: _observed(node) for top, _ in trees for node in _nodes(top)}
    found = {top.run_id: (top.row.owner_id, c) for top, _ in trees
             if (c := _conversation(top)) is not None}
    conversations = {run_id: (owner, key) for run_id, (owner, (key, _title)) in found.items()}
    titles = {run_id: title for run_id, (_owner, (_key, title)) in found.items()}
    candidates = {c for agent_id, _ in definitions.values()
                  for c in (agent_id, f"{agent_id[:54]}-external")}
    current = {row.id: row for row in s.execute(
        select(Agent.id, Agent.latest_version, AgentVersion.kind, AgentVersion.model,
               AgentVersion.instructions, AgentVersion.tools)
        .join(AgentVersion, (AgentVersion.agent_id == Agent.id)
              & (AgentVersion.version == Agent.latest_version))
        .where(Agent.id.in_(candidates)))}
    mapped = {(row.owner_id, row.conversation_id): row.session_id for row in s.execute(
        select(OtlpConversation.owner_id, OtlpConversation.conversation_id,
               OtlpConversation.session_id)
        .where(tuple_(OtlpConversation.owner_id, OtlpConversation.conversation_id)
               .in_(set(conversations.values()))))} if conversations else {}
    return _Known(definitions, conversations, titles, current, mapped)


def _known_agents_and_sessions(trees: list[tuple[_Node, int]], known: _Known
                               ) -> tuple[dict[str, tuple[str, int]], dict[str, str]] | None:
    """The (agent id, version) of every run of the trees and the chat session of each root run
    that names a conversation, when ``known`` holds them all (agent versions are immutable, so
    what was read stays true); None when an agent must be registered, a version added or a
    session created (``_agents_and_sessions``, in the transaction that writes the runs)."""
    agents: dict[str, tuple[str, int]] = {}
    for node in (node for top, _seen in trees for node in _nodes(top)):
        agent_id, observed = known.definitions[node.run_id]
        found = _current_version(known.current, agent_id, observed)
        if found is None:
            return None
        agents[node.run_id] = found
    sessions = {}
    for top, _seen in trees:
        key = known.conversations.get(top.run_id)
        if key is not None:
            if key not in known.mapped:
                return None
            sessions[top.run_id] = known.mapped[key]
    return agents, sessions


def _agents_and_sessions(s: Session, trees: list[tuple[_Node, int]], known: _Known
                         ) -> tuple[dict[str, tuple[str, int]], dict[str, str]]:
    """What ``_known_agents_and_sessions`` answers, registering agents, adding versions and
    creating sessions where needed, in the caller's transaction: a tree that then cannot be
    written leaves no agent or session behind. Agents are locked in id order, so that two
    requests registering the same agents never wait for each other in a cycle."""
    conversations = known.conversations
    definitions = {node.run_id: known.definitions[node.run_id]
                   for top, _seen in trees for node in _nodes(top)}
    agents: dict[str, tuple[str, int]] = {}
    resolved: dict[tuple, tuple[str, int]] = {}
    for run_id, (agent_id, observed) in sorted(definitions.items(), key=lambda d: d[1][0]):
        key = (agent_id, observed)
        if key not in resolved:
            resolved[key] = (_current_version(known.current, agent_id, observed)
                             or _ensure_agent(s, agent_id, observed))
        agents[run_id] = resolved[key]
    sessions: dict[str, str] = {}
    for top, _seen in trees:
        if top.run_id in conversations:
            key = conversations[top.run_id]
            sessions[top.run_id] = known.mapped.get(key) or _session_for(
                s, key[0], key[1], known.titles[top.run_id], agents[top.run_id][0],
                top.row.start_at)
    return agents, sessions


def _current_version(current: dict, agent_id: str,
                     observed: _Observed) -> tuple[str, int] | None:
    """What ``_ensure_agent`` would answer without writing, from the agents' current versions;
    None when it would have to register the agent or add a version."""
    for candidate in (agent_id, f"{agent_id[:54]}-external"):
        row = current.get(candidate)
        if row is None:
            return None
        if row.kind != EXTERNAL_KIND:
            continue
        if observed.matches(row):
            return candidate, row.latest_version
        return None
    return None


def _events(node: _Node, agents: dict[str, tuple[str, int]]) -> tuple[list[ImportedEvent], str]:
    """The run's events after ``run.queued``, in span time order, clipped to the agent span's
    own interval (a remote span's clock may be a little off), and the run's input."""
    start, end = node.row.start_at, max(node.row.end_at, node.row.start_at)

    def at(moment: datetime) -> datetime:
        return min(max(moment, start), end)

    timed: list[tuple[datetime, int, ImportedEvent]] = []
    order = 0

    def add(moment: datetime, event_type: str, data: dict) -> None:
        nonlocal order
        order += 1
        timed.append((at(moment), order, ImportedEvent(event_type, data, at(moment))))

    service = node.row.service_name
    # A recorded run had no lease to renew: its executor was alive until the agent span ended,
    # so that is when its lease expires (the run is written terminal: lease health counts the
    # leases of running runs only, and leaves ``otlp:`` names out of the executors it lists).
    executor = f"{RECORDED_EXECUTOR_PREFIX}{service}"[:MAX_INSTANCE_ID_LENGTH]
    add(start, "run.started", {"executor_instance_id": executor,
                               "lease_expires_at": end.isoformat()})
    user = mapping.user_text(node.row.attributes)
    last_output = None
    items = [(s.start_at, 0, s) for s in node.content] + [(c.row.start_at, 1, c) for c in node.children]
    for _, _kind, item in sorted(items, key=lambda t: (t[0], t[1])):
        if isinstance(item, _Node):  # kind 1: a child run
            agent_id, _version = agents[item.run_id]
            add(item.row.start_at, "run.child_created",
                {"child_run_id": item.run_id, "agent_id": agent_id})
            status = "failed" if item.row.status_code == 2 else "succeeded"
            add(item.row.end_at, "run.child_finished",
                {"child_run_id": item.run_id, "status": status})
            continue
        attrs = item.attributes
        if mapping.is_model_span(attrs):
            if user is None:
                user = mapping.user_text(attrs)
            counts = mapping.tokens(attrs)
            text = mapping.output_text(attrs)
            if text:
                add(item.end_at, "message.delta", {"text": text})
                last_output = text
            if counts is not None:
                data = {"input_tokens": counts[0], "output_tokens": counts[1], "cost_usd": None}
                model = mapping.model_of(attrs)
                if model:
                    data["model"] = model
                add(item.end_at, "usage", data)
        elif mapping.is_tool_span(attrs):
            name, arguments, result, call_id = mapping.tool_call(attrs, item.name)
            call = {"name": name, "input": arguments}
            done = {"name": name, "output": result}
            if call_id:
                call["call_id"] = done["call_id"] = call_id
            add(item.start_at, "tool.call", call)
            add(item.end_at, "tool.result", done)
    timed.sort(key=lambda t: (t[0], t[1]))
    events = [e for _, _, e in timed]
    if node.row.status_code == 2:
        message = (node.row.status_message or "the agent span ended with status ERROR")[:10_000]
        events.append(ImportedEvent("run.failed", {"error": {
            "code": mapping.error_code(node.row.attributes), "message": message}}, end))
    else:
        answer = mapping.output_text(node.row.attributes) or last_output
        events.append(ImportedEvent("run.completed", {"content": answer}, end))
    return events, user or ""


def _imported(node: _Node, agents, owner_id: str, session_id: str | None,
              announced: datetime | None = None, depth: int = 1) -> ImportedRun:
    if depth > MAX_RUN_DEPTH:
        raise ValidationFailed(f"its agent spans nest more than {MAX_RUN_DEPTH} levels deep")
    events, user = _events(node, agents)
    agent_id, version = agents[node.run_id]
    created = node.row.start_at if announced is None else max(node.row.start_at, announced)
    if events and events[0].at < created:
        for event in events:
            event.at = max(event.at, created)
        events[0].data["lease_expires_at"] = events[-1].at.isoformat()  # with the run's end
    run = ImportedRun(agent_id=agent_id, agent_version=version, input=user, created_at=created,
                      events=events, owner_id=owner_id if announced is None else None,
                      session=session_id, id=node.run_id,
                      prior_redactions=node.row.redaction_count
                      + sum(span.redaction_count for span in node.content))
    announce = {e.data["child_run_id"]: e.at for e in events if e.type == "run.child_created"}
    run.children = [_imported(c, agents, owner_id, None, announce[c.run_id], depth + 1)
                    for c in node.children]
    return run


class _Lost(Exception):
    """Another server recorded (part of) this tree first."""


def _claim(session: Session, trees: list[tuple[_Node, int]]) -> bool:
    """Mark every span the trees use with its run, only where ``run_id`` is still NULL: the
    compare-and-set that lets one server only write a tree. False when any span was taken."""
    claims = [(node.row.trace_id, span_id, node.run_id)
              for top, _seen in trees for node in _nodes(top)
              for span_id in (node.row.span_id, *(c.span_id for c in node.content))]
    if dialect.name(session) == "postgresql":
        # One statement for the whole request instead of one per run.
        rows = [{"trace_id": t, "span_id": sp, "run_id": r} for t, sp, r in claims]
        claimed = cast(CursorResult, session.execute(
            _CLAIM_JSON, {"claims": json.dumps(rows)})).rowcount
        return claimed == len(claims)
    spans = OtlpSpan.__table__
    for top, _seen in trees:  # SQLite is in this process: a statement per run costs little
        for node in _nodes(top):
            ids = [node.row.span_id, *(c.span_id for c in node.content)]
            claimed = cast(CursorResult, session.execute(
                update(spans)
                .where(spans.c.trace_id == node.row.trace_id, spans.c.span_id.in_(ids),
                       spans.c.run_id.is_(None))
                .values(run_id=node.run_id))).rowcount
            if claimed != len(ids):
                return False
    return True


_CLAIM_JSON = text(
    "UPDATE otlp_span AS s SET run_id = c.run_id "
    "FROM json_to_recordset(CAST(:claims AS json)) AS c(trace_id text, span_id text, run_id text) "
    "WHERE s.trace_id = c.trace_id AND s.span_id = c.span_id AND s.run_id IS NULL")


@dataclass
class Refusals:
    """Run trees that can never be recorded (what their spans say makes an event or an agent
    the ledger refuses): the keys of their spans, marked ``NOT_RECORDED``, and why."""

    keys: set[tuple[str, str]] = field(default_factory=set)
    messages: list[str] = field(default_factory=list)


def _write_trees(db: Database, trees: list[tuple[_Node, int]], known: _Known,
                 claim: Callable[[Session, list[tuple[_Node, int]]], bool] | None = None,
                 refused: Refusals | None = None) -> int | None:
    """Write the trees (each with the number of its trace's spans it was built from) in one
    transaction, with the agents and sessions they need. 0 when another server recorded one of
    them first (``claim``, by default the compare-and-set on stored spans, answered False), or
    when the ledger refuses one of several trees (the caller writes them one by one); None when
    spans of a trace arrived since it was read: the caller rebuilds. All or nothing. A single
    tree the ledger refuses is marked not recorded and noted in ``refused`` (None: it is left
    as it is, and 0 returned)."""
    claim = claim or _claim
    importer = BulkImporter(db)
    found = _known_agents_and_sessions(trees, known)
    batch = None
    try:
        if found is not None and not db.is_postgres:
            # SQLite: built before the write transaction, whose BEGIN IMMEDIATE holds the
            # write lock (unless agents or sessions must be written first, in that transaction).
            batch = importer.prepare(_imported_trees(trees, *found))
        with db.write() as s:
            # PostgreSQL: inside it, before the claims take any row lock.
            if batch is None:
                agents, sessions = found or _agents_and_sessions(s, trees, known)
                batch = importer.prepare_in(s, _imported_trees(trees, agents, sessions))
            if not claim(s, trees):
                raise _Lost(0)
            # Counted after the claims: a span stored by a request that committed before this
            # point is seen here (and the tree is rebuilt with it); one that commits later sees
            # these trees once they are committed, and reports itself as late.
            stored = _stored_counts(s, {top.row.trace_id for top, _ in trees})
            if any(stored.get(top.row.trace_id) != seen for top, seen in trees):
                raise _Lost(None)
            importer.write_prepared(s, batch)
    except _Lost as lost:
        return lost.args[0]
    except LedgerError as exc:
        if refused is not None and len(trees) == 1:
            _refuse(db, trees[0][0], exc.message, refused)
        return 0
    return batch.tally()[0]


def _imported_trees(trees: list[tuple[_Node, int]], agents: dict[str, tuple[str, int]],
                    sessions: dict[str, str]) -> list[ImportedRun]:
    return [_imported(top, agents, top.row.owner_id, sessions.get(top.run_id))
            for top, _seen in trees]


def _refuse(db: Database, top: _Node, problem: str, refused: Refusals) -> None:
    """Mark the spans of a tree the ledger refuses ``NOT_RECORDED`` (where no run took them
    meanwhile): kept, never recorded, and never looked at again by the quiet-trace flush."""
    keys = [(node.row.trace_id, span.span_id) for node in _nodes(top)
            for span in (node.row, *node.content)]
    with db.write() as s:
        marked = s.execute(
            update(OtlpSpan).where(tuple_(OtlpSpan.trace_id, OtlpSpan.span_id).in_(keys),
                                   OtlpSpan.run_id.is_(None))
            .values(run_id=NOT_RECORDED).returning(OtlpSpan.trace_id, OtlpSpan.span_id)
        ).tuples().all()
    message = (f"the run of agent span {top.row.span_id} (trace {top.row.trace_id}) cannot be "
               f"recorded: {problem}")
    log.warning("%s; its %d span(s) are kept, not recorded", message, len(marked))
    refused.keys.update(marked)
    refused.messages.append(message)


def _quiet(rows: list[_Span], now: datetime, quiet_seconds: float) -> bool:
    """No span of the trace arrived in the last ``quiet_seconds``."""
    return max((r.received_at for r in rows), default=now) <= now - timedelta(
        seconds=quiet_seconds)


def _at_rest(rows: list[_Span], now: datetime, settle_seconds: float) -> bool:
    """The trace's complete trees may be written: at once without a settle period (as its
    spans arrive), else once it received nothing for ``settle_seconds``."""
    return settle_seconds <= 0 or _quiet(rows, now, settle_seconds)


def _stored_counts(session: Session, trace_ids: set[str]) -> dict[str, int]:
    """How many spans of each of these traces are stored (0 for none)."""
    if dialect.name(session) == "postgresql":
        return dict(session.execute(_PER_TRACE_COUNT, {"ids": sorted(trace_ids)}).tuples().all())
    spans = OtlpSpan.__table__
    stored = dict(session.execute(
        select(spans.c.trace_id, func.count()).where(spans.c.trace_id.in_(trace_ids))
        .group_by(spans.c.trace_id)).tuples().all())
    return {t: stored.get(t, 0) for t in trace_ids}


def _tops(rows: list[_Span], agents: set[str], *, quiet: bool,
          settled: bool = True) -> list[_Span]:
    """The spans of one trace that are ready to be written as root runs (``agents``: its agent
    spans that are runs): in a ``settled`` trace the top agent spans whose chain reaches the
    root, in a ``quiet`` one also those whose chain is incomplete. A trace without agent spans
    is one run, its root span's, when a span of it is a model or tool span or the root span
    carries a GenAI or OpenInference attribute itself; a trace with none of these (a plain HTTP
    trace) never becomes a run."""
    if not (settled or quiet):
        return []
    by_id = {r.span_id: r for r in rows}
    tops = []
    for row in rows:
        if row.run_id is not None:
            continue
        if agents:
            if row.span_id not in agents:
                continue
            chain, complete = _ancestors(row, by_id)
            if any(a.span_id in agents for a in chain):
                continue  # a child run: written with its parent
            if any(a.run_id for a in chain):
                continue  # under a recorded run: late
            if complete or quiet:
                tops.append(row)
        elif row.parent_span_id is None and (mapping.carries_genai(row.attributes) or any(
                mapping.is_model_span(r.attributes) or mapping.is_tool_span(r.attributes)
                for r in rows)):
            tops.append(row)  # no agent span: the trace's root span is the run
    return tops


@dataclass(slots=True)
class _Span:
    """One ``otlp_span`` row."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    owner_id: str
    service_name: str
    name: str
    start_at: datetime
    end_at: datetime
    status_code: int
    status_message: str | None
    attributes: dict
    received_at: datetime
    run_id: str | None
    redaction_count: int


# Who is in a trace and who recorded what: all that _mark_late needs, and the first look of
# _trace_rows (no attributes to decode).
_SHAPE = (OtlpSpan.trace_id, OtlpSpan.span_id, OtlpSpan.parent_span_id, OtlpSpan.run_id)
_TRACE_IDS = (func.unnest(sql_cast(bindparam("ids"), ARRAY(Text))).table_valued("id")
              .render_derived().alias("t"))


# One primary-key probe per trace, whatever the planner believes: with ``trace_id IN (…)`` and
# no statistics yet on a growing table (before autovacuum's first ANALYZE), PostgreSQL estimates
# a third of the table per 64 traces and scans all of it (58 ms at 184k spans, against 3 ms).
def _per_trace(*columns, with_id: bool = False) -> Select:
    """``columns`` of the spans of the traces in ``ids`` (after each trace id with ``with_id``);
    OFFSET 0 keeps the planner from turning the probes back into a join it may run as a scan."""
    probe = select(*columns).where(OtlpSpan.trace_id == _TRACE_IDS.c.id).offset(0).lateral("x")
    ids = [_TRACE_IDS.c.id] if with_id else []
    return select(*ids, *probe.c).select_from(_TRACE_IDS).join(probe, true())


_PER_TRACE_SHAPE = _per_trace(*_SHAPE)
_PER_TRACE_FULL = _per_trace(*OtlpSpan.__table__.c)
_PER_TRACE_COUNT = _per_trace(func.count().label("n"), with_id=True)  # 0 for a trace not stored


def _spans_of(session: Session, trace_ids, *, full: bool = False):
    """The rows (``_SHAPE``, or whole with ``full``) of the stored spans of these traces."""
    ids = sorted(set(trace_ids))
    if dialect.name(session) == "postgresql":
        return session.execute(_PER_TRACE_FULL if full else _PER_TRACE_SHAPE, {"ids": ids})
    columns = OtlpSpan.__table__.c if full else _SHAPE
    return session.execute(select(*columns).where(OtlpSpan.trace_id.in_(ids)))


def _trace_rows(s: Session, trace_ids, known: dict | None = None) -> dict[str, list[_Span]]:
    """The stored spans of these traces (read on the primary: a replica may not have the spans
    just stored). ``known`` holds rows this request has just stored, by (trace_id, span_id):
    only their ``run_id`` is read back, not their attributes again."""
    known = known or {}
    # Plain tuples: a Row's attribute look-up costs about a microsecond, ~20 of them a span.
    shape = _spans_of(s, trace_ids).tuples().all()
    unknown = {trace_id for trace_id, span_id, _parent, _run in shape
               if (trace_id, span_id) not in known}
    full = {}
    if unknown:
        full = {(r.trace_id, r.span_id): r._mapping for r in _spans_of(s, unknown, full=True)}
    by_trace: dict[str, list[_Span]] = defaultdict(list)
    for trace_id, span_id, _parent, run_id in shape:
        key = (trace_id, span_id)
        found = known.get(key) or full.get(key)
        if found is None:
            continue  # pruned between the two reads: the recount in _write_trees sees it
        span = _Span(**found)
        span.run_id = run_id
        by_trace[trace_id].append(span)
    return by_trace


def process_trace(db: Database, trace_id: str, now: datetime, quiet_seconds: float,
                  *, force: bool = False, settle_seconds: float = 0.0,
                  refused: Refusals | None = None) -> int:
    """Write every run tree of the trace that is ready; returns how many runs were written.
    A tree the ledger refuses is marked not recorded (and noted in ``refused``)."""
    refused = Refusals() if refused is None else refused
    written = 0
    for _attempt in range(5):
        with db.read(primary=True) as s:
            rows = _trace_rows(s, [trace_id]).get(trace_id, [])
            trees = [(top, len(rows)) for top in _trees(
                rows, quiet=force or _quiet(rows, now, quiet_seconds),
                settled=_at_rest(rows, now, settle_seconds))]
            looked_up = _read_known(s, trees)
        if not trees:
            break
        stale = False
        for tree in trees:
            count = _write_trees(db, [tree], looked_up, refused=refused)
            if count is None:
                stale = True
                break
            written += count
        if not stale:
            break
    return written


def process_traces(db: Database, trace_ids: set[str], now: datetime, quiet_seconds: float,
                   known: dict | None = None, *, settle_seconds: float = 0.0,
                   refused: Refusals | None = None) -> tuple[int, set[str]]:
    """All ready trees of these traces in one transaction; when another server got in the way
    (a tree claimed, or spans added meanwhile) or the ledger refuses one of the trees, trace by
    trace instead (re-read in full). A tree the ledger refuses is marked not recorded (and
    noted in ``refused``); the others are written.

    Returns the runs written and the traces this left with no span waiting and none of
    ``known`` settled by someone else: ``_mark_late`` has nothing to do for those (a span
    stored later is its own request's to report)."""
    with db.read(primary=True) as s:  # one read transaction: the spans, then their agents
        by_trace = _trace_rows(s, trace_ids, known)
        trees = [(top, len(rows)) for rows in by_trace.values()
                 for top in _trees(rows, quiet=_quiet(rows, now, quiet_seconds),
                                   settled=_at_rest(rows, now, settle_seconds))]
        looked_up = _read_known(s, trees) if trees else None
    if looked_up is None:
        return 0, set()
    refused = Refusals() if refused is None else refused
    if len({tree.row.trace_id for tree, _ in trees}) == len(trees):
        written = _write_trees(db, trees, looked_up, refused=refused)
        if written:
            return written, _settled(by_trace, trees, known or {})
    return sum(process_trace(db, t, now, quiet_seconds, settle_seconds=settle_seconds,
                             refused=refused)
               for t in sorted(by_trace)), set()


def _settled(by_trace: dict[str, list[_Span]], trees: list[tuple[_Node, int]],
             known: dict) -> set[str]:
    """The traces whose every span was claimed by ``trees`` (just committed) or was already
    settled when read and is not one this request stored."""
    claimed: dict[str, int] = defaultdict(int)
    for top, _seen in trees:
        claimed[top.row.trace_id] += sum(1 + len(node.content) for node in _nodes(top))
    return {trace_id for trace_id, rows in by_trace.items()
            if claimed[trace_id] + sum(r.run_id is not None
                                       and (trace_id, r.span_id) not in known for r in rows)
            == len(rows)}


def _mark_late(db: Database, trace_ids: set[str], new: set[tuple[str, str]],
               *, force: bool) -> int:
    """Spans still waiting under (or beside) a recorded run never will be recorded: mark them
    ``NOT_RECORDED`` and count the new ones among them.

    Another server's request may have marked some of this request's spans already (it marks
    every waiting span under the run it recorded, but counts only its own): those count here,
    so that every span of an export is either recorded or reported as rejected exactly once."""
    late = 0
    by_trace: dict[str, list] = defaultdict(list)
    with db.read(primary=True) as s:
        for row in _spans_of(s, trace_ids):
            by_trace[row.trace_id].append(row)
    marks = []
    for trace_id, spans in by_trace.items():
        by_id = {r.span_id: r for r in spans}
        for row in spans:
            if row.run_id == NOT_RECORDED and (trace_id, row.span_id) in new:
                late += 1
            if row.run_id is not None:
                continue
            chain, _complete = _ancestors(row, by_id)
            if force or any(a.run_id for a in chain):
                marks.append((trace_id, row.span_id))
    if marks:
        with db.write() as s:
            s.execute(update(OtlpSpan).where(
                tuple_(OtlpSpan.trace_id, OtlpSpan.span_id).in_(marks),
                OtlpSpan.run_id.is_(None)).values(run_id=NOT_RECORDED))
            # Read back in the same transaction: a span a concurrent tree claimed meanwhile was
            # recorded, not rejected.
            mine = [m for m in marks if m in new]
            if mine:
                late += s.execute(select(func.count()).select_from(OtlpSpan).where(
                    tuple_(OtlpSpan.trace_id, OtlpSpan.span_id).in_(mine),
                    OtlpSpan.run_id == NOT_RECORDED)).scalar_one()
    return late


def receive_spans(db: Database, owner_id: str, spans: list[ReceivedSpan], *,
                  quiet_seconds: float = DEFAULT_QUIET_SECONDS,
                  settle_seconds: float = 0.0) -> ExportOutcome:
    """Store an export's spans and write the runs that became ready: in one transaction when
    the export holds whole new traces, else the spans first, then the trees they complete.
    With ``settle_seconds`` nothing is written here: every trace waits until it received
    nothing for that long, and the reconciler's ``flush_quiet_traces`` writes it."""
    outcome = ExportOutcome(received=len(spans))
    rows, refusals = span_rows(owner_id, spans, db.redactor)
    outcome.rejected += len(refusals)
    outcome.messages += refusals
    firsts = _first_copies(rows)  # a span sent twice in one export is stored as its first copy
    trees = None if settle_seconds > 0 else _whole_traces(firsts)
    if trees is not None:
        written = _write_whole_traces(db, firsts, trees)
        if written is not None:
            outcome.new, outcome.runs_written = len(firsts), written
            return outcome
    with db.write() as s:
        now = dialect.now(s)
        foreign = _traces_of_other_owners(s, owner_id, {row["trace_id"] for row in rows})
        if foreign:
            refused_rows = [row for row in rows if row["trace_id"] in foreign]
            rows = [row for row in rows if row["trace_id"] not in foreign]
            outcome.rejected += len(refused_rows)
            outcome.messages.append(
                f"{len(refused_rows)} span(s) of trace(s) {', '.join(sorted(foreign)[:3])}"
                f"{' …' if len(foreign) > 3 else ''} were refused: another owner exported spans "
                "of those traces first, and a trace is recorded for one owner (the token's)")
        for row in rows:
            row["received_at"] = now
        # Sorted by key (stable: a span sent twice keeps its first copy first), like the
        # whole-trace insert: requests inserting some of the same spans then wait for each other
        # on the primary key in one order, never in a cycle.
        new = store_spans(s, sorted(rows, key=_key))
        _lock_traces(s, {t for t, _ in new}, exclusive=False)
    outcome.new = len(new)
    traces = {t for t, _ in new}
    refused = Refusals()
    if traces:
        # The rows just stored are handed on rather than read back.
        fresh = set(new)
        known = {key: row for key, row in firsts.items() if key in fresh}
        written, settled = process_traces(db, traces, now, quiet_seconds, known,
                                          settle_seconds=settle_seconds, refused=refused)
        outcome.runs_written += written
        traces -= settled
    mine = refused.keys & set(new)
    if mine:
        outcome.rejected += len(mine)
        outcome.messages += refused.messages
    if traces:
        late = _mark_late(db, traces, set(new) - mine, force=False)
        if late:
            outcome.rejected += late
            outcome.messages.append(f"{late} span(s) arrived after the run they belong to "
                                    "was recorded; they are kept but not recorded")
    return outcome


def _traces_of_other_owners(session: Session, owner_id: str, trace_ids: set[str]) -> set[str]:
    """The traces among these that hold spans another owner exported. A trace's runs belong to
    the owner of the token that exported it: spans of another owner would join that owner's
    run tree (and a re-export of the same span ids by another owner would be a silent
    duplicate), so they are refused instead. Not serialised against another owner storing the
    first spans of the same trace at the same instant (the trace ids of two owners do not meet
    unless one propagates its context to the other)."""
    if not trace_ids:
        return set()
    if dialect.name(session) == "postgresql":  # one primary-key probe per trace (_per_trace)
        return set(session.execute(_OTHER_OWNERS, {"ids": sorted(trace_ids),
                                                   "owner": owner_id}).scalars())
    return set(session.execute(
        select(OtlpSpan.trace_id).distinct()
        .where(OtlpSpan.trace_id.in_(trace_ids), OtlpSpan.owner_id != owner_id)).scalars())


_OTHER_OWNERS = text(
    "SELECT t.id FROM unnest(CAST(:ids AS text[])) AS t(id) WHERE EXISTS "
    "(SELECT 1 FROM otlp_span AS s WHERE s.trace_id = t.id AND s.owner_id <> :owner)")


def _key(row: dict) -> tuple[str, str]:
    return row["trace_id"], row["span_id"]


def _first_copies(rows: list[dict]) -> dict[tuple[str, str], dict]:
    firsts: dict[tuple[str, str], dict] = {}
    for row in rows:
        firsts.setdefault(_key(row), row)
    return firsts


# --- an export of whole new traces: its spans stored already claimed -----------------------------
#
# The usual export (a BatchSpanProcessor's, a framework's at the end of a run) carries whole
# traces that nothing stored yet. Their trees are built from the export alone, and the spans go
# in already marked with their runs, in the transaction that writes the runs: no commit of
# unclaimed spans, no read-back, no claim. If any span of those traces turns out to be stored
# already (a re-export, a trace split across exports), that transaction rolls back and the export
# takes the general path.
#
# Two requests storing spans of one trace must not both miss the other: the general path reads
# a trace after committing its spans, so it sees spans committed before; a whole-trace write
# makes its spans visible only with its runs. So storing a span takes a lock on its trace until
# commit: shared on the general path, exclusive on this one, taken after the spans are inserted
# and before they are counted. A general-path span that committed before the count is counted
# (this export steps aside); one that did not yet commit waits for the whole-trace write, and its
# own request then finds the recorded run and reports the span as late.


def _whole_traces(rows: dict[tuple[str, str], dict]) -> list[tuple[_Node, int]] | None:
    """The run trees of an export whose every span belongs to a tree it holds in full (each top
    agent span's chain reaches its trace's root), each with its trace's number of spans; None
    when some span would be left waiting."""
    by_trace: dict[str, list[_Span]] = defaultdict(list)
    for row in rows.values():
        by_trace[row["trace_id"]].append(_Span(**row))
    trees: list[tuple[_Node, int]] = []
    for spans in by_trace.values():
        built = _trees(spans, quiet=False)
        used = {span.span_id for top in built for node in _nodes(top)
                for span in (node.row, *node.content)}
        if len(used) != len(spans):
            return None
        trees += [(top, len(spans)) for top in built]
    return trees or None


def _write_whole_traces(db: Database, rows: dict[tuple[str, str], dict],
                        trees: list[tuple[_Node, int]]) -> int | None:
    """Store the spans of whole new traces already claimed, with their runs, in one transaction;
    the runs written, or None (nothing written) when a span of those traces is stored already."""
    with db.read(primary=True) as s:
        now = dialect.now(s)
        if any(_stored_counts(s, {top.row.trace_id for top, _ in trees}).values()):
            return None  # a re-export, or the rest of a trace: not new
        known = _read_known(s, trees)
    run_of = {(node.row.trace_id, span.span_id): node.run_id for top, _ in trees
              for node in _nodes(top) for span in (node.row, *node.content)}
    # Sorted by key, as on the general path (no waiting in a cycle on the primary key).
    claimed = [{**row, "received_at": now, "run_id": run_of[key]}
               for key, row in sorted(rows.items())]

    def store_claimed(s: Session, _trees) -> bool:
        if len(store_spans(s, claimed)) != len(claimed):
            return False
        _lock_traces(s, {row["trace_id"] for row in claimed}, exclusive=True)
        return True

    return _write_trees(db, trees, known, claim=store_claimed) or None


_TRACE_LOCKS = 0x6F746C70  # the advisory lock space of trace ids ("otlp"), two-key form
_LOCK_SHARED = text("SELECT count(pg_advisory_xact_lock_shared(:space, k)) "
                    "FROM unnest(CAST(:keys AS integer[])) AS k")
_LOCK_EXCLUSIVE = text("SELECT count(pg_advisory_xact_lock(:space, k)) "
                       "FROM unnest(CAST(:keys AS integer[])) AS k")


def _lock_traces(session: Session, trace_ids: set[str], *, exclusive: bool) -> None:
    """Hold these traces' locks until commit (PostgreSQL; SQLite's writers are serialised
    already). Keys in ascending order, so lockers never wait for each other in a cycle; two
    traces sharing a key only wait needlessly."""
    if not trace_ids or dialect.name(session) != "postgresql":
        return
    keys = sorted({zlib.crc32(t.encode()) - 2**31 for t in trace_ids})
    session.execute(_LOCK_EXCLUSIVE if exclusive else _LOCK_SHARED,
                    {"space": _TRACE_LOCKS, "keys": keys})


def flush_quiet_traces(db: Database, *, quiet_seconds: float = DEFAULT_QUIET_SECONDS,
                       settle_seconds: float = 0.0, limit: int = 100) -> int:
    """Traces quiet for ``quiet_seconds`` whose top agent span never showed its parent: write
    their top agent spans as root runs; spans left over are marked not recorded. With
    ``settle_seconds``, first every trace quiet for that long: its complete trees, which
    ``receive_spans`` left waiting. Returns the number of runs written (the reconciler loop
    calls this)."""
    written = _flush_settled(db, settle_seconds, quiet_seconds, limit) if settle_seconds > 0 else 0
    with db.read(primary=True) as s:
        now = dialect.now(s)
        cutoff = now - timedelta(seconds=quiet_seconds)
        waiting = s.execute(
            select(OtlpSpan.trace_id).where(OtlpSpan.run_id.is_(None))
            .group_by(OtlpSpan.trace_id)
            .having(func.max(OtlpSpan.received_at) <= cutoff).limit(limit)
        ).scalars().all()
    for trace_id in waiting:
        written += process_trace(db, trace_id, now, quiet_seconds, force=True)
    if waiting:
        _mark_late(db, set(waiting), set(), force=True)
    return written


def _flush_settled(db: Database, settle_seconds: float, quiet_seconds: float,
                   page_size: int) -> int:
    """The complete trees of every trace with spans waiting that received nothing for
    ``settle_seconds``, a page of traces per transaction. Every such trace is looked at in each
    pass (a trace still missing its root is looked at again until it is quiet), so that a
    trace waiting for its root never holds back one that is ready."""
    written, after = 0, ""
    while True:
        with db.read(primary=True) as s:
            now = dialect.now(s)
            page = s.execute(
                select(OtlpSpan.trace_id)
                .where(OtlpSpan.run_id.is_(None), OtlpSpan.trace_id > after)
                .group_by(OtlpSpan.trace_id)
                .having(func.max(OtlpSpan.received_at)
                        <= now - timedelta(seconds=settle_seconds))
                .order_by(OtlpSpan.trace_id).limit(page_size)
            ).scalars().all()
        if not page:
            return written
        written += process_traces(db, set(page), now, quiet_seconds,
                                  settle_seconds=settle_seconds)[0]
        after = page[-1]
