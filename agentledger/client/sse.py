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


def frames(lines: Iterable[str]) -> Iterator[Frame]:
    """Each complete frame that carries data. A block cut off by a dropped connection (no
    closing blank line) is never yielded."""
    current = Frame()
    for line in lines:
        line = line.rstrip("\r\n")
        if line == "":
            if current.data:
                yield current
            current = Frame()
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            current.data.append(value)
        elif name == "id" and "\x00" not in value:
            current.id = value
        elif name == "event":
            current.event = value
