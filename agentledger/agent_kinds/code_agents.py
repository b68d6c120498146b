"""What the code-defined agent kinds (``langgraph``, ``openai-agents``) share: loading
``"package.module:attr"``, the ``agent.resolved`` record, pricing, and how an exception of the
framework becomes the run's error (CONTRACT §7)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import inspect
import json
import re
import sys
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from agentledger.agent_kinds.pricing import cost_usd
from agentledger.agent_kinds.run_context import AgentFailed, RunCancelled, RunContext

REFERENCE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


class Unavailable(ValueError):
    """A reference that cannot be loaded here (a sentence naming the problem)."""


def parse_reference(value: Any, where: str) -> tuple[str, str]:
    if not isinstance(value, str) or not REFERENCE.match(value):
        raise Unavailable(f"{where} must be \"package.module:attr\", got {value!r}")
    module, attr = value.split(":", 1)
    return module, attr


def load_reference(value: Any, where: str) -> tuple[Any, str, str]:
    """The object ``value`` names, with its module and attribute; ``Unavailable`` if it can't."""
    module_name, attr = parse_reference(value, where)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the definition's problem
        raise Unavailable(f"{where}: cannot import module {module_name!r} "
                          f"({type(exc).__name__}: {exc})") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise Unavailable(f"{where}: module {module_name!r} has no attribute {attr!r}") from None
    return obj, module_name, attr


def unavailable(exc: Unavailable) -> AgentFailed:
    return AgentFailed(str(exc), code="agent_unavailable")


@lru_cache(maxsize=1)
def _distributions() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


def package_of(module_name: str) -> tuple[str, str | None]:
    """The distribution that ships ``module_name`` and its version (top-level package and
    ``None`` when it is not installed as a distribution, e.g. code on ``PYTHONPATH``)."""
    top = module_name.split(".", 1)[0]
    for dist in _distributions().get(top, []):
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return top, None


def source_hash(module_name: str) -> str | None:
    """sha256 of the source file that defines the module (what an auditor can compare)."""
    module = sys.modules.get(module_name)
    try:
        path = inspect.getsourcefile(module) if module else None
    except TypeError:
        path = None
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def sha256_text(text: Any) -> str | None:
    if not isinstance(text, str) or not text:
        return None
    return hashlib.sha256(text.encode()).hexdigest()


def resolved(*, name: str, model: str | None, instructions: Any, tools: list[str],
             module_name: str, attr: str, **extra: Any) -> dict[str, Any]:
    package, version = package_of(module_name)
    return {"name": name, "model": model, "instructions_sha256": sha256_text(instructions),
            "tools": sorted(set(tools)), "source": f"{module_name}:{attr}", "package": package,
            "package_version": version, "content_hash": source_hash(module_name), **extra}


def usage_event(ctx: RunContext, model: str | None, input_tokens: Any, output_tokens: Any) -> None:
    tokens_in, tokens_out = int(input_tokens or 0), int(output_tokens or 0)
    ctx.emit("usage", {"input_tokens": tokens_in, "output_tokens": tokens_out,
                       "cost_usd": cost_usd(ctx.params, model, tokens_in, tokens_out),
                       "model": model})


def is_ledger_signal(exc: BaseException) -> bool:
    """Exceptions of the ledger itself (cancel, a refused write, a dropped run) pass through."""
    if isinstance(exc, RunCancelled | AgentFailed):
        return True
    return type(exc).__module__.startswith("agentledger.")


def agent_error(exc: BaseException) -> AgentFailed:
    return AgentFailed(f"{type(exc).__name__}: {exc}", code="agent_error")


def as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return str(value)


def as_json(value: Any) -> Any:
    """``value`` as JSON-storable data (what an event may carry)."""
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return str(value)
