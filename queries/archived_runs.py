"""What the ledger recorded of the runs it archived (``archived_run``): the file each went to
and its chain head then, what ``agentledger verify --archive`` holds a file against."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import PurePath

from sqlalchemy import select
from sqlalchemy.orm import Session

from agentledger.core.schema import AgentRun, ArchivedRun

Head = tuple[int, str]  # a run's chain head: (last_event_seq, last_event_hash)


def archived_anything(session: Session) -> bool:
    return session.execute(select(ArchivedRun.run_id).limit(1)).first() is not None


def archive_files_named(session: Session, name: str) -> set[str]:
    """The recorded archive paths whose file name is ``name`` (the file may have moved since
    it was written, so it is known by its name)."""
    return {path for path in session.execute(
        select(ArchivedRun.archive_file).distinct()
        .where(ArchivedRun.archive_file.endswith(name, autoescape=True))).scalars()
        if PurePath(path).name == name}


def recorded_archives(session: Session, run_ids: list[str]) -> dict[str, tuple[str, Head]]:
    """Of ``run_ids``, those recorded as archived: run id → (the file, the head then)."""
    return {row.run_id: (row.archive_file, (row.last_event_seq, row.last_event_hash))
            for row in session.execute(
                select(ArchivedRun.run_id, ArchivedRun.archive_file, ArchivedRun.last_event_seq,
                       ArchivedRun.last_event_hash).where(ArchivedRun.run_id.in_(run_ids)))}


def live_heads(session: Session, run_ids: list[str]) -> dict[str, Head]:
    """Of ``run_ids``, those still in the ledger's live tables: run id → its head now."""
    if not run_ids:
        return {}
    return {row.id: (row.last_event_seq, row.last_event_hash) for row in session.execute(
        select(AgentRun.id, AgentRun.last_event_seq, AgentRun.last_event_hash)
        .where(AgentRun.id.in_(run_ids)))}


def runs_archived_into(session: Session, files: set[str]) -> Iterator[tuple[str, str]]:
    """(run id, file) of every run recorded as archived into one of ``files``, in the order
    they were archived, streamed."""
    for row in session.execute(
            select(ArchivedRun.run_id, ArchivedRun.archive_file)
            .where(ArchivedRun.archive_file.in_(sorted(files)))
            .order_by(ArchivedRun.archived_at, ArchivedRun.root_run_id, ArchivedRun.run_id)
            .execution_options(yield_per=5000)):
        yield row.run_id, row.archive_file


def archived_run(session: Session, run_id: str) -> dict | None:
    """Where a run that left the live tables went: ``{"run_id", "root_run_id", "archived_at",
    "archive_file_name"}``, or None for a run never archived. The file's name only: where it
    was written says something of the server's disk, and the file may have moved since."""
    row = session.execute(
        select(ArchivedRun.root_run_id, ArchivedRun.archived_at, ArchivedRun.archive_file)
        .where(ArchivedRun.run_id == run_id)).first()
    if row is None:
        return None
    return {"run_id": run_id, "root_run_id": row.root_run_id, "archived_at": row.archived_at,
            "archive_file_name": PurePath(row.archive_file).name}


def archived_run_sentence(record: dict) -> str:
    """``archived_run``'s answer as the sentence a reader of the API or the dashboards gets."""
    tree = ("" if record["root_run_id"] == record["run_id"]
            else f" with its tree (root {record['root_run_id']})")
    return (f"run {record['run_id']} was archived on {record['archived_at']:%Y-%m-%d %H:%M} UTC"
            f"{tree} into {record['archive_file_name']}; `agentledger verify --archive` checks "
            "that file")
