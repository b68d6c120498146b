"""``agentledger archive`` and ``agentledger verify --archive``: the retention entry points."""

from __future__ import annotations

import gzip
import os
import secrets
import sys
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from agentledger.core.archive_format import ArchiveWriter, archive_time_text, read_archive
from agentledger.core.config import Settings, shown_url
from agentledger.core.database import Database
from agentledger.core.event_partitions import drop_empty_partitions
from agentledger.core.evidence_format import (
    MALFORMED,
    EvidenceProblem,
    gap_notes,
    legacy_gaps,
    malformed,
    message_problems,
    run_problems,
    tree_problems,
)
from agentledger.core.progress import progress
from ingest.retention import (
    archivable_roots,
    delete_trees,
    export_trees,
    prunable_otlp_traces,
    prune_otlp_spans,
)
from queries import archived_runs


def archive_command(settings: Settings, *, older_than_days: float, out: str, batch_size: int,
                    dry_run: bool) -> int:
    """``agentledger archive``: 0 when done; 2, before anything is read or deleted, when
    ``out`` cannot hold archive files (one line on stderr), or when the file cannot be written
    (nothing of the batch that failed is deleted; earlier batches are in the file)."""
    from agentledger.core.migrate import upgrade

    if older_than_days < 0 or batch_size < 1:
        raise SystemExit("--older-than-days must be ≥ 0 and --batch-size ≥ 1")
    if not dry_run:  # a dry run writes nothing
        unusable = _unusable_directory(Path(out))
        if unusable is not None:
            print(f"agentledger: cannot write archives into {out}: {unusable}", file=sys.stderr)
            return 2
    upgrade(settings.database_url)
    db = Database.from_settings(settings)
    cutoff = datetime.now(UTC) - timedelta(days=older_than_days)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    # The random part keeps archive runs started in the same second (on one host or on several
    # sharing the directory) in files of their own.
    path = Path(out) / f"agentledger-archive-{stamp}-{secrets.token_hex(3)}.jsonl.gz"
    trees = runs = 0
    writer = None
    bar = None
    try:
        with db.read(primary=True) as s:
            # The bar's total (trees ending meanwhile may add a few); a dry run's whole answer.
            due = len(archivable_roots(s, finished_before=cutoff, limit=None))
        if not dry_run:
            bar = progress(due, unit="tree", desc="archive")
            while True:
                with db.write() as s:
                    roots = archivable_roots(s, finished_before=cutoff, limit=batch_size,
                                             claim=True)
                    if not roots:
                        break
                    records = export_trees(s, roots)
                    try:
                        writer = writer or ArchiveWriter(path)
                        writer.write(records)
                    except OSError as exc:  # the transaction rolls back: nothing deleted
                        raise _CannotWrite(exc) from None
                    runs += delete_trees(s, records, str(path))
                trees += len(roots)
                bar.update(len(roots))
        # After the trees: an OTLP trace's spans go once its runs have left the live tables.
        spans, traces = _prune_otlp(db, cutoff, batch_size, dry_run)
        dropped = [] if dry_run else _drop_emptied_partitions(db)
    except _CannotWrite as exc:
        failed: OSError | None = exc.args[0]
    else:
        failed = None
    finally:
        if bar is not None:
            bar.close()
        if writer is not None:
            writer.close()
        db.dispose()
    if failed is not None:  # said once the bar is closed, as the last line
        done = (f" ({trees} run tree(s), {runs} run(s) were archived into it before)"
                if trees else " (nothing was archived)")
        reason = (failed.strerror or str(failed)).lower()
        print(f"agentledger: cannot write archive file {path}: {reason}{done}", file=sys.stderr)
        return 2
    if dry_run:
        print(f"{due} run tree(s) ended before {cutoff.isoformat()} would be archived")
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


class _CannotWrite(Exception):
    """The archive file could not be created or written (its ``OSError`` is ``args[0]``)."""


