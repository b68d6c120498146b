"""What a span means to the ledger: GenAI semantic conventions and OpenInference attributes."""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from typing import Any

from agentledger.core.errors import LedgerError, ValidationFailed
from agentledger.core.hashing import storable_json
from agentledger.core.json_limits import parse_json_body

MODEL_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
_SLUG = re.compile(r"[^a-z0-9]+")
_TOOL_SCHEMA = re.compile(r"llm\.tools\.\d+\.tool\.json_schema$")
# The first character, after JSON's whitespace, of any text ``json.loads`` accepts (Python's
# decoder also takes NaN and Infinity): other text is returned as it is without trying to parse
# it, since a failed parse raises and most attribute text is plain prose.
_JSON_START = frozenset('{["-0123456789tfnNI')
_JSON_SPACE = " \t\n\r"


def _json(value: Any) -> Any:
    """An attribute's text as the JSON it holds (tool arguments, instructions, tool lists), or
    the text as sent when it holds none the ledger could store: not JSON, nested deeper than
    ``MAX_JSON_DEPTH``, or spelling what neither database keeps (NaN, infinities, NUL, lone
    surrogates, all of which JSON escapes and Python's decoder let through)."""
    if isinstance(value, str):
        start = value.lstrip(_JSON_SPACE)[:1]
        if start not in _JSON_START:
            return value
        try:
            return storable_json(parse_json_body(value), "")
        except (LedgerError, RecursionError):
            return value
    return value


def operation(attrs: dict) -> str | None:
    return attrs.get("gen_ai.operation.name")


def oi_kind(attrs: dict) -> str | None:
    kind = attrs.get("openinference.span.kind")
    return kind.upper() if isinstance(kind, str) else None


