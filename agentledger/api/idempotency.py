"""The ``Idempotency-Key`` header, read the same way wherever a route takes one: a message post
(where it is required) and an executor's append (where it is optional)."""

from __future__ import annotations

from flask import request

from agentledger.core.errors import IdempotencyKeyRequired

MAX_KEY_LENGTH = 255
KEY_RULE = "1-255 printable characters"


def idempotency_key(*, required: bool) -> str | None:
    """The request's key as text; None when it sent none and none is required. A header sent
    empty is no key: where one is required it is missing, and where one is optional it is
    refused, since its sender means its request to be keyed and would retry it unkeyed."""
    key = request.headers.get("Idempotency-Key")
    if key is None and not required:
        return None
    if key is None or (key == "" and required):
        raise IdempotencyKeyRequired(f"send an Idempotency-Key header ({KEY_RULE})")
    if not key.isascii():
        # The WSGI server hands header bytes over as latin-1 text; a client sends a key's
        # characters as UTF-8 (as the Python clients do), so that is what the key is made of.
        try:
            key = key.encode("latin-1").decode("utf-8")
        except UnicodeError:
            raise IdempotencyKeyRequired("the Idempotency-Key must be UTF-8 text") from None
    if not 1 <= len(key) <= MAX_KEY_LENGTH or not key.isprintable():
        raise IdempotencyKeyRequired(f"the Idempotency-Key must be {KEY_RULE}")
    return key
