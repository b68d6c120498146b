"""LangGraph's checkpointer for an executor without database access (``agentledger worker
--api``, ``ExecutorClient.run_forever``): each operation is a memory route of the run
(``RunContext.memory``), which the server carries out with LangGraph's own saver on the ledger's
database, the same saver and tables a worker on the database uses.

Values leave as LangGraph's serializer writes them (``memory_wire``) and come back the same
way, loaded here with the same serializer a worker on the database loads its saver's rows with.
``get_next_version`` stays here: LangGraph's SQLite and PostgreSQL savers number channel
versions alike, and this saver numbers them as they do, so a thread goes on from either kind
of worker to the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.sqlite import SqliteSaver

from agentledger.agent_kinds.memory_wire import encode_typed, tuple_from_json
from agentledger.agent_kinds.run_context import MemoryPort

PAGE = 100  # checkpoints per list request (the route's own bound is 500)


class RemoteCheckpointSaver(BaseCheckpointSaver[str]):
    """The checkpointer of one run: its thread's checkpoints through the run's memory routes."""

    def __init__(self, memory: MemoryPort, thread_id: str):
        super().__init__()
        self.memory = memory
        self.thread_id = thread_id

    def _configurable(self, config: RunnableConfig | None) -> dict[str, Any]:
        configurable = dict((config or {}).get("configurable") or {})
        thread = configurable.get("thread_id")
        if thread is not None and str(thread) != self.thread_id:
            # The server serves the run's own thread whatever a body says; a graph asking for
            # another would silently get this one.
            raise ValueError(f"this run's checkpointer holds thread {self.thread_id} only, "
                             f"not {thread}")
        return configurable

    # ---- reads -------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        configurable = self._configurable(config)
        body: dict[str, Any] = {"checkpoint_ns": configurable.get("checkpoint_ns", "")}
        if checkpoint_id := configurable.get("checkpoint_id"):
            body["checkpoint_id"] = checkpoint_id
        found = self.memory.call("checkpoints/get", body)["checkpoint"]
        return None if found is None else tuple_from_json(found, self.serde)

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None,
             limit: int | None = None) -> Iterator[CheckpointTuple]:
        """Newest first, a page at a time (each page after the previous one's oldest id)."""
        configurable = self._configurable(config)
        body: dict[str, Any] = {}
        if configurable.get("checkpoint_ns") is not None:
            body["checkpoint_ns"] = configurable["checkpoint_ns"]
        if checkpoint_id := configurable.get("checkpoint_id"):
            body["checkpoint_id"] = checkpoint_id
        if filter:
            body["filter"] = filter
        older = get_checkpoint_id(before) if before else None
        remaining = limit
        while remaining is None or remaining > 0:
            page = PAGE if remaining is None else min(PAGE, remaining)
            found = self.memory.call("checkpoints/list", {
                **body, "limit": page, **({"before": older} if older else {})})["checkpoints"]
            for item in found:
                yield tuple_from_json(item, self.serde)
            if len(found) < page:
                return
            older = found[-1]["config"]["configurable"]["checkpoint_id"]
            if remaining is not None:
                remaining -= len(found)

    # ---- writes (each an upsert on the server: a retried request stores the same rows) -----

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        configurable = self._configurable(config)
        body: dict[str, Any] = {
            "checkpoint_ns": configurable.get("checkpoint_ns", ""),
            "checkpoint": encode_typed(self.serde.dumps_typed(checkpoint)),
            # What LangGraph's savers store: the run's own metadata merged with the config's
            # (the server's saver then finds nothing more to merge).
            "metadata": get_checkpoint_metadata(config, metadata),
            "new_versions": dict(new_versions),
        }
        if parent := configurable.get("checkpoint_id"):
            body["parent_checkpoint_id"] = parent
        return self.memory.call("checkpoints/put", body)["config"]

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        if not writes:
            return
        configurable = self._configurable(config)
        self.memory.call("checkpoints/put-writes", {
            "checkpoint_ns": configurable.get("checkpoint_ns", ""),
            "checkpoint_id": configurable["checkpoint_id"],
            "task_id": task_id, "task_path": task_path,
            "writes": [{"channel": channel, "value": encode_typed(self.serde.dumps_typed(value))}
                       for channel, value in writes]})

    def get_next_version(self, current: str | None, channel: None) -> str:
        return SqliteSaver.get_next_version(self, current, channel)  # type: ignore[arg-type]

    # ---- the asyncio twins (a graph run with ainvoke / astream): the same requests, off the
    # event loop ----------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        found = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for item in found:
            yield item

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)
