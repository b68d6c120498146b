"""Executor routes for a run's framework memory: its thread's LangGraph checkpoints and Agents
SDK session, for executors without database access (``agentledger worker --api``, CONTRACT §4).

Each route is scoped to the run in its path: the caller names the executor instance holding its
lease (``404`` for no such run, ``409 lease_lost`` for another instance's, an expired lease or
an ended run, as the other executor routes answer), and the thread is always that run's own; no
body names a thread. The memory is stored where a worker on the database stores it
(``agent_kinds.served_memory``), so either kind of worker continues a thread the other began.
LangGraph values travel as LangGraph's serializer writes them and are read strictly
(``agent_kinds.memory_wire``): a value the server would not rebuild is ``422`` naming its type,
with nothing written. Free-form JSON that reaches the saver's SQL (a list's ``filter``, a put's
``metadata`` and ``new_versions``) holds only what both databases store (``storable_json``):
``422`` naming the field otherwise, on SQLite as on PostgreSQL.
"""

from __future__ import annotations

from typing import cast

from flask import jsonify

from agentledger.agent_kinds import served_memory
from agentledger.api import api
from agentledger.api.request_scope import state
from agentledger.api.requests import (
    CheckpointGetBody,
    CheckpointListBody,
    CheckpointPutBody,
    CheckpointWritesBody,
    MemoryCall,
    SessionAddBody,
    SessionItemsBody,
)
from agentledger.api.responses import (
    CheckpointListOut,
    CheckpointOut,
    CheckpointPutOut,
    SessionAddedOut,
    SessionClearedOut,
    SessionItemOut,
    SessionItemsOut,
    WritesOut,
)
from ingest.leases import leased_thread

EXECUTORS = ("executor", "admin")
# A checkpoint holds the graph's whole state (every message of the thread): more than the
# app's default body limit for a long conversation.
MEMORY_MAX_BODY = 16 * 1024 * 1024


def memory_route(path: str, summary: str, body, response):
    return api.route(f"/executor/runs/<run_id>/{path}", "POST", summary=summary,
                     roles=EXECUTORS, body=body, responses={200: response},
                     errors=(404, 409, 422), tag="executor", max_body=MEMORY_MAX_BODY)


def _thread(run_id: str, body: MemoryCall) -> str:
    with state().db.read(primary=True) as s:
        return leased_thread(s, run_id, body.executor_instance_id)


def _memory() -> served_memory.ServedMemory:
    return cast(served_memory.ServedMemory, state().memory)


def _where() -> tuple[served_memory.ServedMemory, tuple[tuple[str, str], ...]]:
    return _memory(), state().settings.checkpoint_type_allowlist()


# ---- LangGraph checkpoints -----------------------------------------------------------------


@memory_route("checkpoints/get", "LangGraph get_tuple on the run's thread",
              CheckpointGetBody, CheckpointOut)
def memory_checkpoint_get(run_id: str, body: CheckpointGetBody, raw_body):
    thread = _thread(run_id, body)
    memory, allowed = _where()
    found = served_memory.get_checkpoint(memory, thread, allowed=allowed,
                                         checkpoint_ns=body.checkpoint_ns,
                                         checkpoint_id=body.checkpoint_id)
    return jsonify({"checkpoint": found})


@memory_route("checkpoints/list", "LangGraph list on the run's thread, newest first",
              CheckpointListBody, CheckpointListOut)
def memory_checkpoint_list(run_id: str, body: CheckpointListBody, raw_body):
    thread = _thread(run_id, body)
    memory, allowed = _where()
    found = served_memory.list_checkpoints(
        memory, thread, allowed=allowed, checkpoint_ns=body.checkpoint_ns,
        checkpoint_id=body.checkpoint_id, before=body.before, filter=body.filter,
        limit=body.limit)
    return jsonify({"checkpoints": found})


@memory_route("checkpoints/put", "LangGraph put on the run's thread (an upsert)",
              CheckpointPutBody, CheckpointPutOut)
def memory_checkpoint_put(run_id: str, body: CheckpointPutBody, raw_body):
    thread = _thread(run_id, body)
    memory, allowed = _where()
    config = served_memory.put_checkpoint(
        memory, thread, allowed=allowed, checkpoint_ns=body.checkpoint_ns,
        parent_checkpoint_id=body.parent_checkpoint_id,
        checkpoint=body.checkpoint.model_dump(), metadata=body.metadata,
        new_versions=body.new_versions)
    return jsonify({"config": config})


@memory_route("checkpoints/put-writes", "LangGraph put_writes on the run's thread",
              CheckpointWritesBody, WritesOut)
def memory_checkpoint_put_writes(run_id: str, body: CheckpointWritesBody, raw_body):
    thread = _thread(run_id, body)
    memory, allowed = _where()
    written = served_memory.put_writes(
        memory, thread, allowed=allowed, checkpoint_ns=body.checkpoint_ns,
        checkpoint_id=body.checkpoint_id, task_id=body.task_id, task_path=body.task_path,
        writes=[(w.channel, w.value.model_dump()) for w in body.writes])
    return jsonify({"written": written})


# ---- Agents SDK session --------------------------------------------------------------------


@memory_route("session/get-items", "Agents SDK session get_items on the run's thread",
              SessionItemsBody, SessionItemsOut)
def memory_session_get_items(run_id: str, body: SessionItemsBody, raw_body):
    thread = _thread(run_id, body)
    return jsonify({"items": served_memory.session_items(_memory(), thread, body.limit)})


@memory_route("session/add-items", "Agents SDK session add_items on the run's thread",
              SessionAddBody, SessionAddedOut)
def memory_session_add_items(run_id: str, body: SessionAddBody, raw_body):
    thread = _thread(run_id, body)
    return jsonify({"added": served_memory.add_session_items(_memory(), thread, body.items)})


@memory_route("session/pop-item", "Agents SDK session pop_item on the run's thread",
              MemoryCall, SessionItemOut)
def memory_session_pop_item(run_id: str, body: MemoryCall, raw_body):
    thread = _thread(run_id, body)
    return jsonify({"item": served_memory.pop_session_item(_memory(), thread)})


@memory_route("session/clear", "Agents SDK session clear_session on the run's thread",
              MemoryCall, SessionClearedOut)
def memory_session_clear(run_id: str, body: MemoryCall, raw_body):
    thread = _thread(run_id, body)
    served_memory.clear_session(_memory(), thread)
    return jsonify({"cleared": True})
