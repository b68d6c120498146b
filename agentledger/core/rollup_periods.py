"""The periods the outcome rollups sum runs by, and how long the minute rollup is kept.

Three tables hold the same sums: per UTC day (kept for ever), per UTC hour (kept for ever) and
per UTC minute (kept ``MINUTE_ROLLUP_KEPT``). A window reads whole days, then whole hours of
its partial days, then whole minutes of its partial hours, and scans runs only for the partial
minutes at its edges. Minutes are kept for two days only: a busy agent has a row per minute
and status, a month of them would outgrow the runs they sum, and the windows people ask for
most (the last hour, six hours, a day) start within that span. A window starting earlier scans
its partial hour run by run instead.

Writers add a run to the minute rollup when it was created at most ``MINUTE_ROLLUP_KEPT``
before the moment they write; the reconciler loop deletes the minutes older than that. Readers
use minute rows only from ``MINUTE_READ_MARGIN`` later, so a reader whose clock is ahead of a
writer's or a pruner's (by less than the margin) never reads a minute that was not kept.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

MINUTE_ROLLUP_KEPT = timedelta(days=2)
MINUTE_READ_MARGIN = timedelta(hours=1)


def day_of(moment: datetime) -> date:
    return moment.astimezone(UTC).date()


def hour_of(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def minute_of(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


def minutes_kept_from(now: datetime) -> datetime:
    """The oldest creation time a writer adds to the minute rollup at ``now``; the pruner
    deletes the minutes before it."""
    return now.astimezone(UTC) - MINUTE_ROLLUP_KEPT


def minutes_readable_from(now: datetime) -> datetime:
    """The oldest moment from which a reader at ``now`` finds every minute row kept."""
    return minutes_kept_from(now) + MINUTE_READ_MARGIN
