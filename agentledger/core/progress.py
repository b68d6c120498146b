"""Progress of a long command (``archive``, ``verify --archive``, ``demo seed``) on stderr.

On a terminal it is tqdm's bar, redrawn in place. Anywhere else (a log file, cron's mail, a CI
log, a pipe) a redrawn bar is a line of carriage returns nobody can read, so the command writes
a plain line instead once every ``LINE_EVERY_SECONDS`` while it works, and a last one when it
ends, if it wrote any: a command that ends within the interval writes nothing here, and what it
prints on stdout says what it did.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm

LINE_EVERY_SECONDS = 10.0


class LineProgress:
    """``tqdm``'s ``update`` / ``close`` as a plain line now and then (see the module)."""

    def __init__(self, total: int | None, *, unit: str, desc: str, file: TextIO,
                 every: float | None = None) -> None:
        self.total, self.unit, self.desc, self.file = total, unit, desc, file
        self.every = LINE_EVERY_SECONDS if every is None else every
        self.n = 0
        self._started = self._last = time.monotonic()
        self._wrote = self._closed = False

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._last >= self.every:
            self._last = now
            self._line(now)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._wrote:
                self._line(time.monotonic(), done=True)

    def _line(self, now: float, *, done: bool = False) -> None:
        elapsed = now - self._started
        of = f" of {self.total:,}" if self.total is not None else ""
        share = f" ({self.n / self.total:.0%})" if self.total else ""
        rate = f", {self.n / elapsed:,.0f} {self.unit}s/s" if elapsed > 0 else ""
        state = "done in" if done else "after"
        print(f"{self.desc}: {self.n:,}{of} {self.unit}s{share} {state} {elapsed:,.0f} s{rate}",
              file=self.file, flush=True)
        self._wrote = True

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


def progress(total: int | None, *, unit: str, desc: str, enabled: bool = True,
             file: TextIO | None = None) -> tqdm | LineProgress:
    """A progress reporter with ``update(n)`` and ``close()`` (also a context manager): a bar
    on a terminal, plain lines elsewhere, nothing at all when not ``enabled``."""
    stream: TextIO = file if file is not None else sys.stderr
    if not enabled:
        return tqdm(total=total, disable=True)
    if stream.isatty():
        return tqdm(total=total, unit=unit, desc=desc, file=stream)
    return LineProgress(total, unit=unit, desc=desc, file=stream)
