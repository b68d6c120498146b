"""How the executor's and the reconciler's loops tell of failures: database errors told apart
(and never quoted: a driver's message carries SQL text and parameters), and a retrying loop's
log kept to a line when a failure starts, a reminder while it lasts and a line when it passes."""

from __future__ import annotations

import logging
import sqlite3
import time

import psycopg
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

log = logging.getLogger("agentledger.executor")


# What the database layer raises when the database fails (SQLAlchemy, and the drivers' own
# errors that reach the code unwrapped).
_DATABASE_ERRORS = (SQLAlchemyError, psycopg.Error, sqlite3.Error)


def database_failure(exc: BaseException) -> BaseException | None:
    """The database error ``exc`` is or comes from (its ``__cause__`` / ``__context__`` chain,
    and the members of an exception group), or None.

    Such an error escaping a run's agent is no bug of the agent's, even when agent code wrapped
    it in its own: the executor's writes for the run (the events the agent emits, its
    children, its end) or the database itself failed. The executor can then no longer record
    the run, so it lets go of it, as of a lost lease; the reconciler ends it at its lease's
    expiry. Its message is never recorded: a driver's error carries the statement's SQL text
    and parameters."""
    pending: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, _DATABASE_ERRORS):
            return current
        pending.extend(getattr(current, "exceptions", ()) if isinstance(current, BaseExceptionGroup)
                       else ())
        pending.extend((current.__cause__, current.__context__))
    return None


def error_name(error: BaseException) -> str:
    """The error's type, and the driver's under SQLAlchemy's, without the message (which
    carries SQL text and parameters)."""
    name = type(error).__name__
    orig = error.orig if isinstance(error, DBAPIError) else None
    if orig is None:
        return name
    return f"{name} ({type(orig).__module__}.{type(orig).__qualname__})"


class Failing:
    """The log of a loop that retries what failed: the first failure, then a reminder at most
    every ``REMIND_SECONDS`` while it goes on, then one line when it works again (a server down
    for a minute is a few lines, not one traceback per second)."""

    REMIND_SECONDS = 30.0

    def __init__(self, what: str, logger: logging.Logger = log):
        self.what = what
        self.log = logger
        self.since: float | None = None
        self.told = 0.0
        self.count = 0

    def failed(self, reason: str, *, with_traceback: bool = False) -> None:
        now = time.monotonic()
        self.count += 1
        if self.since is None:
            self.since = self.told = now
            self.log.warning("%s failed (%s); retrying", self.what, reason, exc_info=with_traceback)
        elif now - self.told >= self.REMIND_SECONDS:
            self.told = now
            self.log.warning("%s still failing after %.0f s and %d tries (%s); retrying", self.what,
                        now - self.since, self.count, reason, exc_info=with_traceback)

    def passed(self) -> None:
        if self.since is not None:
            self.log.warning("%s succeeded again after %.0f s", self.what,
                        time.monotonic() - self.since)
            self.since, self.count = None, 0

    def failed_with(self, exc: BaseException) -> None:
        """``failed`` for an exception: a database's error by its type only (its message holds
        SQL text and parameters), a ledger error by its code and sentence, anything else with
        its traceback."""
        from agentledger.core.errors import LedgerError

        if isinstance(exc, LedgerError):
            self.failed(f"{exc.code}: {exc.message}")
        elif (found := database_failure(exc)) is not None:
            self.failed(f"the database failed: {error_name(found)}")
        else:
            self.failed(f"{type(exc).__name__}: {exc}", with_traceback=True)
