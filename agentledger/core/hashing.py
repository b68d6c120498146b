"""Canonical JSON and the hashes built on it: snapshots, idempotency and the event chain.

Shared by the writer (which stores hashes) and ``agentledger verify`` (which recomputes them), so
both sides can never disagree on how an event is serialised.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from agentledger.core.errors import ValidationFailed

GENESIS_HASH = "0" * 64


# What ``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` builds
# on every call, built once: the same text, without constructing an encoder per value.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
# And the C encoder that ``_CANONICAL.encode`` itself makes anew on every call, made once with
# the same settings (``JSONEncoder.iterencode`` passes these): a small event's data then
# encodes in about a quarter of the CPU (every event's hash needs it). The one setting it
# drops is the circular-reference check, whose bookkeeping dict a shared encoder could not
# share between threads: the values are JSON documents, and a cyclic one still fails (with
# RecursionError instead of ValueError), as storing it would.
def _c_canonical_encoder() -> Any:
    make = getattr(json.encoder, "c_make_encoder", None)  # None without the C module
    if make is None:  # pragma: no cover - CPython has it
        return None
    try:
        return make(None, _CANONICAL.default, json.encoder.encode_basestring, None,
                    _CANONICAL.key_separator, _CANONICAL.item_separator, True, False, True)
    except TypeError:  # pragma: no cover - a Python whose private encoder takes other arguments
        return None  # the public encoder, slower and the same text


_C_CANONICAL = _c_canonical_encoder()


def canonical_json(value: Any) -> str:
    """Key-sorted, whitespace-free, UTF-8 JSON: the same value always gives the same text."""
    if _C_CANONICAL is None:  # pragma: no cover - see _c_canonical_encoder
        return _CANONICAL.encode(value)
    return "".join(_C_CANONICAL(value, 0))


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def answer_sha256(content: str) -> str:
    """``run.completed``'s ``content_sha256``: the stored answer's text bound into the run's
    chain, since the text itself lives in its ``message`` row, outside the hashed events."""
    return sha256_hex(content)


def input_sha256(text: str) -> str:
    """``run.queued``'s ``input_sha256``: the run's input as stored (the question, or a child's
    task) bound into its chain, since the text lives in the run row, outside the hashed
    events."""
    return sha256_hex(text)


def snapshot_sha256(snapshot: Any) -> str:
    """``run.queued``'s ``agent_snapshot_sha256`` and ``context_pack_sha256``: a frozen snapshot
    (the agent execution snapshot, the context pack snapshot) bound into its run's chain, since
    the snapshots live in the run row, outside the hashed events. The sha256 of the snapshot's
    canonical JSON, exactly as stored (``storable_json`` values read back the same on both
    databases, as event data does)."""
    return sha256_hex(canonical_json(snapshot))


def timestamp_text(moment: datetime) -> str:
    """Microsecond UTC text, the precision both databases store."""
    if moment.tzinfo is not UTC:
        moment = moment.astimezone(UTC)
    if moment.year < 1000:  # strftime's %Y and four digits agree from year 1000 on
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    # The same text as strftime, in about 60 % of the CPU of ``isoformat`` (every event's hash
    # has one); %-formatting measured faster than the f-string with seven format specs.
    return "%d-%02d-%02dT%02d:%02d:%02d.%06dZ" % (  # noqa: UP031
        moment.year, moment.month, moment.day, moment.hour, moment.minute, moment.second,
        moment.microsecond)


def event_hash(
    previous_hash: str, run_id: str, seq: int, type_: str, data: Any, created_at: datetime
) -> str:
    """The chained hash of one event: any change to it or to an earlier event changes it."""
    return event_hash_of_json(previous_hash, run_id, seq, type_, canonical_json(data), created_at)


@functools.lru_cache(maxsize=4096)
def _json_text(value: str) -> str:
    return canonical_json(value)


# An event's hash covers ``previous_hash + "\n" + body``, the body being the canonical JSON of
# ``{run_id, seq, type, data, created_at}``, written out here in its sorted key order:
#   {"created_at":"<stamp>","data":<data>,"run_id":<run_id>,"seq":<seq>,"type":<type>}
# ``_stamp_part`` and ``_run_part`` are the pieces that the events of one batch (one run, one
# stamp) share; ``_chained_hash`` puts one event's body together.
def _stamp_part(created_at: datetime) -> str:
    return '{"created_at":"' + timestamp_text(created_at) + '","data":'  # no escaping needed


def _run_part(run_id: str) -> str:
    return ',"run_id":' + _json_text(run_id) + ',"seq":'


def _chained_hash(previous_hash: str, stamp_part: str, data_json: str, run_part: str, seq: Any,
                  type_: str) -> str:
    body = (stamp_part + data_json + run_part
            + (str(seq) if type(seq) is int else canonical_json(seq))
            + ',"type":' + _json_text(type_) + "}")
    return sha256_hex(previous_hash + "\n" + body)


def event_hash_of_json(
    previous_hash: str, run_id: str, seq: int, type_: str, data_json: str, created_at: datetime
) -> str:
    """``event_hash`` for data already serialised with ``canonical_json`` (bulk imports reuse
    that text as the stored JSON)."""
    return _chained_hash(previous_hash, _stamp_part(created_at), data_json, _run_part(run_id),
                         seq, type_)


def chained_hashes(previous_hash: str, run_id: str, first_seq: int,
                   events: list[tuple[str, str]], created_at: datetime) -> list[str]:
    """The hashes of a batch of one run's events stamped alike: ``events`` are (type, data as
    ``canonical_json``) with seqs ``first_seq``, ``first_seq + 1``, …, chained from
    ``previous_hash``. Each is ``event_hash_of_json`` of its event; the stamp's text and the
    run's part of the body are made once for the batch."""
    stamp_part, run_part = _stamp_part(created_at), _run_part(run_id)
    hashes = []
    chain = previous_hash
    for seq, (type_, data_json) in enumerate(events, first_seq):
        chain = _chained_hash(chain, stamp_part, data_json, run_part, seq, type_)
        hashes.append(chain)
    return hashes


