"""Archive files: gzip-compressed JSON lines, one run per line, and their verification.

Each line holds the run row, its messages and its events with their stored hashes, so the file
alone proves its history: ``verify_archive`` recomputes every chain from the genesis hash and
compares it with the events' hashes and the run's recorded head (and, when given a database,
with the head recorded in ``archived_run`` at archiving time).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from agentledger.core.hashing import GENESIS_HASH, event_hash


class ArchiveWriter:
    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = gzip.open(path, "at", encoding="utf-8")
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


def verify_record(record: dict[str, Any], recorded_head: tuple[int, str] | None = None
                  ) -> ArchiveProblem | None:
    """The first problem of one run's record (``{"run": {...}, "events": [...]}``), or None.

    Recomputes the chain from the genesis hash: seqs 1, 2, 3… with no gap, each event's
    ``hash`` (and its ``previous_hash`` when the record carries one, as evidence bundles do),
    and the run's head (``last_event_seq``, ``last_event_hash``). Shared by archive files and
    evidence bundles, so the two can never verify differently.
    """
    run = record["run"]
    chain, expected = GENESIS_HASH, 0
    for event in record["events"]:
        expected += 1
        if event["seq"] != expected:
            return ArchiveProblem(run["id"], expected,
                                  f"event seq {expected} is missing (found seq {event['seq']})")
        if "previous_hash" in event and event["previous_hash"] != chain:
            return ArchiveProblem(run["id"], expected,
                                  "previous_hash does not match the hash of the event before")
        chain = event_hash(chain, run["id"], event["seq"], event["type"], event["data"],
                           datetime.fromisoformat(event["created_at"]))
        if chain != event["hash"]:
            return ArchiveProblem(run["id"], event["seq"], "hash does not match the event")
    head = (run["last_event_seq"], run["last_event_hash"])
    if expected != head[0]:
        missing = min(expected, head[0]) + 1
        return ArchiveProblem(run["id"], missing,
                              f"run records {head[0]} events but {expected} are present")
    if chain != head[1]:
        return ArchiveProblem(run["id"], expected, "chain head does not match the run record")
    if recorded_head is not None and tuple(recorded_head) != head:
        return ArchiveProblem(run["id"], expected, "run differs from what was archived")
    return None


def verify_archive(path: Path, recorded_heads: dict[str, tuple[int, str]] | None = None
                   ) -> tuple[int, list[ArchiveProblem]]:
    """(runs checked, problems) for one archive file."""
    problems, runs = [], 0
    for record in read_archive(path):
        runs += 1
        head = (recorded_heads or {}).get(record["run"]["id"])
        problem = verify_record(record, head)
        if problem is not None:
            problems.append(problem)
    return runs, problems