def _first_text(attrs: dict, keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = attrs.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def agent_id(attrs: dict) -> str | None:
    """What the agent's id is made of: ``gen_ai.agent.id``, else the agent's name."""
    return _first_text(attrs, ("gen_ai.agent.id", "gen_ai.agent.name", "agent.name"))


def agent_display_name(attrs: dict) -> str | None:
    """The agent's display name: ``gen_ai.agent.name`` (OpenInference ``agent.name``), else its
    id (an id is often a slug or an opaque key, so it is the last resort here)."""
    return _first_text(attrs, ("gen_ai.agent.name", "agent.name", "gen_ai.agent.id"))


def is_agent_span(attrs: dict) -> bool:
    """``invoke_agent``, or an OpenInference ``AGENT`` span, named or not. Whether a nameless
    ``AGENT`` span is a run or only a workflow container depends on the spans around it
    (``is_workflow_candidate``; ``record`` decides)."""
    return operation(attrs) == "invoke_agent" or oi_kind(attrs) == "AGENT"


def is_workflow_candidate(attrs: dict) -> bool:
    """A nameless OpenInference ``AGENT`` span: the OpenAI Agents instrumentation marks the span
    of its whole workflow so, above the agents' own (named) spans."""
    return (oi_kind(attrs) == "AGENT" and operation(attrs) != "invoke_agent"
            and agent_id(attrs) is None)


def unnamed_agent(span_name: str, service_name: str) -> str:
    """The agent a span that names none is filed under: its span name, unless that is only the
    GenAI operation (``invoke_agent`` is what the conventions call a nameless agent's span),
    then the service that sent it."""
    name = span_name.strip()
    if name and name != "invoke_agent":
        return name
    return service_name.strip() or "agent"


# Attributes that only GenAI instrumentations write: a root span carrying one is part of a
# model-driven execution even when no agent, model or tool span was exported with it.
_SIGNAL_PREFIXES = ("gen_ai.", "llm.", "openinference.", "embedding.", "retrieval.",
                    "reranker.", "tool_call.")
_SIGNAL_KEYS = frozenset({"input.value", "output.value", "agent.name", "tool.name"})


def carries_genai(attrs: dict) -> bool:
    """Whether a span carries a GenAI semantic-convention or OpenInference attribute."""
    return any(key in _SIGNAL_KEYS or key.startswith(_SIGNAL_PREFIXES) for key in attrs)


def is_model_span(attrs: dict) -> bool:
    return operation(attrs) in MODEL_OPERATIONS or oi_kind(attrs) == "LLM"


def is_tool_span(attrs: dict) -> bool:
    return operation(attrs) == "execute_tool" or oi_kind(attrs) == "TOOL"


def slug(name: str) -> str:
    """An agent id made of a name: accents dropped, lower case, each run of other characters a
    dash, at most 63 characters. A name with letters, digits or symbols that have no ASCII form
    (助手, Агент, an emoji; punctuation is a separator like any other) keeps a digest of itself
    as a suffix: without it every such name would be the same id (``agent``), and one agent's
    answers would be filed under another's."""
    decomposed = unicodedata.normalize("NFKD", name)
    base = _SLUG.sub("-", decomposed.encode("ascii", "ignore").decode().lower()).strip("-")
    if all(ch.isascii() or ch.isspace() or unicodedata.combining(ch)
           or unicodedata.category(ch).startswith("P") for ch in decomposed):
        return base[:63].strip("-") or "agent"
    # 54 characters at most, so that ``<id>-external`` (``record._ensure_agent``) keeps it whole.
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{base[:43].strip('-') or 'agent'}-{digest}"


def _parts_text(message: Any) -> str:
    """The text parts of one GenAI message (``{"role", "parts": [{"type": "text", ...}]}``)."""
    if not isinstance(message, dict):
        return ""
    if isinstance(message.get("content"), str):
        return message["content"]
    texts = []
    for part in message.get("parts") or []:
        if isinstance(part, dict) and part.get("type") == "text":
            texts.append(str(part.get("content", "")))
    return "".join(texts)


@functools.cache
def _oi_message_key(prefix: str) -> re.Pattern:
    return re.compile(re.escape(prefix) + r"\.(\d+)\.message\.(role|content)$")


def _oi_messages(attrs: dict, prefix: str) -> list[dict]:
    """OpenInference's flattened ``llm.input_messages.<i>.message.role/content``."""
    dotted = prefix + "."
    if not any(key.startswith(dotted) for key in attrs):
        return []  # most spans: no key to match
    found: dict[int, dict] = {}
    pattern = _oi_message_key(prefix)
    for key, value in attrs.items():
        match = pattern.match(key)
        if match:
            found.setdefault(int(match.group(1)), {})[match.group(2)] = value
    return [found[i] for i in sorted(found)]


def _messages(attrs: dict, genai_key: str, oi_prefix: str) -> list[dict]:
    value = _json(attrs.get(genai_key))
    if isinstance(value, list):
        return [m for m in value if isinstance(m, dict)]
    return _oi_messages(attrs, oi_prefix)


def user_text(attrs: dict) -> str | None:
    """The last user message of a span's captured input."""
    for message in reversed(_messages(attrs, "gen_ai.input.messages", "llm.input_messages")):
        if message.get("role") == "user":
            text = _parts_text(message)
            if text:
                return text
    value = attrs.get("input.value")
    if isinstance(value, str) and value:
        parsed = _json(value)
        if isinstance(parsed, list):  # OpenAI Agents: the run's input items
            for item in reversed(parsed):
                if isinstance(item, dict) and item.get("role") == "user":
                    content = item.get("content")
                    if isinstance(content, str):
                        return content
        return value if not isinstance(parsed, list | dict) else None
    for message in _messages(attrs, "pydantic_ai.all_messages", "-"):
        if message.get("role") == "user":
            return _parts_text(message) or None
    return None


def output_text(attrs: dict) -> str | None:
    """A span's captured output text (assistant messages, ``output.value``, ``final_result``)."""
    texts = [_parts_text(m) for m in _messages(attrs, "gen_ai.output.messages", "llm.output_messages")
             if m.get("role", "assistant") == "assistant"]
    text = "".join(t for t in texts if t)
    if text:
        return text
    for key in ("output.value", "final_result"):
        value = attrs.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def model_of(attrs: dict) -> str | None:
    for key in ("gen_ai.response.model", "gen_ai.request.model", "llm.model_name", "model_name"):
        value = attrs.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def tokens(attrs: dict) -> tuple[int, int] | None:
    """The span's (input, output) token counts; a count the span does not carry is 0, one it
    carries must be a whole number from 0 (an integer, or the same written as a float or as
    digits), else ``ValidationFailed``: the run tree is refused rather than recorded with a
    number nobody sent (a negative count read as 0, 3.7 as 3)."""
    pairs = (("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"),
             ("llm.token_count.prompt", "llm.token_count.completion"))
    for inp, out in pairs:
        if inp in attrs or out in attrs:
            return _count(attrs, inp), _count(attrs, out)
    return None


def _count(attrs: dict, key: str) -> int:
    value = attrs.get(key)
    if value is None:
        return 0
    if isinstance(value, str) and value.strip().isdigit() and len(value) <= 30:
        value = int(value)  # a count sent as a string attribute
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValidationFailed(f"{key} is {str(value)[:40]!r}, not a token count (a whole number "
                           "from 0)")


def instructions_of(attrs: dict) -> str | None:
    value = _json(attrs.get("gen_ai.system_instructions"))
    if isinstance(value, list):
        text = "".join(str(p.get("content", "")) for p in value
                       if isinstance(p, dict) and p.get("type") == "text")
        return text or None
    if isinstance(value, str) and value:
        return value
    for message in _messages(attrs, "gen_ai.input.messages", "llm.input_messages"):
        if message.get("role") == "system":
            return _parts_text(message) or None
    return None


def tool_names(attrs: dict) -> list[str] | None:
    value = _json(attrs.get("gen_ai.tool.definitions"))
    names: list[str] = []
    if isinstance(value, list):
        names = [str(t.get("name") or (t.get("function") or {}).get("name") or "")
                 for t in value if isinstance(t, dict)]
    else:
        for key, schema in attrs.items():
            if _TOOL_SCHEMA.match(key):
                parsed = _json(schema)
                if isinstance(parsed, dict):
                    names.append(str(parsed.get("name")
                                     or (parsed.get("function") or {}).get("name") or ""))
        if not names:
            return None
    return sorted({n for n in names if n})


def tool_call(attrs: dict, span_name: str) -> tuple[str, Any, Any, str | None]:
    """(name, input, output, call_id) of a tool span."""
    name = attrs.get("gen_ai.tool.name") or attrs.get("tool.name") or span_name or "tool"
    arguments = attrs.get("gen_ai.tool.call.arguments", attrs.get("input.value"))
    result = attrs.get("gen_ai.tool.call.result", attrs.get("output.value"))
    call_id = attrs.get("gen_ai.tool.call.id") or attrs.get("tool_call.id")
    return str(name), _json(arguments), _json(result), (str(call_id) if call_id else None)


def conversation_id(attrs: dict) -> str | None:
    for key in ("gen_ai.conversation.id", "session.id"):
        value = attrs.get(key)
        if isinstance(value, str | int) and str(value).strip():
            return str(value).strip()[:255]
    return None


# Set by the receiver (never taken from an export) on a span whose conversation id redaction
# changed: the digest of the id as sent, which keys the conversation instead of its redacted
# text, so that two ids differing only inside a redacted value stay two conversations.
CONVERSATION_KEY = "agentledger.conversation.key"


def conversation_digest(raw_id: str) -> str:
    return "sha256:" + hashlib.sha256(raw_id.encode()).hexdigest()


def conversation(attrs: dict) -> tuple[str, str] | None:
    """(key, title) of the span's conversation: the id as stored is the title, and the key
    unless the receiver keyed it by digest (``CONVERSATION_KEY``)."""
    title = conversation_id(attrs)
    if title is None:
        return None
    key = attrs.get(CONVERSATION_KEY)
    return (key if isinstance(key, str) and key else title), title


def error_code(attrs: dict) -> str:
    value = attrs.get("error.type")
    return str(value)[:100] if value else "error"
