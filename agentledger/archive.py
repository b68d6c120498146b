"""``agentledger archive`` and ``agentledger verify --archive``: the retention entry points."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tqdm import tqdm

from agentledger.core.archive_format import ArchiveWriter, read_archive, verify_archive
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
    bar = tqdm(unit="tree", desc="archive", file=sys.stderr)
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


def verify_archive_command(settings: Settings, archive: str) -> int:
    path = Path(archive)
    if not path.exists():
        print(f"no archive file {path}", file=sys.stderr)
        return 2
    run_ids = [r["run"]["id"] for r in read_archive(path)]
    db = Database.from_settings(settings)
    try:
        with db.read() as s:
            heads = archived_heads(s, run_ids) or {}
    finally:
        db.dispose()
    checked, problems = verify_archive(path, heads)
    for problem in problems:
        print(f"TAMPERED run {problem.run_id} seq {problem.seq}: {problem.problem}")
    verdict = "OK" if not problems else f"{len(problems)} damaged run(s)"
    print(f"{verdict}: {checked} archived runs checked in {path}")
    return 0 if not problems else 1
