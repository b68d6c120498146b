"""Settings: one documented object built from the ``AGENTLEDGER_*`` environment variables."""

from __future__ import annotations

import os
import re
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

DEFAULT_DATABASE_URL = "sqlite:///agentledger.db"
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
SUPPORTED_DATABASES = ("sqlite (sqlite:///PATH) and postgresql+psycopg "
                       "(postgresql+psycopg://USER@HOST/DB)")
# How long the start-up check waits for PostgreSQL to answer: an address that drops packets
# would otherwise hold a command for the operating system's TCP timeout (minutes) before it
# says anything. A URL's own ``connect_timeout`` wins.
CONNECT_CHECK_TIMEOUT_SECONDS = 10
# What a claim may ask for (``ingest.leases``, the executor routes): its lease, in seconds (a
# process whose AGENTLEDGER_LEASE_SECONDS is outside them stops at start instead of having every
# claim refused), how many runs (an executor with more slots claims in turns), under what name.
MIN_LEASE_SECONDS = 1
MAX_LEASE_SECONDS = 3600
MAX_CLAIM = 100
MAX_INSTANCE_ID_LENGTH = 200  # what agent_run.executor_instance_id holds
# The longest interval any seconds setting may name: beyond it a timer cannot be computed
# (``inf`` or 1e10 seconds overflow a timestamp), and nothing an operator means is that long.
MAX_SETTING_SECONDS = 86_400
# The server's own words around the reason of a failed connection (psycopg / libpq), dropped
# so that the one line says only what went wrong.
_CONNECT_NOISE = re.compile(
    r'^(connection failed: )?(connection to server (at|on socket) "[^"]*"(, port \d+)? failed: )?'
    r"(FATAL: +)?")
_PASSWORD = re.compile(r"(://[^:/@]*:)[^@/]*@")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&]*", re.IGNORECASE)


class StartupError(Exception):
    """The configuration or the machine keeps a command from starting: a database that cannot
    be reached or has no schema, a port already taken. The operator fixes it, so the entry
    points print it as one line (``agentledger: …``, exit status 2), without a traceback."""


