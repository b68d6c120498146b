"""Evidence bundles: one answer with its whole run tree, and their offline verification.

A bundle is one JSON document (``docs/evidence.md`` describes every field). ``verify_bundle``
needs nothing but the document: it recomputes every event chain with the same code that checks
archive files (``archive_format.verify_record``), then the snapshots' content hashes, the tree's
parent/child links, and that the answer is its run's final message with the text whose digest
its ``run.completed`` recorded (``content_sha256``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agentledger.core.archive_format import verify_record
from agentledger.core.hashing import (
    agent_content_hash,
    context_pack_hash,
    input_sha256,
    sha256_hex,
)

FORMAT = "agentledger-evidence"
FORMAT_VERSION = 1

# Which terminal event ends a run in which status.
_ENDINGS = {"run.completed": "succeeded", "run.failed": "failed", "run.cancelled": "cancelled",
            "run.interrupted": "interrupted"}


@dataclass(frozen=True)
class EvidenceProblem:
    """``run_id`` and ``seq`` name where it broke (``seq`` None for a snapshot or a link)."""

    run_id: str | None
    seq: int | None
    problem: str

    def __str__(self) -> str:
        where = "bundle" if self.run_id is None else f"run {self.run_id}"
        if self.seq is not None:
            where += f" seq {self.seq}"
        return f"{where}: {self.problem}"


@dataclass(frozen=True)
class BundleReport:
    runs_checked: int
    events_checked: int
    problems: list[EvidenceProblem]
    # What the bundle cannot prove although nothing in it is wrong (said, not counted as a
    # problem): an answer recorded before the ledger bound answers' texts into their chains.
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


def _snapshot_problems(run: dict[str, Any], contents: dict[str, str]) -> list[EvidenceProblem]:
    rid, problems = run["id"], []
    agent = run.get("agent_execution_snapshot") or {}
    try:
        recomputed = agent_content_hash(agent["name"], agent["kind"], agent.get("model"),
                                        agent.get("instructions"), agent.get("tools"),
                                        agent.get("params"))
    except (KeyError, TypeError):
        recomputed = None
    if recomputed != agent.get("content_hash"):
        problems.append(EvidenceProblem(
            rid, None, "agent_execution_snapshot: content_hash does not match its content"))
    if (agent.get("agent_id"), agent.get("version")) != (run.get("agent_id"), run.get("agent_version")):
        problems.append(EvidenceProblem(
            rid, None, f"agent_execution_snapshot is of agent {agent.get('agent_id')} "
                       f"v{agent.get('version')}, but the run ran {run.get('agent_id')} "
                       f"v{run.get('agent_version')}"))
    pack = run.get("context_pack_snapshot") or {}
    items = pack.get("items")
    if not isinstance(items, list) or context_pack_hash(items) != pack.get("pack_hash"):
        problems.append(EvidenceProblem(
            rid, None, "context_pack_snapshot: pack_hash does not match its items"))
        return problems
    for item in items:
        content = contents.get(item.get("sha256"))
        if content is None:
            problems.append(EvidenceProblem(
                rid, None, f"context_pack_snapshot: content of item {item.get('id')!r} is missing"))
        elif sha256_hex(content) != item.get("sha256"):
            problems.append(EvidenceProblem(
                rid, None, f"context item {item.get('id')!r}: sha256 does not match its content"))
    return problems


def _run_problems(record: dict[str, Any], heads: dict[str, Any]) -> list[EvidenceProblem]:
    run, events = record["run"], record["events"]
    rid = run["id"]
    broken = verify_record(record)
    if broken is not None:
        return [EvidenceProblem(rid, broken.seq, broken.problem)]
    problems = []
    head = heads.get(rid) or {}
    if (head.get("last_event_seq"), head.get("last_event_hash")) != (
            run["last_event_seq"], run["last_event_hash"]):
        problems.append(EvidenceProblem(rid, run["last_event_seq"],
                                        "chain head in heads does not match the run"))
    first = events[0] if events else None
    if first is None or first["type"] != "run.queued":
        problems.append(EvidenceProblem(rid, 1, "the first event is not run.queued"))
    else:
        queued = first["data"]
        for key in ("agent_id", "session_id", "parent_run_id"):
            if queued.get(key) != run.get(key):
                problems.append(EvidenceProblem(
                    rid, 1, f"run.queued records {key} {queued.get(key)!r}, the run {run.get(key)!r}"))
        recorded = queued.get("input_sha256")
        if recorded is not None and (not isinstance(run.get("input"), str)
                                     or input_sha256(run["input"]) != recorded):
            problems.append(EvidenceProblem(
                rid, 1, "the run's input is not the text its run.queued recorded (input_sha256)"))
    problems += _row_problems(run, events)
    ending = _ENDINGS.get(events[-1]["type"]) if events else None
    if ending is not None and ending != run["status"]:
        problems.append(EvidenceProblem(rid, events[-1]["seq"],
                                        f"ends with {events[-1]['type']} but the run is {run['status']}"))
    return problems


def _row_problems(run: dict[str, Any], events: list[dict[str, Any]]) -> list[EvidenceProblem]:
    """The run row's fields that its hashed events also record: the times of its queueing,
    start and end, the executor that started it and a failed run's error."""
    rid, problems = run["id"], []
    by_type: dict[str, dict[str, Any]] = {}
    for event in events:
        by_type[event["type"]] = event  # the last of each type (one run.started per run)
    terminal = events[-1] if events and events[-1]["type"] in _ENDINGS else None
    expected = {
        "created_at": events[0]["created_at"] if events else None,
        "started_at": by_type.get("run.started", {}).get("created_at"),
        "finished_at": terminal["created_at"] if terminal else None,
    }
    for key, at in expected.items():
        if _moment(run.get(key)) != _moment(at):
            problems.append(EvidenceProblem(rid, None, f"the run's {key} {run.get(key)!r} is not "
                                                       f"its events' {at!r}"))
    started = by_type.get("run.started")
    if started is not None and run.get("executor_instance_id") != started["data"].get(
            "executor_instance_id"):
        problems.append(EvidenceProblem(rid, started["seq"], "the run's executor_instance_id is "
                                                             "not the one run.started recorded"))
    if run.get("status") == "failed" and terminal is not None and (
            run.get("error") != terminal["data"].get("error")):
        problems.append(EvidenceProblem(rid, terminal["seq"],
                                        "the run's error is not the one run.failed recorded"))
    return problems