class _NotStorable(Exception):
    def __init__(self, path: str, problem: str):
        self.path, self.problem = path, problem


def storable_json(value: Any, where: str) -> Any:
    """``value`` exactly as both databases give it back, so its hash verifies after a round trip.

    PostgreSQL's jsonb keeps numbers as ``numeric``: it has no ``-0.0``, and a float written with
    an exponent of 16 or more (``1e+16``) comes back as an integer. Text may not contain NUL or
    lone surrogates, and NaN/Infinity are not JSON: those are refused on both databases.
    """
    try:
        return _storable(value)
    except _NotStorable as exc:
        raise ValidationFailed(f"{where}{exc.path}: {exc.problem}") from None


_TEXT_PROBLEM = "text may not contain NUL or lone surrogates"
_UNSTORABLE_CHARACTERS = re.compile("[\x00\ud800-\udfff]")


def is_storable_text(value: str) -> bool:
    """Text both databases can hold: no NUL (neither stores it in text) and no lone surrogates
    (not UTF-8; JSON escapes can spell them). The one rule for bodies, query parameters, path
    segments and cursors alike."""
    if "\x00" in value:
        return False
    if value.isascii():
        return True
    try:
        value.encode("utf-8")  # fails exactly on surrogate code points (U+D800..U+DFFF)
    except UnicodeEncodeError:
        return False
    return True


def storable_text(value: str) -> str:
    """``value`` with what neither database can hold (NUL, lone surrogates) replaced by U+FFFD,
    for text the ledger writes on an agent's behalf (its exception's message), which must be
    stored rather than refused."""
    if is_storable_text(value):
        return value
    return _UNSTORABLE_CHARACTERS.sub("\ufffd", value)


def _text(value: str) -> str:
    if not is_storable_text(value):
        raise _NotStorable("", _TEXT_PROBLEM)
    return value


def _storable(value: Any) -> Any:
    # The happy path builds no error paths: they are assembled only while an error unwinds.
    kind = type(value)
    if kind is str:
        return _text(value)
    if value is None or kind is bool or kind is int:
        return value
    if kind is dict or isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                if not isinstance(key, str):
                    raise _NotStorable("", "object keys must be strings")
            _text(key)
            try:
                out[key] = _storable(item)
            except _NotStorable as exc:
                raise _NotStorable(f".{key}{exc.path}", exc.problem) from None
        return out
    if kind is list or isinstance(value, list | tuple):
        out_list = []
        for i, item in enumerate(value):
            try:
                out_list.append(_storable(item))
            except _NotStorable as exc:
                raise _NotStorable(f"[{i}]{exc.path}", exc.problem) from None
        return out_list
    if isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _NotStorable("", "numbers must be finite")
        if value == 0:
            return 0.0
        if abs(value) >= 1e16:
            return int(Decimal(repr(value)))
        return value
    if isinstance(value, str):
        return _text(value)
    raise _NotStorable("", f"{type(value).__name__} is not a JSON value")


def agent_content_hash(name: str, kind: str, model: str | None, instructions: str | None,
                       tools: Any, params: Any) -> str:
    """The ``content_hash`` of an agent definition (and of the execution snapshot frozen of it)."""
    return sha256_hex(canonical_json({"name": name, "kind": kind, "model": model,
                                      "instructions": instructions, "tools": tools,
                                      "params": params}))


def context_pack_hash(entries: list[dict[str, Any]]) -> str:
    """The ``pack_hash`` of a context pack: over its items' ids, titles, versions and sha256s."""
    return sha256_hex(canonical_json(entries))


def token_hash(token: str) -> str:
    """What is stored of an API token: its keyed sha256, never the token."""
    return sha256_hex("api-token\n" + token)
