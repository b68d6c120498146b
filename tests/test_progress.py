"""Progress of long commands: a bar on a terminal, plain lines in a log (``core.progress``)."""

from __future__ import annotations

import io
import re

from tqdm import tqdm

from agentledger.core.progress import LineProgress, progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_plain_lines_now_and_then_and_one_at_the_end():
    log = io.StringIO()
    with progress(5, unit="tree", desc="archive", file=log) as bar:
        assert isinstance(bar, LineProgress)
        bar.every = 0.0  # every update is due: one line each
        bar.update(2)
        bar.update(3)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 3, lines
    assert re.fullmatch(r"archive: 2 of 5 trees \(40%\) after \d+ s, [\d,]+ trees/s", lines[0])
    assert lines[1].startswith("archive: 5 of 5 trees (100%) after ")
    assert lines[2].startswith("archive: 5 of 5 trees (100%) done in ")


def test_a_command_shorter_than_the_interval_writes_nothing_to_a_log():
    log = io.StringIO()
    bar = progress(1_000, unit="run", desc="verify", file=log)
    for _ in range(1_000):
        bar.update(1)
    bar.close()
    bar.close()
    assert log.getvalue() == ""


def test_lines_without_a_total_say_what_was_done():
    log = io.StringIO()
    bar = LineProgress(None, unit="run", desc="demo seed", file=log, every=0.0)
    bar.update(1_234)
    bar.close()
    first = log.getvalue().splitlines()[0]
    assert re.fullmatch(r"demo seed: 1,234 runs after \d+ s, [\d,]+ runs/s", first), first


def test_a_terminal_gets_a_bar_and_a_disabled_reporter_writes_nowhere():
    screen = Terminal()
    with progress(3, unit="run", desc="verify", file=screen) as bar:
        assert isinstance(bar, tqdm)
        bar.update(3)
    assert "verify" in screen.getvalue() and "3/3" in screen.getvalue()
    quiet = Terminal()
    with progress(3, unit="run", desc="verify", enabled=False, file=quiet) as bar:
        bar.update(3)
    assert quiet.getvalue() == ""
