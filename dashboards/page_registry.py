"""Page callbacks, declared once and registered on every Dash app that mounts the pages.

``dash.callback`` would put them in Dash's process-global list, which only the first app of the
process takes; tests (and any process) may build several apps with ``create_app``. A page
declares its callbacks with ``@callback(...)`` (same arguments as ``Dash.callback``) and
``mount_dashboards`` registers every one on its own app. The decorated functions stay plain
functions that tests can call directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CallbackSpec:
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    func: Callable[..., Any]


CALLBACKS: list[CallbackSpec] = []


def callback(*args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def record(func: Callable[..., Any]) -> Callable[..., Any]:
        CALLBACKS.append(CallbackSpec(args, kwargs, func))
        return func

    return record


def register_all(app) -> None:
    for spec in CALLBACKS:
        app.callback(*spec.args, **spec.kwargs)(spec.func)
