"""The Agents SDK's ``Session`` of a run on an executor with database access: each method is
the SDK's own ``SQLAlchemySession`` on the ledger database, carried out on the executor's
shared engine (``storage.SdkSessions``) instead of an engine opened for the run.
"""

from __future__ import annotations

from typing import Any

from agents.memory.session import SessionABC
from agents.memory.session_settings import SessionSettings, resolve_session_limit

from agentledger.agent_kinds.storage import SdkSessions


class SharedEngineSession(SessionABC):
    """The session of one run's thread; its calls run on the sessions' event loop thread and
    are awaited on the run's own loop."""

    def __init__(self, sessions: SdkSessions, session_id: str,
                 session_settings: SessionSettings | None = None):
        self.sessions = sessions
        self.session_id = session_id
        self.session_settings = session_settings or SessionSettings()

    async def get_items(self, limit: int | None = None) -> list[Any]:
        limit = resolve_session_limit(limit, self.session_settings)
        return await self.sessions.acall(self.session_id, lambda s: s.get_items(limit))

    async def add_items(self, items: list[Any]) -> None:
        if items:
            items = list(items)
            await self.sessions.acall(self.session_id, lambda s: s.add_items(items))

    async def pop_item(self) -> Any:
        return await self.sessions.acall(self.session_id, lambda s: s.pop_item())

    async def clear_session(self) -> None:
        await self.sessions.acall(self.session_id, lambda s: s.clear_session())

    async def close(self) -> None:
        """Nothing to release: the executor's engine outlives the run."""
