"""How a thread's framework memory travels between an executor without database access and the
ledger server's memory routes (``agentledger.api.routes_memory``).

- A LangGraph value is what LangGraph's own serializer makes of it (``dumps_typed``: a type tag
  and bytes), as ``{"type", "data"}`` with the bytes in base64. The tags an executor may send
  are those the serializer writes without its pickle fallback: ``null``, ``bytes``,
  ``bytearray`` and ``msgpack``.
- A checkpoint tuple is JSON: ``config`` and ``parent_config`` (the saver's own), ``metadata``
  (JSON in both savers' tables), the checkpoint itself and each pending write's value as above.
- The server reads an executor's bytes strictly. LangGraph's msgpack extension hook rebuilds an
  object by importing the module the bytes name and calling the class they name, which from a
  remote caller would be code execution on the server; its strict mode
  (``allowed_msgpack_modules=None``) rebuilds only LangGraph's safe types (datetimes, UUIDs,
  LangChain messages, LangGraph's Send, Command, Interrupt, …) plus the exact types an operator
  names in ``AGENTLEDGER_CHECKPOINT_TYPES``. Strict mode alone would silently keep a refused
  object's raw fields in its place; ``StrictSerializer`` refuses the value instead
  (``RefusedValue``, naming the type), so nothing different from what a worker on the database
  would have stored is ever written.
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langgraph.checkpoint.base import CheckpointTuple
    from langgraph.checkpoint.serde.base import SerializerProtocol

WIRE_TYPES = ("null", "bytes", "bytearray", "msgpack")


class RefusedValue(ValueError):
    """A value the server does not read from an executor: ``type_name`` is the class strict
    mode would not rebuild (``module.Class``), or None for bytes that are not a value at all."""

    def __init__(self, message: str, type_name: str | None = None):
        super().__init__(message)
        self.type_name = type_name


def encode_typed(typed: tuple[str, bytes]) -> dict[str, str]:
    kind, data = typed
    return {"type": kind, "data": base64.b64encode(bytes(data)).decode("ascii")}


def decode_typed(value: dict[str, Any]) -> tuple[str, bytes]:
    kind, data = value.get("type"), value.get("data")
    if kind not in WIRE_TYPES:
        raise RefusedValue(f"values are serialized as one of {', '.join(WIRE_TYPES)}, "
                           f"not {kind!r}")
    if not isinstance(data, str):
        raise RefusedValue("a value's data is base64 text")
    try:
        return kind, base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise RefusedValue("a value's data is not valid base64") from None


def thread_config(thread_id: str, checkpoint_ns: str = "",
                  checkpoint_id: str | None = None) -> dict[str, Any]:
    configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def tuple_to_json(saved: CheckpointTuple, serde: SerializerProtocol) -> dict[str, Any]:
    return {
        "config": saved.config,
        "checkpoint": encode_typed(serde.dumps_typed(saved.checkpoint)),
        "metadata": saved.metadata,
        "parent_config": saved.parent_config,
        "pending_writes": [{"task_id": task_id, "channel": channel,
                            "value": encode_typed(serde.dumps_typed(value))}
                           for task_id, channel, value in saved.pending_writes or []],
    }


def tuple_from_json(data: dict[str, Any], serde: SerializerProtocol) -> CheckpointTuple:
    from langgraph.checkpoint.base import CheckpointTuple

    return CheckpointTuple(
        config=data["config"],
        checkpoint=serde.loads_typed(decode_typed(data["checkpoint"])),
        metadata=data["metadata"],
        parent_config=data.get("parent_config"),
        pending_writes=[(w["task_id"], w["channel"], serde.loads_typed(decode_typed(w["value"])))
                        for w in data.get("pending_writes") or []],
    )


# ---- the server's strict reading -----------------------------------------------------------

# The types strict mode refused while the current thread read a value (None: not reading).
# LangGraph reports a refusal only as a serde event, to process-wide listeners, from inside the
# read, so one listener collects them for the reading thread.
_refused: ContextVar[list[str] | None] = ContextVar("agentledger_refused_types", default=None)
_BLOCKED_EVENTS = ("msgpack_blocked", "msgpack_method_blocked")


def _heard(event: Any) -> None:
    found = _refused.get()
    if found is not None and event.get("kind") in _BLOCKED_EVENTS:
        name = f"{event.get('module')}.{event.get('name')}"
        found.append(f"{name}.{event['method']}" if event.get("method") else name)


@contextmanager
def _collecting() -> Iterator[list[str]]:
    found: list[str] = []
    token = _refused.set(found)
    try:
        yield found
    finally:
        _refused.reset(token)


@functools.cache
def _strict_class() -> type:
    from langgraph.checkpoint.serde.event_hooks import register_serde_event_listener
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    register_serde_event_listener(_heard)

    class StrictSerializer(JsonPlusSerializer):
        """LangGraph's serializer in strict mode that raises ``RefusedValue`` where strict mode
        would return a refused object's raw fields."""

        def loads_typed(self, data: tuple[str, bytes]) -> Any:
            with _collecting() as refused:
                try:
                    value = super().loads_typed(data)
                except Exception as exc:  # noqa: BLE001 - malformed bytes of any kind
                    raise RefusedValue(f"a {data[0]} value could not be read "
                                       f"({type(exc).__name__}: {exc})") from None
            if refused:
                raise RefusedValue(f"a value of type {refused[0]}", refused[0])
            return value

    return StrictSerializer


def strict_serializer(allowed: tuple[tuple[str, str], ...] = ()) -> SerializerProtocol:
    """The serializer the server reads and writes checkpoints with: LangGraph's safe types plus
    the (module, class) pairs of ``allowed`` (``Settings.checkpoint_type_allowlist``)."""
    return _strict_class()(allowed_msgpack_modules=allowed or None)
