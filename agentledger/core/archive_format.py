"""Archive files: gzip-compressed JSON lines, one run per line, and the check of their chains.

Each line holds the run row, its messages and its events with their stored hashes, so the file
alone proves its history. ``verify_record`` is the chain rule shared with evidence bundles: it
recomputes a run's chain from the genesis hash and compares it with the events' hashes and the
run's recorded head. The rest of what ``agentledger verify --archive`` checks of a record is the
bundle's per-run rules (``agentledger.core.evidence_format``); what it checks of the file as a
whole (each run once, whole trees, every run the database archived into it) is in
``agentledger.archive``.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agentledger.core.hashing import GENESIS_HASH, event_hash


class ArchiveWriter:
    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        # A file of its own ("x": never one that exists): two writers appending gzip streams to
        # one file would interleave their bytes and leave both unreadable.
        self._file = gzip.open(path, "xt", encoding="utf-8")
        self.lines = 0

    def write(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            self._file.write(json.dumps(record, separators=(",", ":"), ensure_ascii=False))
            self._file.write("\n")
            self.lines += 1
        # Flushed to the OS before the database deletion commits: a crash leaves the run in
        # both places (harmless), never in neither.
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_archive(path: Path) -> Iterator[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


@dataclass(frozen=True)
class ArchiveProblem:
    run_id: str
    seq: int
    problem: str


def archive_time_text(moment: datetime) -> str:
    """How an archive file writes a time (``ingest.retention.export_trees``): ISO 8601 in UTC,
    ``+00:00``, with the microseconds unless they are zero."""
    return moment.astimezone(UTC).isoformat()


def verify_record(record: dict[str, Any], *, time_text: Callable[[datetime], str]
                  ) -> ArchiveProblem | None:
    """The first problem of one run's record (``{"run": {...}, "events": [...]}``), or None.

    Recomputes the chain from the genesis hash: seqs 1, 2, 3… with no gap, each event's
    ``hash`` (and its ``previous_hash`` when the record carries one, as evidence bundles do),
    and the run's head (``last_event_seq``, ``last_event_hash``). An event's ``created_at`` must
    be exactly the text its format writes for that moment (``time_text``: an archive's
    ``archive_time_text``, a bundle's the text the hash covers, ``hashing.timestamp_text``): the
    hash covers the moment, so the same moment spelt another way would otherwise go unnoticed.
    Shared by archive files and evidence bundles, so the two can never verify differently.
    """
    run = record["run"]
    chain, expected = GENESIS_HASH, 0
    for event in record["events"]:
        expected += 1
        if event["seq"] != expected:
            return ArchiveProblem(run["id"], expected,
                                  f"event seq {expected} is missing (found seq {event['seq']!r})")
        if "previous_hash" in event and event["previous_hash"] != chain:
            return ArchiveProblem(run["id"], expected,
                                  "previous_hash does not match the hash of the event before")
        written = event["created_at"]
        try:
            moment = datetime.fromisoformat(written) if isinstance(written, str) else None
        except ValueError:
            moment = None
        if moment is None or moment.tzinfo is None:
            return ArchiveProblem(run["id"], expected,
                                  f"created_at {written!r} is not a time with its UTC offset")
        if time_text(moment) != written:
            return ArchiveProblem(run["id"], expected,
                                  f"created_at {written!r} is not written as the ledger wrote "
                                  f"it ({time_text(moment)!r})")
        chain = event_hash(chain, run["id"], event["seq"], event["type"], event["data"], moment)
        if chain != event["hash"]:
            return ArchiveProblem(run["id"], event["seq"], "hash does not match the event")
    head = (run["last_event_seq"], run["last_event_hash"])
    if expected != head[0]:
        missing = min(expected, head[0]) + 1
        return ArchiveProblem(run["id"], missing,
                              f"run records {head[0]} events but {expected} are present")
    if chain != head[1]:
        return ArchiveProblem(run["id"], expected, "chain head does not match the run record")
    return None
