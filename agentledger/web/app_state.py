"""Per-process state every request handler needs (API and dashboards alike): settings, database,
notifier. Installed on the Flask app by ``create_app``."""

from __future__ import annotations

from dataclasses import dataclass

from flask import current_app

from agentledger.core.config import Settings
from agentledger.core.database import Database
from agentledger.core.notifier import EventNotifier


@dataclass
class AppState:
    settings: Settings
    db: Database
    notifier: EventNotifier


def state() -> AppState:
    return current_app.extensions["agentledger"]