def _moment(text: Any) -> datetime | None:
    if text is None:
        return None
    return datetime.fromisoformat(str(text).replace("Z", "+00:00"))


def _tree_problems(runs: dict[str, dict[str, Any]], root_id: str) -> list[EvidenceProblem]:
    problems = []
    roots = [rid for rid, r in runs.items() if r["run"]["parent_run_id"] is None]
    if roots != [root_id]:
        problems.append(EvidenceProblem(None, None, f"the tree's root should be {root_id}, "
                                                    f"found roots {roots}"))
    announced: dict[str, str] = {}
    for rid, record in runs.items():
        run = record["run"]
        if run["root_run_id"] != root_id:
            problems.append(EvidenceProblem(rid, None, f"root_run_id is {run['root_run_id']}, "
                                                       f"not the tree's {root_id}"))
        parent = run["parent_run_id"]
        if parent is not None and parent not in runs:
            problems.append(EvidenceProblem(rid, None, f"parent run {parent} is not in the bundle"))
        if parent is not None and parent in runs:
            parent_pack = runs[parent]["run"]["context_pack_snapshot"]
            if run["context_pack_snapshot"] != parent_pack:
                problems.append(EvidenceProblem(
                    rid, None, "context_pack_snapshot differs from its parent's (children "
                               "inherit the parent's pack)"))
        for event in record["events"]:
            if event["type"] == "run.child_created":
                child = event["data"].get("child_run_id")
                announced[child] = rid
                if child not in runs:
                    problems.append(EvidenceProblem(rid, event["seq"],
                                                    f"child run {child} is not in the bundle"))
                elif runs[child]["run"]["parent_run_id"] != rid:
                    problems.append(EvidenceProblem(rid, event["seq"],
                                                    f"child run {child} names another parent"))
    for rid, record in runs.items():
        parent = record["run"]["parent_run_id"]
        if parent is not None and announced.get(rid) != parent:
            problems.append(EvidenceProblem(
                rid, None, f"parent {parent} has no run.child_created event for this run"))
    return problems