def exit_status(command: Callable[[], int | None]) -> int:
    """Run an entry point's work and return its exit status. What the operator fixes (a
    setting out of range, a database that cannot be used, a port taken) is one line on stderr,
    ``agentledger: …``, and exit status 2, the status of the parser's own refusals: ``verify``
    keeps 1 for a check that failed, so that a script never reads a setting as tampering."""
    try:
        return int(command() or 0)
    except KeyboardInterrupt:
        return 130
    except StartupError as exc:
        print(f"agentledger: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:
        if isinstance(exc.code, str):  # a setting refused with its sentence
            print(f"agentledger: {exc.code}", file=sys.stderr)
            return 2
        raise
    except Exception as exc:  # noqa: BLE001 - a CLI prints a sentence, not a traceback
        from agentledger.core.errors import LedgerError

        if isinstance(exc, LedgerError):
            print(f"agentledger: {exc.message}", file=sys.stderr)
            return 2
        raise


def _float_env(name: str, default: float, *, zero_ok: bool = False) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise SystemExit(f"{name} must be a number of seconds, got {raw!r}") from exc
    low_enough = value <= MAX_SETTING_SECONDS  # NaN fails both comparisons
    if not (low_enough and (value >= 0 if zero_ok else value > 0)):
        raise SystemExit(f"{name} must be {'0 or more' if zero_ok else 'positive'} and at most "
                         f"{MAX_SETTING_SECONDS} seconds, got {raw!r}")
    return value


def _count_env(name: str, default: int, *, minimum: int = 0, maximum: int) -> int:
    """A whole-number setting from ``minimum`` to ``maximum``; anything else stops the process
    naming the variable (the commands print it as one line)."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise SystemExit(f"{name} must be a whole number, got {raw!r}") from exc
    if not minimum <= value <= maximum:
        raise SystemExit(f"{name} must be from {minimum} to {maximum:,}, got {raw!r}")
    return value


def check_event_copy_batch() -> None:
    """``AGENTLEDGER_EVENT_COPY_BATCH``: events per copy statement when ``db upgrade`` converts
    ``run_event`` to partitions (migration 0013, which reads it when it runs; migrations import
    nothing of the project). Every command checks its range at start (``Settings.check``)."""
    _count_env("AGENTLEDGER_EVENT_COPY_BATCH", 200_000, minimum=1, maximum=10_000_000)


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _bool_env(name: str) -> bool:
    """A yes/no setting: 1, true, yes, on or 0, false, no, off, empty (any case); unset is no.
    Anything else stops the process: a misspelt "yes" must not quietly mean no."""
    raw = os.environ.get(name)
    if raw is None:
        return False
    word = raw.strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise SystemExit(f"{name} must be 1, true, yes or on (to turn it on), or 0, false, no, off "
                     f"or empty (to leave it off), got {raw!r}")


@dataclass(frozen=True)
class Settings:
    """Everything the processes need to know, with the contract's defaults. A yes/no setting
    is yes for 1, true, yes, on and no for 0, false, no, off or empty (any case); any other
    value stops the process at start, naming the variable, as does a number out of its range
    (every seconds setting at most ``MAX_SETTING_SECONDS``).

    database_url       AGENTLEDGER_DATABASE_URL        sqlite:///agentledger.db
    lease_seconds      AGENTLEDGER_LEASE_SECONDS       30
    heartbeat_seconds  AGENTLEDGER_HEARTBEAT_SECONDS   10
    reconcile_seconds  AGENTLEDGER_RECONCILE_SECONDS   5
    secret_key         AGENTLEDGER_SECRET_KEY          generated, stored beside the database
    sse_keepalive_seconds  AGENTLEDGER_SSE_KEEPALIVE_SECONDS  15 (idle SSE streams get a
                       ``: keep-alive`` comment at least this often)
    run_rate_limit     AGENTLEDGER_RUN_RATE_LIMIT      600 runs per owner per minute (0: off)
    read_database_url  AGENTLEDGER_READ_DATABASE_URL   unset: reads use the primary; else a
                       replica (a PostgreSQL hot standby) that API and dashboard reads use once
                       it has replayed what the primary had written when the read began, so a
                       client always reads its own writes; writers, executors and the
                       reconciler always read the primary
    read_replica_max_wait_ms  AGENTLEDGER_READ_REPLICA_MAX_WAIT_MS  100: how long a read waits
                       for a lagging replica to catch up before it reads the primary (0: no wait)
    read_replica_retry_seconds  AGENTLEDGER_READ_REPLICA_RETRY_SECONDS  5: after the replica
                       could not be reached (2 s connect timeout), reads use the primary for this
                       long before trying it again (one warning logged each time)
    secure_cookies     AGENTLEDGER_SECURE_COOKIES      unset; yes marks cookies Secure (HTTPS)
    redact             AGENTLEDGER_REDACT              unset: nothing redacted; else detectors
                       (email, phone, card, secret, re:<pattern>) applied before storing
    otlp_quiet_seconds AGENTLEDGER_OTLP_QUIET_SECONDS  60: an OTLP trace whose top agent span's
                       parent never arrived is written as a root run after this quiet period
    otlp_settle_seconds AGENTLEDGER_OTLP_SETTLE_SECONDS 0: an OTLP run tree is written as soon
                       as its top agent span and the chain above it are in; else only after
                       its trace received nothing for this long (spans of a trace may then
                       arrive in any order within it, the top agent span first included)
    metrics_public     AGENTLEDGER_METRICS_PUBLIC      unset; yes serves ``/metrics`` without a token
    checkpoint_types   AGENTLEDGER_CHECKPOINT_TYPES    unset: the checkpoint routes read only
                       LangGraph's safe types from executors; else ``package.module:Class``
                       entries (comma-separated) the server may also rebuild (their modules must
                       be importable by the server)
    """

    database_url: str = DEFAULT_DATABASE_URL
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 10.0
    reconcile_seconds: float = 5.0
    secret_key: str | None = None
    max_body_bytes: int = 1_048_576
    sse_poll_seconds: float = 0.1
    sse_keepalive_seconds: float = 15.0
    run_rate_limit: int = 600
    read_database_url: str | None = None
    read_replica_max_wait_ms: int = 100
    read_replica_retry_seconds: float = 5.0
    secure_cookies: bool = False
    redact: str = ""
    otlp_quiet_seconds: float = 60.0
    otlp_settle_seconds: float = 0.0
    metrics_public: bool = False
    checkpoint_types: str = ""
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_env(cls, **overrides) -> Settings:
        settings = cls(
            database_url=os.environ.get("AGENTLEDGER_DATABASE_URL") or DEFAULT_DATABASE_URL,
            lease_seconds=_float_env("AGENTLEDGER_LEASE_SECONDS", 30.0),
            heartbeat_seconds=_float_env("AGENTLEDGER_HEARTBEAT_SECONDS", 10.0),
            reconcile_seconds=_float_env("AGENTLEDGER_RECONCILE_SECONDS", 5.0),
            secret_key=os.environ.get("AGENTLEDGER_SECRET_KEY") or None,
            sse_keepalive_seconds=_float_env("AGENTLEDGER_SSE_KEEPALIVE_SECONDS", 15.0),
            run_rate_limit=_count_env("AGENTLEDGER_RUN_RATE_LIMIT", 600, maximum=1_000_000),
            read_database_url=os.environ.get("AGENTLEDGER_READ_DATABASE_URL") or None,
            read_replica_max_wait_ms=_count_env("AGENTLEDGER_READ_REPLICA_MAX_WAIT_MS", 100,
                                               maximum=60_000),
            read_replica_retry_seconds=_float_env("AGENTLEDGER_READ_REPLICA_RETRY_SECONDS", 5.0),
            secure_cookies=_bool_env("AGENTLEDGER_SECURE_COOKIES"),
            redact=os.environ.get("AGENTLEDGER_REDACT", ""),
            otlp_quiet_seconds=_float_env("AGENTLEDGER_OTLP_QUIET_SECONDS", 60.0),
            otlp_settle_seconds=_float_env("AGENTLEDGER_OTLP_SETTLE_SECONDS", 0.0,
                                           zero_ok=True),
            metrics_public=_bool_env("AGENTLEDGER_METRICS_PUBLIC"),
            checkpoint_types=os.environ.get("AGENTLEDGER_CHECKPOINT_TYPES", ""),
        )
        settings = replace(settings, **overrides)
        settings.check()
        return settings

    def redaction_rules(self):
        """The parsed ``AGENTLEDGER_REDACT`` rules; an invalid value stops the process."""
        from agentledger.core.redaction import RedactionConfigError, parse_rules

        try:
            return parse_rules(self.redact)
        except RedactionConfigError as exc:
            raise SystemExit(str(exc)) from None

    def checkpoint_type_allowlist(self) -> tuple[tuple[str, str], ...]:
        """``AGENTLEDGER_CHECKPOINT_TYPES`` as (module, class name) pairs: exact types, as
        LangGraph's serializer allows them (it has no prefix allowlist, on purpose)."""
        found = []
        for entry in (part.strip() for part in self.checkpoint_types.split(",")):
            if not entry:
                continue
            module, _, name = entry.partition(":")
            if not _DOTTED.match(module) or not _DOTTED.match(name) or "." in name:
                raise SystemExit(f"AGENTLEDGER_CHECKPOINT_TYPES entries are "
                                 f"\"package.module:Class\", got {entry!r}")
            found.append((module, name))
        return tuple(found)

    def check(self) -> None:
        """Refuse settings no process can work with (a clear error at start, not a run that
        loses its lease): an executor renews its leases every ``heartbeat_seconds``, so a
        heartbeat not below the lease lets every lease expire between two renewals."""
        if not MIN_LEASE_SECONDS <= self.lease_seconds <= MAX_LEASE_SECONDS:
            raise SystemExit(
                f"AGENTLEDGER_LEASE_SECONDS ({self.lease_seconds:g}) must be between "
                f"{MIN_LEASE_SECONDS} and {MAX_LEASE_SECONDS}: the lease a claim may ask for"
            )
        if self.heartbeat_seconds >= self.lease_seconds:
            raise SystemExit(
                f"AGENTLEDGER_HEARTBEAT_SECONDS ({self.heartbeat_seconds:g}) must be below "
                f"AGENTLEDGER_LEASE_SECONDS ({self.lease_seconds:g}): leases are renewed every "
                "heartbeat and would expire between two renewals"
            )
        if not 0 <= self.otlp_settle_seconds < self.otlp_quiet_seconds:
            raise SystemExit(
                f"AGENTLEDGER_OTLP_SETTLE_SECONDS ({self.otlp_settle_seconds:g}) must be at "
                f"least 0 and below AGENTLEDGER_OTLP_QUIET_SECONDS "
                f"({self.otlp_quiet_seconds:g}): a trace quiet that long is written anyway")
        self.redaction_rules()  # a bad AGENTLEDGER_REDACT stops the process at start
        check_event_copy_batch()
        self.checkpoint_type_allowlist()

    def check_database(self, *, schema: bool = False, writes: bool = True) -> None:
        """Raise ``StartupError`` unless ``AGENTLEDGER_DATABASE_URL`` is a supported database
        that accepts a connection and, with ``schema``, holds agentledger's tables.

        Commands call it before their first database access, so a wrong URL, a server that is
        down or a missing database is one sentence naming the variable, not a driver's
        traceback. ``schema`` is for commands that work on existing records (``verify``,
        ``token revoke``): they never migrate, and a SQLite file that does not exist is not
        created for them. ``writes``: the command writes, so a database that takes no writes
        (a hot standby given as the primary, a read-only file) is refused before it starts
        rather than failing at its first write. The read replica's URL is checked for its form
        only: while the replica cannot be reached, reads go to the primary."""
        url = _supported_url(self.database_url, "AGENTLEDGER_DATABASE_URL")
        if self.read_database_url:
            _supported_url(self.read_database_url, "AGENTLEDGER_READ_DATABASE_URL")
        where = f"the database at {shown_url(self.database_url)} (AGENTLEDGER_DATABASE_URL)"
        _check_connection(url, where, schema=schema, writes=writes)

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    def resolved_secret_key(self) -> str:
        """The configured key, else one generated once and kept in a file beside the database.

        Every process of a deployment must sign cookies with the same key, so a generated key is
        persisted rather than kept in memory.
        """
        if self.secret_key:
            return self.secret_key
        path = self._secret_key_path()
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            pass
        key = secrets.token_urlsafe(48)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(key)
        return key

    def _secret_key_path(self) -> Path:
        if self.is_sqlite:
            db_path = sqlite_path(self.database_url)
            if db_path is not None:
                return Path(db_path).resolve().parent / ".agentledger-secret-key"
        return Path.cwd() / ".agentledger-secret-key"


def sqlite_path(url: str) -> str | None:
    """The file of a ``sqlite:///path`` URL, or None for an in-memory database."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        return None
    path = url[len(prefix):].split("?", 1)[0]
    return path or None


def shown_url(url: str) -> str:
    """``url`` as it may be printed: its password hidden, also when it does not parse."""
    from sqlalchemy.engine import make_url

    try:
        shown = make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - any URL that does not parse is masked by hand
        shown = _PASSWORD.sub(r"\1***@", url)
    # libpq also takes the password as a query parameter (``?password=…``).
    return _QUERY_PASSWORD.sub(r"\1***", shown)


def _supported_url(url: str, variable: str) -> str:
    """``url`` in the form the engines use, or ``StartupError`` saying why it cannot be."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from agentledger.core.database import normalize_url

    normalized = normalize_url(url)
    try:
        parsed = make_url(normalized)
        parsed.port  # noqa: B018 - a port that is not a number fails here
    except (ArgumentError, ValueError):
        raise StartupError(f"{variable} is not a database URL ({shown_url(url)}): "
                           f"supported are {SUPPORTED_DATABASES}") from None
    if parsed.drivername not in ("sqlite", "postgresql+psycopg"):
        raise StartupError(f"{variable} names an unsupported database {parsed.drivername!r} "
                           f"({shown_url(url)}): supported are {SUPPORTED_DATABASES}")
    if parsed.drivername == "sqlite" and sqlite_path(normalized) is None:
        raise StartupError(f"{variable} names an in-memory SQLite database ({shown_url(url)}): "
                           "agentledger needs a file, sqlite:///PATH")
    return normalized


def _check_connection(url: str, where: str, *, schema: bool, writes: bool) -> None:
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.pool import NullPool

    path = sqlite_path(url)
    if path is not None and schema and not Path(path).exists():
        raise StartupError(f"{where} does not exist: create it with `agentledger db upgrade`")
    connect_args = {}
    if path is None and "connect_timeout" not in make_url(url).query:
        connect_args["connect_timeout"] = CONNECT_CHECK_TIMEOUT_SECONDS
    engine = create_engine(url, poolclass=NullPool, connect_args=connect_args)
    try:
        with engine.connect() as connection:
            # SQLite opens its file lazily: reading the catalogue is what finds a file that
            # is not a database.
            connection.execute(text("SELECT count(*) FROM sqlite_master" if path is not None
                                    else "SELECT 1"))
            migrated = not schema or MigrationContext.configure(
                connection).get_current_revision() is not None
            refusal = _refuses_writes(connection, path) if writes else None
    except DBAPIError as exc:
        verb = "open" if path is not None else "connect to"
        raise StartupError(f"cannot {verb} {where}: {_connect_failure(exc, path)}") from None
    finally:
        engine.dispose()
    if not migrated:
        raise StartupError(f"{where} has no agentledger schema (it was never migrated): "
                           "run `agentledger db upgrade` first")
    if refusal is not None:
        raise StartupError(f"{where} {refusal}")


def _refuses_writes(connection, path: str | None) -> str | None:
    """Why the database takes no writes, or None when it does."""
    from sqlalchemy import text

    if path is not None:
        file = Path(path)
        if file.exists() and not os.access(file, os.W_OK):
            return "is a read-only file: agentledger writes to it"
        if not os.access(file.parent, os.W_OK):
            return (f"is in a read-only directory ({file.parent}): SQLite writes its journal "
                    "beside the file")
        return None
    standby, read_only = connection.execute(text(
        "SELECT pg_is_in_recovery(), current_setting('transaction_read_only')")).one()
    if standby:
        return ("is a read-only standby (in recovery): AGENTLEDGER_DATABASE_URL must name the "
                "primary; a standby can serve reads as AGENTLEDGER_READ_DATABASE_URL")
    if read_only == "on":
        return "takes no writes (default_transaction_read_only is on): agentledger writes to it"
    return None


def _connect_failure(exc: BaseException, path: str | None) -> str:
    """The reason of a failed connection, in a few words: the driver's first line."""
    message = str(getattr(exc, "orig", None) or exc).strip()
    reason = _CONNECT_NOISE.sub("", message.splitlines()[0] if message else "").strip()
    reason = reason or type(exc).__name__
    if reason[:1].isupper() and reason[1:2].islower():  # "Connection refused", not "SSL …"
        reason = reason[0].lower() + reason[1:]
    if path is not None and not Path(path).parent.is_dir():
        reason += f" (no directory {Path(path).parent})"
    return reason