def _unusable_directory(out: Path) -> str | None:
    """Why archive files cannot be written into ``out`` (made, with its parents, if missing),
    or None."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        return "it exists and is not a directory"
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()
    if not os.access(out, os.W_OK | os.X_OK):
        return "permission denied"
    return None


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


# Runs looked up in archived_run per statement, as the file is read.
_LOOKUP_BATCH = 1000

_WITHOUT_DATABASE = (
    "not checked that the file holds every run archived into it (a run tree removed whole, or "
    "the file cut short between two trees, goes unseen without it), nor each run's chain head "
    "against the one the database recorded when it archived the run")


def verify_archive_command(settings: Settings, archive: str, *,
                           use_database: bool | None = None) -> int:
    """``agentledger verify --archive FILE``: 0 when every check made passed (a ``NOTE`` says
    which checks were not made and why), 1 when one did not (a ``TAMPERED`` line per problem),
    2 when the file cannot be read as an archive or the database cannot be used.

    The file is checked on its own: each record with the evidence bundle's per-run rules
    (``agentledger.core.evidence_format``: its chain, its row against its hashed events, its
    snapshots, its question and answer), each run once, each tree whole. With a database (by
    default when ``AGENTLEDGER_DATABASE_URL`` is set: the ledger that wrote the file) also
    against what it recorded when it archived (``archived_run``): every run it archived into
    this file is in it, and each run's chain head is the one recorded then. Without one the
    file is checked on its own, offline.
    """
    path = Path(archive)
    if use_database is None:
        use_database = bool(os.environ.get("AGENTLEDGER_DATABASE_URL"))
    try:  # the whole file is readable before anything is judged, or a database opened
        total = sum(1 for _ in _archive_records(path))
    except UnreadableArchive as exc:
        print(f"agentledger: cannot read archive file {path}: {exc}", file=sys.stderr)
        return 2
    check = _FileCheck()
    db = None
    if use_database:
        settings.check_database(schema=True, writes=False)  # a check only reads: never migrates
        db = Database.from_settings(settings)
    else:
        check.notes.append("the database was not consulted (AGENTLEDGER_DATABASE_URL is not "
                           f"set): {_WITHOUT_DATABASE}")
    bar = progress(total, unit="run", desc="verify")
    try:
        with db.read(primary=True, transaction=True) if db else nullcontext() as session:
            if session is not None:
                where = shown_url(settings.database_url)
                if archived_runs.archived_anything(session):
                    check.ledger = _Ledger(session, path, check.problems, check.notes)
                else:
                    check.notes.append(f"the database at {where} has archived nothing: "
                                       f"{_WITHOUT_DATABASE}")
            for number, record in enumerate(_archive_records(path), start=1):
                check.add(number, record)
                bar.update()
            check.finish()
    except UnreadableArchive as exc:  # changed since the first pass
        print(f"agentledger: cannot read archive file {path}: {exc}", file=sys.stderr)
        return 2
    finally:
        bar.close()
        if db is not None:
            db.dispose()
    for problem in check.problems:
        print(f"TAMPERED {problem}")
    for note in check.notes:
        print(f"NOTE {note}")
    checked = f"{check.runs} archived runs, {check.events} events checked in {path}"
    if not check.problems:
        print(f"OK: {checked}")
        return 0
    damaged = len({p.run_id for p in check.problems})
    print(f"{len(check.problems)} problem(s) in {damaged} run(s): {checked}")
    return 1


class _FileCheck:
    """The checks of one archive file, record by record as it is read: each record's own
    (the bundle's per-run rules), each run once, each run tree whole and its records together
    (the archive writes whole trees, one after the other), and, with ``ledger``, what the
    database recorded. Holds one tree's records at a time and the ids of the runs seen."""

    def __init__(self) -> None:
        self.ledger: _Ledger | None = None
        self.problems: list[EvidenceProblem] = []
        self.notes: list[str] = []
        self.runs = self.events = 0
        self.seen: set[str] = set()
        self.gaps: Counter[str] = Counter()
        self.with_context = 0
        self.tree: dict[str, dict[str, Any]] = {}
        self.tree_root: str | None = None
        self.tree_whole = True  # False when a record of it is malformed: its links are not judged
        self.trees_done: set[str] = set()

    def add(self, number: int, record: dict[str, Any]) -> None:
        self.runs += 1
        run = record["run"]
        rid = run["id"]
        if rid in self.seen:
            self.problems.append(EvidenceProblem(rid, None, f"record {number} holds this run "
                                                            "again (a file holds each run once)"))
            return
        self.seen.add(rid)
        whole = True
        try:
            self.events += len(record["events"])
            self.problems += run_problems(record, time_text=archive_time_text)
            self.problems += message_problems(record)
            self.gaps.update(legacy_gaps(record))
            pack = run.get("context_pack_snapshot")  # a malformed pack is reported above
            self.with_context += bool(isinstance(pack, dict) and pack.get("items"))
        except MALFORMED as exc:
            self.problems.append(EvidenceProblem(rid, None, f"malformed record: {malformed(exc)}"))
            whole = False
        self._join_tree(rid, record, whole)
        if self.ledger is not None:
            self.ledger.add(rid, run)

    def _join_tree(self, rid: str, record: dict[str, Any], whole: bool) -> None:
        run = record["run"]
        root = run.get("root_run_id") if isinstance(run.get("root_run_id"), str) else rid
        # A record continues the tree being read when it names its root or a parent in it
        # (so a record whose root_run_id was edited is judged within its tree).
        if root != self.tree_root and run.get("parent_run_id") not in self.tree:
            self._close_tree()
            if root in self.trees_done:
                self.problems.append(EvidenceProblem(
                    rid, None, f"a record of tree {root} apart from the others (an archive "
                               "writes each tree's records one after the other)"))
            self.tree_root = root
        self.tree[rid] = record
        self.tree_whole = self.tree_whole and whole

    def _close_tree(self) -> None:
        if self.tree and self.tree_root is not None:
            if self.tree_whole:
                try:
                    found = tree_problems(self.tree, self.tree_root, holder="the file")
                except MALFORMED as exc:
                    found = [EvidenceProblem(None, None, f"malformed tree: {malformed(exc)}")]
                self.problems += [p if p.run_id is not None
                                  else EvidenceProblem(self.tree_root, p.seq, p.problem)
                                  for p in found]
            self.trees_done.add(self.tree_root)
        self.tree, self.tree_root, self.tree_whole = {}, None, True

    def finish(self) -> None:
        self._close_tree()
        if self.ledger is not None:
            self.ledger.finish(self.seen)
        self.notes += gap_notes(self.gaps, one_answer=False)
        if self.with_context:
            self.notes.append(
                f"the context items of {self.with_context} run(s) are checked against their "
                "packs' pack_hash and run.queued only: archive files do not hold their content "
                "(the ledger keeps it)")


class _Ledger:
    """What the database recorded of the runs it archived (``archived_run``: the file each
    went to and its chain head then), against the file as it is read: a run's head must be
    the recorded one, every run must be recorded (or still live, a copy left by an archive
    whose deletion did not commit), and every run recorded into this file must be in it.

    This file is known by its name: the database recorded the path the archive was written to,
    and the file may have moved since. When no recorded path ends in this file's name, the
    file was renamed: it is taken to be the file most of its runs were recorded into."""

    def __init__(self, session: Session, path: Path, problems: list[EvidenceProblem],
                 notes: list[str]):
        self.session, self.path, self.problems, self.notes = session, path, problems, notes
        self.names = archived_runs.archive_files_named(session, path.name)
        self.waiting: dict[str, tuple[Any, Any]] = {}
        self.recorded_into: Counter[str] = Counter()  # the file each run was recorded into
        self.unknown: list[str] = []
        self.copies_of_live = 0

    def add(self, rid: str, run: dict[str, Any]) -> None:
        self.waiting[rid] = (run.get("last_event_seq"), run.get("last_event_hash"))
        if len(self.waiting) >= _LOOKUP_BATCH:
            self._look_up()

    def _look_up(self) -> None:
        if not self.waiting:
            return
        ids = list(self.waiting)
        recorded = archived_runs.recorded_archives(self.session, ids)
        live = archived_runs.live_heads(self.session,
                                        [rid for rid in ids if rid not in recorded])
        for rid, head in self.waiting.items():
            if rid not in recorded:
                if live.get(rid) == head:
                    self.copies_of_live += 1
                elif rid in live:
                    self.problems.append(EvidenceProblem(
                        rid, None, "the run is still in the database, with another chain head "
                                   f"(seq {live[rid][0]})"))
                else:
                    self.unknown.append(rid)
                continue
            archive_file, (seq, chain) = recorded[rid]
            self.recorded_into[archive_file] += 1
            if (seq, chain) != head:
                self.problems.append(EvidenceProblem(
                    rid, None, "the run differs from what was archived: the database recorded "
                               f"its chain head as seq {seq}, hash {chain[:16]}…"))
        self.waiting = {}

    def finish(self, seen: set[str]) -> None:
        self._look_up()
        if not self.names and self.recorded_into:
            name, _ = self.recorded_into.most_common(1)[0]
            self.names = {name}
            self.notes.append(f"the database recorded this file as {name} (renamed since): "
                              "checked against what it archived there")
        if not self.recorded_into and self.unknown and not self.names:
            self.problems.append(EvidenceProblem(
                self.unknown[0], None, f"the database archived none of the file's "
                                       f"{len(self.unknown)} run(s) (is it the ledger that "
                                       "wrote this file?)"))
        else:
            self.problems += [EvidenceProblem(rid, None, "the database has no record of "
                                                         "archiving this run")
                              for rid in self.unknown]
        elsewhere = sum(n for name, n in self.recorded_into.items() if name not in self.names)
        if elsewhere:
            files = ", ".join(sorted(n for n in self.recorded_into if n not in self.names))
            self.notes.append(f"{elsewhere} run(s) of this file were archived into another "
                              f"file ({files}); their chains are the ones recorded then (a copy "
                              "left by an archive whose deletion did not commit)")
        if self.copies_of_live:
            self.notes.append(f"{self.copies_of_live} run(s) of this file are still in the "
                              "database, with the same chains (a copy left by an archive whose "
                              "deletion did not commit; the next archive moves them)")
        if not self.names:
            return
        for rid, archive_file in archived_runs.runs_archived_into(self.session, self.names):
            if rid not in seen:
                self.problems.append(EvidenceProblem(
                    rid, None, "missing: the database recorded it as archived into "
                               f"this file ({archive_file})"))
