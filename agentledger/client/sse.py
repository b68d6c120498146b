"""A small Server-Sent Events reader over ``httpx``'s decoded lines (the HTML standard's
format: ``field: value`` lines, ``:`` comments, a blank line dispatches the block)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field


@dataclass
class Frame:
    id: str | None = None
    event: str | None = None
    data: list[str] = field(default_factory=list)


class EventStreamParser:
    """Fed one line at a time; ``feed`` returns each complete frame that carries data. A block
    cut off by a dropped connection (no closing blank line) is never returned.

    ``retry_ms``: the latest ``retry:`` hint (the pause the server asks for before a reconnect),
    None until one arrives; ``comments``: how many ``:`` comments (keep-alives) arrived."""

    def __init__(self) -> None:
        self.retry_ms: int | None = None
        self.comments = 0
        self._current = Frame()

    def feed(self, line: str) -> Frame | None:
        line = line.rstrip("\r\n")
        if line == "":
            done, self._current = self._current, Frame()
            return done if done.data else None
        if line.startswith(":"):
            self.comments += 1
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._current.data.append(value)
        elif name == "id" and "\x00" not in value:
            self._current.id = value
        elif name == "event":
            self._current.event = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry_ms = int(value)
        return None


def frames(lines: Iterable[str]) -> Iterator[Frame]:
    """Each complete frame of ``lines`` that carries data."""
    parser = EventStreamParser()
    for line in lines:
        frame = parser.feed(line)
        if frame is not None:
            yield frame
