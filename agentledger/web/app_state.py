"""Per-process state every request handler needs (API and dashboards alike): settings, database,
notifier. Installed on the Flask app by ``create_app``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from flask import current_app

from agentledger.core.config import Settings
from agentledger.core.database import Database
from agentledger.core.notifier import EventNotifier


class Closable(Protocol):
    def close(self) -> None: ...


@dataclass
class AppState:
    settings: Settings
    db: Database
    notifier: EventNotifier
    # The executor memory routes' connections (``agent_kinds.served_memory.ServedMemory``,
    # which this floor does not import).
    memory: Closable

    def close(self) -> None:
        """End what the state runs beside requests (the notifier, the memory connections);
        the database is its owner's to dispose."""
        self.notifier.stop()
        self.memory.close()


def state() -> AppState:
    return current_app.extensions["agentledger"]
