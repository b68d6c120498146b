"""Evidence bundles: one answer with its whole run tree, and their offline verification.

A bundle is one JSON document (``docs/evidence.md`` describes every field). ``verify_bundle``
needs nothing but the document.

The per-run rules live here once, for evidence bundles and archive files alike
(``agentledger verify --archive`` applies them to every record of a file):

- ``run_problems``: a run record against itself. Its event chain (``archive_format.
  verify_record``, the code that checks archive files), its row against the hashed events that
  record the same facts (``run.queued``'s agent, session, parent and the digests of its input and
  of both frozen snapshots; the times, executor, status, error and final message of the events
  that set them), and its snapshots against their own content hashes;
- ``answer_problems``: an answer message against the run that produced it (its
  ``run.completed`` names it and recorded the digest of its text);
- ``message_problems``: the messages an archive record carries with its run (its question and
  its answer);
- ``tree_problems``: a run tree's links (one root, every parent present, every child announced
  by its parent's ``run.child_created``, children's packs inherited);
- ``legacy_gaps`` and ``gap_notes``: what runs recorded before the ledger wrote a digest cannot
  prove (said as a note, not counted as a problem).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agentledger.core.archive_format import verify_record
from agentledger.core.hashing import (
    agent_content_hash,
    context_pack_hash,
    input_sha256,
    sha256_hex,
    snapshot_sha256,
    timestamp_text,
)
from agentledger.core.vocabulary import NON_TERMINAL

FORMAT = "agentledger-evidence"
FORMAT_VERSION = 1

# Which terminal event ends a run in which status.
_ENDINGS = {"run.completed": "succeeded", "run.failed": "failed", "run.cancelled": "cancelled",
            "run.interrupted": "interrupted"}

# The digests run.queued records of the run's frozen snapshots, and the columns they bind.
SNAPSHOT_DIGESTS = (("agent_snapshot_sha256", "agent_execution_snapshot"),
                    ("context_pack_sha256", "context_pack_snapshot"))

# What a malformed document or record raises while its fields are read.
MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError)


def malformed(exc: Exception) -> str:
    """What a malformed record or document lacks, as a sentence (not Python's words for it)."""
    if isinstance(exc, KeyError):
        return f"the field {exc.args[0]!r} is missing"
    if isinstance(exc, IndexError):
        return "a list is shorter than the format needs"
    return f"a value is not of the type the format has ({exc})"


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
    # problem): runs recorded before the ledger bound their texts and snapshots into their chains.
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


# ---- one run -----------------------------------------------------------------------------------


def run_problems(record: dict[str, Any], *, time_text, contents: Mapping[str, str] | None = None,
                 heads: Mapping[str, Any] | None = None) -> list[EvidenceProblem]:
    """Every problem of one run record (``{"run": {...}, "events": [...]}``) on its own.

    ``time_text``: how the record's format writes an event's time (a bundle's is the text the
    hash covers, ``hashing.timestamp_text``; an archive's ``archive_format.archive_time_text``).
    ``contents``: the context items' contents by sha256, when the format carries them (bundles);
    None skips that check. ``heads``: a bundle's ``heads``, whose entry for this run must repeat
    the run's recorded head.
    """
    run, events = record["run"], record["events"]
    rid = run["id"]
    broken = verify_record(record, time_text=time_text)
    if broken is not None:
        # The events are not what the ledger hashed: nothing below could rely on them.
        problems = [EvidenceProblem(rid, broken.seq, broken.problem)]
    else:
        problems = []
        if heads is not None:
            head = heads.get(rid) or {}
            if (head.get("last_event_seq"), head.get("last_event_hash")) != (
                    run["last_event_seq"], run["last_event_hash"]):
                problems.append(EvidenceProblem(rid, run["last_event_seq"],
                                                "chain head in heads does not match the run"))
        problems += _queued_problems(run, events)
        problems += _row_problems(run, events)
    return problems + _snapshot_problems(run, contents)


def _queued_problems(run: dict[str, Any], events: list[dict[str, Any]]) -> list[EvidenceProblem]:
    """The row against its hashed ``run.queued``: agent, session, parent, and the digests of
    its input and of both frozen snapshots (when the run was recorded with them)."""
    rid = run["id"]
    first = events[0] if events else None
    if first is None or first["type"] != "run.queued":
        return [EvidenceProblem(rid, 1, "the first event is not run.queued")]
    queued, problems = first["data"], []
    for key in ("agent_id", "session_id", "parent_run_id"):
        if queued.get(key) != run.get(key):
            problems.append(EvidenceProblem(
                rid, 1, f"run.queued records {key} {queued.get(key)!r}, the run {run.get(key)!r}"))
    recorded = queued.get("input_sha256")
    if recorded is not None and (not isinstance(run.get("input"), str)
                                 or input_sha256(run["input"]) != recorded):
        problems.append(EvidenceProblem(
            rid, 1, "the run's input is not the text its run.queued recorded (input_sha256)"))
    for key, column in SNAPSHOT_DIGESTS:
        recorded = queued.get(key)
        if recorded is not None and snapshot_sha256(run.get(column)) != recorded:
            problems.append(EvidenceProblem(
                rid, 1, f"the run's {column} is not the snapshot its run.queued recorded ({key})"))
    return problems


def _row_problems(run: dict[str, Any], events: list[dict[str, Any]]) -> list[EvidenceProblem]:
    """The run row's fields that its hashed events also record: its status, the times of its
    queueing, start and end, the executor that started it, a failed run's error and a
    completed run's final message (and no error or final message on any other run)."""
    rid, problems = run["id"], []
    by_type: dict[str, dict[str, Any]] = {}
    for event in events:
        by_type[event["type"]] = event  # the last of each type (one run.started per run)
    terminal = events[-1] if events and events[-1]["type"] in _ENDINGS else None
    if terminal is not None and _ENDINGS[terminal["type"]] != run["status"]:
        problems.append(EvidenceProblem(rid, terminal["seq"],
                                        f"ends with {terminal['type']} but the run is "
                                        f"{run['status']}"))
    elif terminal is None and run["status"] not in NON_TERMINAL:
        problems.append(EvidenceProblem(rid, None, f"the run is {run['status']!r} but its chain "
                                                   "has no terminal event"))
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
    elif started is None and run.get("executor_instance_id") is not None:
        problems.append(EvidenceProblem(rid, None, "the run has an executor_instance_id but no "
                                                   "run.started"))
    for column, ending, key in (("error", "run.failed", "error"),
                                ("final_message_id", "run.completed", "final_message_id")):
        recorded = terminal["data"].get(key) if terminal and terminal["type"] == ending else None
        if run.get(column) == recorded:
            continue
        if terminal is not None and terminal["type"] == ending:
            problem = f"the run's {column} is not the one {ending} recorded"
        else:
            problem = f"the run has {column} {run.get(column)!r} but did not end with {ending}"
        problems.append(EvidenceProblem(rid, terminal["seq"] if terminal else None, problem))
    return problems


def _moment(text: Any) -> datetime | None:
    if text is None:
        return None
    return datetime.fromisoformat(str(text).replace("Z", "+00:00"))


def _snapshot_problems(run: dict[str, Any], contents: Mapping[str, str] | None
                       ) -> list[EvidenceProblem]:
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
    if contents is None:  # the format does not carry the contents (archive files)
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


# ---- messages ----------------------------------------------------------------------------------


def answer_problems(record: dict[str, Any], message: Mapping[str, Any] | None
                    ) -> list[EvidenceProblem]:
    """An answer message against the run that produced it: the run succeeded and its row and
    its last event, ``run.completed`` (hashed), name the message; the message's text is the one
    whose digest ``run.completed`` recorded (``content_sha256``), its session the run's and its
    time the time of ``run.completed``. ``message`` None: the answer is missing."""
    run, events = record["run"], record["events"]
    rid = run["id"]
    last = events[-1] if events else {}
    if message is None:
        return [EvidenceProblem(rid, last.get("seq"), f"the run's answer, message "
                                                      f"{run.get('final_message_id')}, is missing")]
    problems = []
    if message.get("role") != "assistant" or run["status"] != "succeeded":
        problems.append(EvidenceProblem(rid, None, "the answer is not a completed run's answer"))
    if run["final_message_id"] != message.get("id") or (
            last.get("type") != "run.completed"
            or last.get("data", {}).get("final_message_id") != message.get("id")):
        problems.append(EvidenceProblem(rid, last.get("seq"),
                                        f"message {message.get('id')} is not the run's final message"))
        return problems
    recorded = last["data"].get("content_sha256")
    content = message.get("content")
    if recorded is not None and (not isinstance(content, str) or sha256_hex(content) != recorded):
        problems.append(EvidenceProblem(rid, last["seq"],
                                        "the answer's text is not the text its run recorded "
                                        "(content_sha256)"))
    if message.get("session_id") != run.get("session_id"):
        problems.append(EvidenceProblem(rid, None, f"the answer's session_id "
                                                   f"{message.get('session_id')!r} is not the "
                                                   f"run's {run.get('session_id')!r}"))
    if _moment(message.get("created_at")) != _moment(last["created_at"]):
        problems.append(EvidenceProblem(rid, last["seq"], f"the answer's created_at "
                                                          f"{message.get('created_at')!r} is not "
                                                          "the time of its run.completed"))
    return problems


def message_problems(record: dict[str, Any]) -> list[EvidenceProblem]:
    """The messages an archive record carries with its run: its question (a session's root run
    names it, ``user_message_id``: the run's input, session and queueing time) and its answer
    (``answer_problems``), each once, in the run's thread and of its owner; nothing else."""
    run = record["run"]
    rid, problems = run["id"], []
    by_id: dict[str, Mapping[str, Any]] = {}
    for message in record["messages"]:
        if message["id"] in by_id:
            problems.append(EvidenceProblem(rid, None, f"message {message['id']} appears twice"))
        by_id[message["id"]] = message
    question, answer = run.get("user_message_id"), run.get("final_message_id")
    for mid, message in by_id.items():
        if mid not in (question, answer):
            problems.append(EvidenceProblem(rid, None, f"message {mid} is neither the run's "
                                                       "question nor its answer"))
        elif (message.get("thread_id"), message.get("owner_id")) != (run.get("thread_id"),
                                                                     run.get("owner_id")):
            problems.append(EvidenceProblem(rid, None, f"message {mid} is not in the run's "
                                                       "thread or not its owner's"))
    if question is not None:
        asked = by_id.get(question)
        if asked is None:
            problems.append(EvidenceProblem(rid, None, f"the run's question, message {question}, "
                                                       "is missing"))
        elif (asked.get("role"), asked.get("content"), asked.get("session_id")) != (
                "user", run.get("input"), run.get("session_id")) or (
                _moment(asked.get("created_at")) != _moment(run.get("created_at"))):
            problems.append(EvidenceProblem(rid, None, f"message {question} is not the run's "
                                                       "question (its role, text, session or "
                                                       "time differ from the run's)"))
    events = record["events"]
    if answer is not None or (events and events[-1]["type"] == "run.completed"):
        problems += answer_problems(record, by_id.get(answer) if answer is not None else None)
    return problems


# ---- a tree ------------------------------------------------------------------------------------


def tree_problems(runs: Mapping[str, dict[str, Any]], root_id: str, *,
                  holder: str = "the bundle") -> list[EvidenceProblem]:
    """The links of one whole run tree (``runs``: its records by run id, all of them, as a
    bundle and an archive file hold them; ``holder`` names what holds them)."""
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
            problems.append(EvidenceProblem(rid, None, f"parent run {parent} is not in "
                                                       f"{holder}"))
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
                    problems.append(EvidenceProblem(rid, event["seq"], f"child run {child} is "
                                                                       f"not in {holder}"))
                elif runs[child]["run"]["parent_run_id"] != rid:
                    problems.append(EvidenceProblem(rid, event["seq"],
                                                    f"child run {child} names another parent"))
            elif event["type"] == "run.child_finished":
                # The parent's hashed word for how the child ended: a child record cut short
                # after its end (its row and head rewritten to match) contradicts it.
                child, told = event["data"].get("child_run_id"), event["data"].get("status")
                found = runs[child]["run"]["status"] if child in runs else None
                if found != told:
                    problems.append(EvidenceProblem(
                        rid, event["seq"], f"run.child_finished says child run {child} ended "
                                           f"{told}; {holder} holds it {found or 'not at all'}"))
    for rid, record in runs.items():
        parent = record["run"]["parent_run_id"]
        if parent is not None and announced.get(rid) != parent:
            problems.append(EvidenceProblem(
                rid, None, f"parent {parent} has no run.child_created event for this run"))
    return problems


# ---- what older runs cannot prove --------------------------------------------------------------


def legacy_gaps(record: dict[str, Any]) -> tuple[str, ...]:
    """The digests a run's chain lacks because the ledger recorded it before writing them:
    ``"input"`` (``input_sha256``), ``"snapshots"`` (``agent_snapshot_sha256`` and
    ``context_pack_sha256``), ``"answer"`` (``run.completed``'s ``content_sha256``)."""
    events = record["events"]
    gaps: list[str] = []
    first = events[0] if events else None
    if first is not None and first["type"] == "run.queued" and isinstance(first["data"], dict):
        gaps += queued_gaps(first["data"])
    last = events[-1] if events else None
    if (last is not None and last["type"] == "run.completed" and isinstance(last["data"], dict)
            and answer_gap(last["data"])):
        gaps.append("answer")
    return tuple(gaps)


def queued_gaps(data: dict[str, Any]) -> tuple[str, ...]:
    """What a ``run.queued``'s data lacks of the digests (``legacy_gaps``' names)."""
    gaps = []
    if "input_sha256" not in data:
        gaps.append("input")
    if any(key not in data for key, _ in SNAPSHOT_DIGESTS):
        gaps.append("snapshots")
    return tuple(gaps)


def answer_gap(data: dict[str, Any]) -> bool:
    """Whether a ``run.completed``'s data lacks ``content_sha256``."""
    return "content_sha256" not in data


def gap_notes(counts: Mapping[str, int], *, one_answer: bool,
              snapshots_self_checked: bool = True) -> tuple[str, ...]:
    """The notes of ``legacy_gaps`` counted over runs (``one_answer``: a bundle, whose only
    answer is its message; ``snapshots_self_checked``: whether the check holds each snapshot
    against its own content hash, as the file checks do)."""
    notes = []
    if counts.get("answer"):
        whose = "the answer's text is" if one_answer else \
            f"the answer texts of {counts['answer']} run(s) are"
        notes.append(f"{whose} not covered by the chain: recorded before answers carried "
                     "content_sha256 (the streamed message.delta texts are)")
    if counts.get("input"):
        notes.append(f"the input of {counts['input']} run(s) is not covered by the chain: "
                     "recorded before run.queued carried input_sha256")
    if counts.get("snapshots"):
        notes.append(f"the snapshots of {counts['snapshots']} run(s) are not covered by the "
                     "chain: recorded before run.queued carried agent_snapshot_sha256 and "
                     "context_pack_sha256"
                     + (" (each is still checked against its own content hash)"
                        if snapshots_self_checked else ""))
    return tuple(notes)


# ---- a bundle ----------------------------------------------------------------------------------


def _order_problems(records: list[dict[str, Any]], root_id: str) -> list[EvidenceProblem]:
    """A bundle lists its runs parents before children, the root first."""
    problems = []
    if records and records[0]["run"]["id"] != root_id:
        problems.append(EvidenceProblem(None, None, f"the first run is "
                                                    f"{records[0]['run']['id']}, not the root "
                                                    f"{root_id}"))
    position = {record["run"]["id"]: i for i, record in enumerate(records)}
    for i, record in enumerate(records):
        parent = record["run"]["parent_run_id"]
        if parent is not None and position.get(parent, -1) > i:
            problems.append(EvidenceProblem(record["run"]["id"], None,
                                            f"listed before its parent {parent} (a bundle lists "
                                            "parents before children)"))
    return problems


def _answer_problems(doc: dict[str, Any], runs: dict[str, dict[str, Any]]) -> list[EvidenceProblem]:
    message = doc.get("message") or {}
    rid = message.get("run_id")
    record = runs.get(rid) if isinstance(rid, str) else None
    if record is None:
        return [EvidenceProblem(None, None, f"the answer's run {rid} is not in the bundle")]
    problems = answer_problems(record, message)
    chat = doc.get("session")
    if chat is not None and (chat.get("id") != message.get("session_id")
                             or chat.get("id") != record["run"]["session_id"]):
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
        records = doc["runs"]
        runs = {record["run"]["id"]: record for record in records}
        heads = doc["heads"]
        contents = doc.get("context_contents") or {}
        events = sum(len(record["events"]) for record in records)
    except MALFORMED as exc:
        return BundleReport(0, 0, [EvidenceProblem(None, None, f"malformed bundle: "
                                                               f"{malformed(exc)}")])
    problems: list[EvidenceProblem] = []
    if len(runs) != len(records):
        problems.append(EvidenceProblem(None, None, "a run appears twice"))
    whole = True
    for record in records:
        try:
            problems += run_problems(record, time_text=timestamp_text, contents=contents,
                                     heads=heads)
        except MALFORMED as exc:  # this run cannot be checked; the others still are
            problems.append(EvidenceProblem(record["run"]["id"], None,
                                            f"malformed record: {malformed(exc)}"))
            whole = False
    notes: tuple[str, ...] = ()
    try:
        for rid in sorted(set(heads) - set(runs)):
            problems.append(EvidenceProblem(rid, None, "heads names a run the bundle does not hold"))
        if whole:  # the links read every record's fields
            problems += tree_problems(runs, doc["root_run_id"])
            problems += _order_problems(records, doc["root_run_id"])
            problems += _answer_problems(doc, runs)
            notes = _notes(doc, runs)
    except MALFORMED as exc:
        problems.append(EvidenceProblem(None, None, f"malformed bundle: {malformed(exc)}"))
    return BundleReport(len(runs), events, problems, notes)


def _notes(doc: dict[str, Any], runs: dict[str, dict[str, Any]]) -> tuple[str, ...]:
    """What older runs leave uncovered: texts and snapshots recorded before the ledger bound
    them."""
    answer = (doc.get("message") or {}).get("run_id")
    counts: Counter[str] = Counter()
    for rid, record in runs.items():
        counts.update(gap for gap in legacy_gaps(record) if gap != "answer" or rid == answer)
    return gap_notes(counts, one_answer=True)