def _answer_problems(doc: dict[str, Any], runs: dict[str, dict[str, Any]]) -> list[EvidenceProblem]:
    message = doc.get("message") or {}
    rid = message.get("run_id")
    record = None if rid is None else runs.get(rid)
    if record is None:
        return [EvidenceProblem(None, None, f"the answer's run {rid} is not in the bundle")]
    run, events = record["run"], record["events"]
    problems = []
    last = events[-1] if events else {}
    if message.get("role") != "assistant" or run["status"] != "succeeded":
        problems.append(EvidenceProblem(rid, None, "the answer is not a completed run's answer"))
    if run["final_message_id"] != message.get("id") or (
            last.get("type") != "run.completed"
            or last.get("data", {}).get("final_message_id") != message.get("id")):
        problems.append(EvidenceProblem(rid, last.get("seq"),
                                        f"message {message.get('id')} is not the run's final message"))
    recorded = last.get("data", {}).get("content_sha256")
    content = message.get("content")
    if recorded is not None and (not isinstance(content, str) or sha256_hex(content) != recorded):
        problems.append(EvidenceProblem(rid, last.get("seq"),
                                        "the answer's text is not the text its run recorded "
                                        "(content_sha256)"))
    chat = doc.get("session")
    if chat is not None and (chat.get("id") != message.get("session_id")
                             or chat.get("id") != run["session_id"]):
        problems.append(EvidenceProblem(rid, None, "the session is not the answer's session"))
    return problems


def verify_bundle(doc: Any) -> BundleReport:
    """Every problem of one evidence bundle (an empty list: it verifies)."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return BundleReport(0, 0, [EvidenceProblem(None, None, f"not an {FORMAT} document")])
    if doc.get("format_version") != FORMAT_VERSION:
        return BundleReport(0, 0, [EvidenceProblem(
            None, None, f"format_version {doc.get('format_version')!r} is not {FORMAT_VERSION}")])
    try:
        runs = {record["run"]["id"]: record for record in doc["runs"]}
        heads = doc["heads"]
        contents = doc.get("context_contents") or {}
        problems: list[EvidenceProblem] = []
        if len(runs) != len(doc["runs"]):
            problems.append(EvidenceProblem(None, None, "a run appears twice"))
        for record in doc["runs"]:
            problems += _run_problems(record, heads)
            problems += _snapshot_problems(record["run"], contents)
        for rid in sorted(set(heads) - set(runs)):
            problems.append(EvidenceProblem(rid, None, "heads names a run the bundle does not hold"))
        problems += _tree_problems(runs, doc["root_run_id"])
        problems += _answer_problems(doc, runs)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        return BundleReport(0, 0, [EvidenceProblem(None, None, f"malformed bundle: {exc!r}")])
    events = sum(len(r["events"]) for r in doc["runs"])
    return BundleReport(len(runs), events, problems, _notes(doc, runs))


def _notes(doc: dict[str, Any], runs: dict[str, dict[str, Any]]) -> tuple[str, ...]:
    """What older runs leave uncovered: texts recorded before the ledger bound them."""
    notes = []
    rid = (doc.get("message") or {}).get("run_id")
    record = runs.get(rid) if isinstance(rid, str) else None
    last = record["events"][-1] if record and record["events"] else {}
    if last.get("type") == "run.completed" and "content_sha256" not in last.get("data", {}):
        notes.append("the answer's text is not covered by the chain: its run was recorded "
                     "before answers carried content_sha256 (the streamed message.delta texts "
                     "are)")
    older = [r for r, rec in runs.items()
             if rec["events"] and "input_sha256" not in rec["events"][0].get("data", {})]
    if older:
        notes.append(f"the input of {len(older)} run(s) is not covered by the chain: recorded "
                     "before run.queued carried input_sha256")
    return tuple(notes)
