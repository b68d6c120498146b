"""``agentledger archive`` and ``agentledger verify --archive``: the retention entry points."""

from __future__ import annotations

import gzip
import sys
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tqdm import tqdm

from agentledger.core.archive_format import (
    ArchiveProblem,
    ArchiveWriter,
    read_archive,
    verify_record,
)
from agentledger.core.config import Settings
from agentledger.core.database import Database
from agentledger.core.event_partitions import drop_empty_partitions
from ingest.retention import (
    archivable_roots,
    delete_trees,
    export_trees,
    prunable_otlp_traces,
    prune_otlp_spans,
)
from queries.archived_runs import archived_heads


def archive_command(settings: Settings, *, older_than_days: float, out: str, batch_size: int,
                    dry_run: bool) -> int:
    from agentledger.core.migrate import upgrade

    if older_than_days < 0 or batch_size < 1:
        raise SystemExit("--older-than-days must be ≥ 0 and --batch-size ≥ 1")
    upgrade(settings.database_url)
    db = Database.from_settings(settings)
    cutoff = datetime.now(UTC) - timedelta(days=older_than_days)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = Path(out) / f"agentledger-archive-{stamp}.jsonl.gz"
    trees = runs = 0
    writer = None
    # A dry run only counts, at once: a bar would stay empty.
    bar = tqdm(unit="tree", desc="archive", file=sys.stderr, disable=dry_run)
    try:
        while True:
            with db.write() as s:
                roots = archivable_roots(s, finished_before=cutoff, limit=batch_size)
                if not roots or dry_run:
                    if dry_run:
                        trees = len(archivable_roots(s, finished_before=cutoff, limit=None))
                    break
                records = export_trees(s, roots)
                writer = writer or ArchiveWriter(path)
                writer.write(records)
                runs += delete_trees(s, records, str(path))
            trees += len(roots)
            bar.update(len(roots))
        # After the trees: an OTLP trace's spans go once its runs have left the live tables.
        spans, traces = _prune_otlp(db, cutoff, batch_size, dry_run)
        dropped = [] if dry_run else _drop_emptied_partitions(db)
    finally:
        bar.close()
        if writer is not None:
            writer.close()
        db.dispose()
    if dry_run:
        print(f"{trees} run tree(s) ended before {cutoff.isoformat()} would be archived")
        print(f"{traces} OTLP trace(s) have buffered spans that can be pruned now")
    elif trees:
        print(f"archived {trees} run tree(s), {runs} run(s) into {path}")
    else:
        print(f"nothing ended before {cutoff.isoformat()}; no archive written")
    if not dry_run and spans:
        print(f"pruned {spans} buffered OTLP span(s) of {traces} trace(s)")
    if dropped:
        print(f"dropped {len(dropped)} emptied run_event partition(s): {', '.join(dropped)}")
    return 0


def _drop_emptied_partitions(db: Database) -> list[str]:
    """PostgreSQL: past months whose every run is archived give their partition back at once."""
    with db.write() as s:
        return drop_empty_partitions(s.connection())


def _prune_otlp(db: Database, cutoff: datetime, batch_size: int, dry_run: bool) -> tuple[int, int]:
    """(spans deleted, traces) of the OTLP buffer; for a dry run, (0, traces that would be)."""
    spans = traces = 0
    after = ""
    while True:
        with db.write() as s:
            if dry_run:
                return 0, len(prunable_otlp_traces(s, received_before=cutoff, limit=None))
            found = prunable_otlp_traces(s, received_before=cutoff, limit=batch_size,
                                         after=after)
            spans += prune_otlp_spans(s, found, received_before=cutoff)
        traces += len(found)
        if len(found) < batch_size:
            return spans, traces
        after = found[-1]


class UnreadableArchive(Exception):
    """The file is no archive this command can read: missing, not gzip, cut short, or not
    JSON lines of run records."""


def _archive_records(path: Path) -> Iterator[dict[str, Any]]:
    """The records of ``path``; whatever keeps the file from being read as an archive raises
    ``UnreadableArchive``. A record's own fields are the verifier's to judge."""
    number = 0
    try:
        for number, record in enumerate(read_archive(path), start=1):
            run = record.get("run") if isinstance(record, dict) else None
            if not isinstance(run, dict) or not isinstance(run.get("id"), str):
                raise UnreadableArchive(f"record {number} is not a run record")
            yield record
    except gzip.BadGzipFile:
        after = f" after record {number}" if number else ""
        raise UnreadableArchive(f"not gzip data{after} (archives are .jsonl.gz files)") from None
    except OSError as exc:
        raise UnreadableArchive((exc.strerror or str(exc)).lower()) from None
    except (EOFError, zlib.error) as exc:
        after = f" after record {number}" if number else ""
        raise UnreadableArchive(f"the compressed data is broken{after}: {exc}") from None
    except ValueError as exc:  # not UTF-8, not JSON
        raise UnreadableArchive(f"record {number + 1} is not a JSON line: {exc}") from None


def verify_archive_command(settings: Settings, archive: str) -> int:
    path = Path(archive)
    try:
        run_ids = [record["run"]["id"] for record in _archive_records(path)]
    except UnreadableArchive as exc:
        print(f"agentledger: cannot read archive file {path}: {exc}", file=sys.stderr)
        return 2
    settings.check_database(schema=True)
    db = Database.from_settings(settings)
    try:
        with db.read() as s:
            heads = archived_heads(s, run_ids) or {}
    finally:
        db.dispose()
    checked, problems = 0, []
    try:
        for record in _archive_records(path):
            checked += 1
            problem = _record_problem(record, heads.get(record["run"]["id"]))
            if problem is not None:
                problems.append(problem)
    except UnreadableArchive as exc:  # changed since the first pass
        print(f"agentledger: cannot read archive file {path}: {exc}", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"TAMPERED run {problem.run_id} seq {problem.seq}: {problem.problem}")
    verdict = "OK" if not problems else f"{len(problems)} damaged run(s)"
    print(f"{verdict}: {checked} archived runs checked in {path}")
    return 0 if not problems else 1


def _record_problem(record: dict[str, Any], head: tuple[int, str] | None
                    ) -> ArchiveProblem | None:
    """``verify_record``'s verdict; a record whose fields are missing or of the wrong type is
    damaged too (as a malformed evidence bundle is), not a reason to stop checking the rest."""
    try:
        return verify_record(record, head)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        return ArchiveProblem(record["run"]["id"], 0, f"malformed record: {exc!r}")
