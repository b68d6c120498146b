"""Redaction before hashing: detectors for personal data and secrets, and the one function that
replaces their matches with ``[REDACTED:<kind>]``.

``AGENTLEDGER_REDACT`` names the detectors (``email``, ``phone``, ``card``, ``secret``,
``re:<pattern>``; comma-separated, a pattern keeping its own commas: ``_entries``). ``ingest`` applies the redactor of its session
(``redactor_of``) to every text it is about to store or hash, so nothing unredacted is written
and every chain hashes what is stored. ``docs/redaction.md`` says what each detector catches and
misses.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SESSION_KEY = "agentledger_redactor"
KINDS = ("email", "phone", "card", "secret")

_EMAIL = re.compile(
    r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,24}(?![\w-])"
)
# International (+CC …) and US/NANP forms with separators; a bare run of digits is not a phone.
_PHONE = re.compile(
    r"(?<![\w+.-])(?:"
    r"\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}"           # +44 20 7946 0958, +1 (555) 123-4567
    r"|\(\d{3}\)[ .-]?\d{3}[ .-]\d{4}"                 # (555) 123-4567
    r"|\d{3}[.-]\d{3}[.-]\d{4}"                        # 555-123-4567, 555.123.4567
    r"|\d{3} \d{3} \d{4}"                              # 555 123 4567
    r")(?![\w])(?![.-]\d)"
)
# 13-19 digits, optionally grouped by single spaces or dashes; kept only if the Luhn check passes.
_CARD = re.compile(r"(?<![\d.+-])\d(?:[ -]?\d){12,18}(?![\d])(?![.-]\d)")
_SECRETS = re.compile("|".join([
    r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----",
    r"\bsk-(?:[A-Za-z0-9]+-){0,3}[A-Za-z0-9_-]{16,}",     # OpenAI / Anthropic style keys
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",                      # AWS access key ids
    r"\bgh[pousr]_[A-Za-z0-9]{30,}\b",                     # GitHub tokens
    r"\bgithub_pat_[A-Za-z0-9_]{22,}",
    r"\bxox[abprs]-[A-Za-z0-9-]{10,}",                     # Slack tokens
    r"\bAIza[0-9A-Za-z_-]{35}",                            # Google API keys
    r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",  # JWTs
    r"\b[Bb]earer\s+[A-Za-z0-9._~+/-]{16,}=*",             # Authorization: Bearer …
]))


def luhn_valid(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        n = ord(ch) - 48
        if i % 2:
            n = n * 2 - 9 if n > 4 else n * 2
        total += n
    return total % 10 == 0


@dataclass(frozen=True)
class Rule:
    kind: str  # email, phone, card, secret, re
    pattern: re.Pattern[str]
    check: Callable[[str], bool] | None = None

    @property
    def marker(self) -> str:
        return f"[REDACTED:{self.kind}]"


def _card_check(match: str) -> bool:
    digits = re.sub(r"[ -]", "", match)
    return 13 <= len(digits) <= 19 and luhn_valid(digits)


def _phone_check(match: str) -> bool:
    return 7 <= sum(ch.isdigit() for ch in match) <= 15  # E.164 allows at most 15 digits


# Order matters: a secret or an email may contain digit runs that look like phones or cards.
_BUILT_IN = {
    "secret": Rule("secret", _SECRETS),
    "email": Rule("email", _EMAIL),
    "card": Rule("card", _CARD, _card_check),
    "phone": Rule("phone", _PHONE, _phone_check),
}


# A marker already in a text (put there by an earlier rule, or by an earlier pass over the same
# value: a run's answer is its redacted deltas, redacted again) is never matched again, so a
# pattern that matches part of a marker cannot mangle it and a second pass changes nothing.
_MARKER = re.compile(rf"(\[REDACTED:(?:{'|'.join((*KINDS, 're'))})\])")
# A pattern is tried on this text at start: one that finds an empty match in it (``\b``, a
# lookahead alone, ``x*``) would put markers between characters, never around a value.
_PROBE_TEXT = "Ab 12, x_y-z.w@q.org\n(+1) [k=v]!"

# ``{3\x2c}``: a quantifier's comma written as an escape (an old workaround for commas in
# patterns), which the ``re`` module reads as the literal text ``{3,}``, not as a repetition.
_ESCAPED_QUANTIFIER_COMMA = re.compile(r"(?<!\\)\{\d*\\x2c\d*\}")


class RedactionConfigError(ValueError):
    """An ``AGENTLEDGER_REDACT`` value that names no detector or holds a bad pattern."""


def _entries(raw: str) -> list[str]:
    """``raw`` cut into its entries: at each comma, except that inside a ``re:`` pattern a
    comma followed by anything but a detector name, another ``re:`` or nothing (up to the next
    comma, spaces ignored) belongs to the pattern, so ``re:[0-9]{3,},email`` is the pattern
    ``[0-9]{3,}`` and the detector ``email``."""
    entries: list[str] = []
    for item in raw.split(","):
        word = item.strip()
        if entries and entries[-1].lstrip().startswith("re:") and word and (
                word not in _BUILT_IN and not word.startswith("re:")):
            _refuse_lookalike(word, entries[-1])
            entries[-1] += "," + item
        else:
            entries.append(item)
    return [entry.strip() for entry in entries if entry.strip()]


def _refuse_lookalike(word: str, pattern: str) -> None:
    """A misspelt detector or ``re:`` after a pattern would silently become part of the pattern
    (and redact nothing of its own): a word that looks like one is refused instead."""
    if word.lower().startswith("re:"):
        meant = "a second pattern (write re: in lower case)"
    elif re.fullmatch(r"[A-Za-z-]+", word) and (close := difflib.get_close_matches(
            word.lower().replace("-", ""), KINDS, n=1, cutoff=0.75)):
        meant = f"the detector {close[0]!r} (write it exactly so)"
    else:
        return
    raise RedactionConfigError(
        f"AGENTLEDGER_REDACT: {word!r} after the pattern {pattern.strip()!r} looks like "
        f"{meant}; to keep it in the pattern, write the comma before it as [,]")


def parse_rules(raw: str | None) -> tuple[Rule, ...]:
    """The rules named by an ``AGENTLEDGER_REDACT`` value (empty: no redaction)."""
    if raw is None or not raw.strip():
        return ()
    named, custom = set(), []
    for word in _entries(raw):
        if word.startswith("re:"):
            source = word[3:]
            if not source:
                raise RedactionConfigError("AGENTLEDGER_REDACT: re: needs a pattern after it")
            try:
                pattern = re.compile(source)
            except re.error as exc:
                raise RedactionConfigError(
                    f"AGENTLEDGER_REDACT: {word!r} is not a valid regular expression: {exc}"
                ) from None
            if pattern.search("") or any(
                    not m.group(0) for m in pattern.finditer(_PROBE_TEXT)):
                raise RedactionConfigError(
                    f"AGENTLEDGER_REDACT: {word!r} matches the empty string (it would put "
                    "markers between characters); make it match at least one character")
            if _ESCAPED_QUANTIFIER_COMMA.search(source):
                raise RedactionConfigError(
                    f"AGENTLEDGER_REDACT: {word!r} writes the comma of a {{m,n}} quantifier as "
                    "\\x2c, which makes the braces literal text; write the comma itself")
            custom.append(Rule("re", pattern))
        elif word in _BUILT_IN:
            named.add(word)
        else:
            raise RedactionConfigError(
                f"AGENTLEDGER_REDACT: unknown detector {word!r}; use a comma-separated list of "
                f"{', '.join(KINDS)} or re:<pattern>")
    return tuple(rule for kind, rule in _BUILT_IN.items() if kind in named) + tuple(custom)


class Redactor:
    """Applies its rules to text and to JSON values (string values, recursively).

    ``count`` accumulates the replacements made through this object, so a write path can
    create one per run (``for_run``) and store how many values it redacted.
    """

    def __init__(self, rules: tuple[Rule, ...] = ()):
        self.rules = rules
        self.count = 0

    @property
    def active(self) -> bool:
        return bool(self.rules)

    def for_run(self) -> Redactor:
        return Redactor(self.rules)

    def text(self, value: str) -> str:
        if not self.rules:
            return value
        for rule in self.rules:
            replace = self._replacer(rule)
            if "[REDACTED:" in value:  # only the text between markers is matched
                parts = _MARKER.split(value)  # markers at the odd indexes
                value = "".join(part if i % 2 else rule.pattern.sub(replace, part)
                                for i, part in enumerate(parts))
            else:
                value = rule.pattern.sub(replace, value)
        return value

    def _replacer(self, rule: Rule):
        def replace(match: re.Match[str]) -> str:
            if not match.group(0):
                return ""  # an empty match hides nothing (a pattern the start check let by)
            if rule.check is not None and not rule.check(match.group(0)):
                return match.group(0)
            self.count += 1
            return rule.marker
        return replace

    def value(self, value: Any) -> Any:
        """A JSON value with every string value redacted (keys are left as they are)."""
        if not self.rules:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        return value


NO_REDACTION = Redactor()


def redactor_of(session) -> Redactor:
    """The redactor for the rows a write session stores (set by ``Database.write``)."""
    found = session.info.get(SESSION_KEY)
    return found.for_run() if found is not None else Redactor()


class _RedactingRecords:
    """A log record factory that redacts each record's message (and traceback) when it is made,
    so no handler or formatter ever sees the unredacted text."""

    def __init__(self, previous, redactor: Redactor):
        self.previous, self.redactor = previous, redactor

    def __call__(self, *args, **kwargs) -> logging.LogRecord:
        record = self.previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is the logging module's to report
            return record
        record.msg, record.args = self.redactor.for_run().text(message), None
        if record.exc_info and not record.exc_text:
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_text = self.redactor.for_run().text(text)
        return record


def install_log_redaction(rules: tuple[Rule, ...]) -> None:
    """Redact every log line this process writes with ``rules`` (once per process)."""
    if not rules:
        return
    current = logging.getLogRecordFactory()
    if isinstance(current, _RedactingRecords):
        current.redactor = Redactor(rules)
        return
    logging.setLogRecordFactory(_RedactingRecords(current, Redactor(rules)))
