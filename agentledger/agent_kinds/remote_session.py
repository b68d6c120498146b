"""The Agents SDK's ``Session`` for an executor without database access (``agentledger worker
--api``, ``ExecutorClient.run_forever``): each method is a memory route of the run
(``RunContext.memory``), which the server carries out with the SDK's own ``SQLAlchemySession``
on the ledger's database, the session and tables a worker on the database uses. Items are the
SDK's JSON items, stored as that session stores them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agents.memory.session import SessionABC
from agents.memory.session_settings import SessionSettings, resolve_session_limit

from agentledger.agent_kinds.run_context import MemoryPort


class RemoteSession(SessionABC):
    """The session of one run's thread, through the run's memory routes. The requests block,
    so they run off the SDK's event loop."""

    def __init__(self, memory: MemoryPort, session_id: str,
                 session_settings: SessionSettings | None = None):
        self.memory = memory
        self.session_id = session_id
        self.session_settings = session_settings or SessionSettings()

    async def _call(self, operation: str, body: dict[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(self.memory.call, operation, body)

    async def get_items(self, limit: int | None = None) -> list[Any]:
        limit = resolve_session_limit(limit, self.session_settings)
        return (await self._call("session/get-items", {"limit": limit}))["items"]

    async def add_items(self, items: list[Any]) -> None:
        if items:
            await self._call("session/add-items", {"items": list(items)})

    async def pop_item(self) -> Any:
        return (await self._call("session/pop-item", {}))["item"]

    async def clear_session(self) -> None:
        await self._call("session/clear", {})

    async def close(self) -> None:
        """Nothing to release: the executor's HTTP client outlives the run."""
