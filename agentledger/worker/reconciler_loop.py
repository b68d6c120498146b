"""The reconciler loop: runs whose executor vanished end ``interrupted``; nothing is re-run.

Safe to run in any number of processes at once (``serve``, every ``worker``, or
``agentledger reconcile``): each run is handled in its own short transaction that re-checks the
condition under the run's row lock. The loop also keeps the ledger's housekeeping going: event
partitions made ahead, rate-limit windows pruned, quiet OTLP traces written, and the outcome
rollups' shard rows of past periods folded (``ingest.rollup.fold_settled_shards``) and their
minutes no longer kept deleted (``ingest.rollup.prune_minutes``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session

from agentledger.core.config import Settings
from agentledger.core.database import Database
from agentledger.core.errors import LedgerError
from agentledger.core.event_partitions import ensure_partitions
from agentledger.worker.failures import Failing
from ingest.otlp import flush_quiet_traces
from ingest.rate_limits import prune_windows
from ingest.reconcile import (
    expired_lease_run_ids,
    interrupt_if_lease_expired,
    interrupt_if_orphaned,
    orphaned_child_run_ids,
)
from ingest.rollup import FOLD_BATCH, PRUNE_BATCH, fold_settled_shards, prune_minutes

log = logging.getLogger("agentledger.worker.reconciler_loop")
# Partitions are made months ahead (db upgrade makes them too); hourly is plenty to never miss one.
PARTITION_CHECK_SECONDS = 3600.0
# Folding the rollups' shard rows: an hour's rows wait at most this long after FOLD_GRACE.
FOLD_SECONDS = 300.0


@dataclass(frozen=True)
class ReconcileResult:
    lease_expired: int
    parent_terminal: int


def reconcile_once(db: Database, *, limit: int = 500) -> ReconcileResult:
    """One pass over expired leases, then over queued children of ended parents."""
    with db.read(primary=True) as s:
        expired = expired_lease_run_ids(s, limit=limit)
    ended = 0
    for run_id in expired:
        try:
            with db.write() as s:
                ended += interrupt_if_lease_expired(s, run_id)
        except LedgerError as exc:  # another writer ended it first
            log.debug("run %s not interrupted: %s", run_id, exc.message)
        except Exception:  # noqa: BLE001 - one run that cannot end must not hold up the others
            log.exception("run %s could not be interrupted; the pass goes on", run_id)
    with db.read(primary=True) as s:
        orphans = orphaned_child_run_ids(s, limit=limit)
    orphaned = 0
    for run_id in orphans:
        try:
            with db.write() as s:
                orphaned += interrupt_if_orphaned(s, run_id)
        except LedgerError as exc:
            log.debug("run %s not interrupted: %s", run_id, exc.message)
        except Exception:  # noqa: BLE001 - as above
            log.exception("run %s could not be interrupted; the pass goes on", run_id)
    with db.write() as s:
        prune_windows(s)
    if ended or orphaned:
        log.info("reconciled: %d lease(s) expired, %d orphaned child run(s)", ended, orphaned)
    return ReconcileResult(ended, orphaned)


def _in_steps(db: Database, step: Callable[[Session], int], batch: int) -> int:
    """``step`` in its own write transaction until it does less than ``batch`` rows (a long
    backlog, after an upgrade, goes in short steps that never hold the embedded database's
    single writer for long); returns the rows done."""
    done = 0
    while True:
        with db.write() as s:
            rows = step(s)
        done += rows
        if rows < batch:
            return done


def prune_rollup_minutes(db: Database) -> int:
    """Delete the minute rollup's rows older than the minutes kept, ``PRUNE_BATCH`` rows per
    transaction; returns the rows deleted."""
    pruned = _in_steps(db, prune_minutes, PRUNE_BATCH)
    if pruned:
        log.info("deleted %d minute rollup row(s) older than the minutes kept", pruned)
    return pruned


def fold_rollup_shards(db: Database) -> int:
    """Fold the outcome rollups' shard rows of past days, hours and minutes, ``FOLD_BATCH``
    rows of each table per transaction; returns the rows folded."""
    folded = _in_steps(db, fold_settled_shards, FOLD_BATCH)
    if folded:
        log.info("folded %d outcome rollup shard row(s)", folded)
    return folded


class ReconcilerThread(threading.Thread):
    """Runs ``reconcile_once`` every ``reconcile_seconds`` until ``stop()``."""

    def __init__(self, db: Database, settings: Settings):
        super().__init__(name="agentledger-reconciler", daemon=True)
        self.db = db
        self.interval = settings.reconcile_seconds
        self.otlp_quiet_seconds = settings.otlp_quiet_seconds
        self.otlp_settle_seconds = settings.otlp_settle_seconds
        self._stop_event = threading.Event()

    def run(self) -> None:
        partitions_checked = folded = None
        # A database that is down fails every task of every pass: one line each when it
        # starts and when it passes, not a traceback (with SQL text) per task and pass.
        partitions = Failing("making run_event partitions", log)
        passes = Failing("the reconcile pass", log)
        traces = Failing("writing waiting OTLP traces", log)
        rollups = Failing("pruning or folding the outcome rollups", log)
        while not self._stop_event.is_set():
            if partitions_checked is None or time.monotonic() - partitions_checked > PARTITION_CHECK_SECONDS:
                try:
                    with self.db.write() as s:
                        ensure_partitions(s.connection())
                    partitions_checked = time.monotonic()
                    partitions.passed()
                except Exception as exc:  # noqa: BLE001 - e.g. a lock not granted in time: next period
                    partitions.failed_with(exc)
            try:
                reconcile_once(self.db)
                passes.passed()
            except Exception as exc:  # noqa: BLE001 - a database hiccup must not kill the loop
                passes.failed_with(exc)
            try:
                flush_quiet_traces(self.db, quiet_seconds=self.otlp_quiet_seconds,
                                   settle_seconds=self.otlp_settle_seconds)
                traces.passed()
            except Exception as exc:  # noqa: BLE001 - as above
                traces.failed_with(exc)
            if folded is None or time.monotonic() - folded > FOLD_SECONDS:
                try:
                    prune_rollup_minutes(self.db)
                    fold_rollup_shards(self.db)
                    folded = time.monotonic()
                    rollups.passed()
                except Exception as exc:  # noqa: BLE001 - as above
                    rollups.failed_with(exc)
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()


def run_reconciler(settings: Settings, *, once: bool) -> int:
    """``agentledger reconcile [--once]``."""
    import signal

    from agentledger.core.migrate import upgrade

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    upgrade(settings.database_url)
    db = Database.from_settings(settings)
    try:
        if once:
            result = reconcile_once(db)
            print(f"interrupted {result.lease_expired} run(s) with expired leases, "
                  f"{result.parent_terminal} orphaned child run(s)")
            print(f"deleted {prune_rollup_minutes(db)} minute rollup row(s) older than the "
                  "minutes kept")
            print(f"folded {fold_rollup_shards(db)} outcome rollup shard row(s)")
            recorded = flush_quiet_traces(db, quiet_seconds=settings.otlp_quiet_seconds,
                                          settle_seconds=settings.otlp_settle_seconds)
            print(f"recorded {recorded} run(s) from waiting OTLP traces")
            return 0
        thread = ReconcilerThread(db, settings)
        signal.signal(signal.SIGTERM, lambda *_: thread.stop())
        print(f"reconciling every {settings.reconcile_seconds:g}s; Ctrl-C to stop", flush=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.5)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        db.dispose()
