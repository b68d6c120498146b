"""Operator mistakes end in one line on stderr and exit status 2, never a traceback: a wrong or
unreachable database, a database without the schema, an unreadable archive file, arguments out
of range, a port already taken. Errors that are not the operator's still raise."""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import func, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from support.ledger import fresh_database
from support.ports import free_port

from agentledger import __version__
from agentledger.cli import main
from agentledger.core.config import StartupError
from agentledger.core.database import Database, normalize_url
from agentledger.core.hashing import token_hash
from agentledger.core.migrate import alembic_config, current_revision, upgrade
from agentledger.core.schema import ApiToken
from agentledger.server import check_can_listen

HEAD = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
SUPPORTED = ("supported are sqlite (sqlite:///PATH) and postgresql+psycopg "
             "(postgresql+psycopg://USER@HOST/DB)")


def _cli(db_url: str, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
    environment.update(AGENTLEDGER_DATABASE_URL=db_url, AGENTLEDGER_SECRET_KEY="cli-test",
                       PYTHONWARNINGS="ignore", **env)
    return subprocess.run([sys.executable, "-m", "agentledger.cli", *args], env=environment,
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def _one_line(done: subprocess.CompletedProcess, expected: str) -> None:
    """The command printed ``agentledger: <expected>`` alone on stderr and exited 2."""
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr == f"agentledger: {expected}\n", done.stderr
    assert done.returncode == 2
    assert done.stdout == ""


def _empty_archive(tmp_path: Path) -> Path:
    path = tmp_path / "empty.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8"):
        pass
    return path


def _libpq(url: str) -> str:
    return make_url(normalize_url(url)).set(drivername="postgresql").render_as_string(
        hide_password=False)


# ---- the database URL ------------------------------------------------------------------------


COMMANDS = {
    "db upgrade": ["db", "upgrade"],
    "serve": ["serve", "--port", "{port}", "--workers", "1"],
    "worker": ["worker"],
    "token create": ["token", "create", "--owner", "alice"],
    "token revoke": ["token", "revoke", "tok_x"],
    "verify": ["verify"],
    "verify --archive": ["verify", "--archive", "{archive}"],
    "reconcile": ["reconcile", "--once"],
    "archive": ["archive", "--older-than-days", "30", "--out", "{tmp}"],
    "demo seed": ["demo", "seed", "--runs", "1"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unreachable_database_is_one_line_in_every_command(command, tmp_path):
    closed = free_port()  # nothing listens there
    url = f"postgresql+psycopg://postgres:s3cret@127.0.0.1:{closed}/nope"
    args = [a.format(port=free_port(), archive=_empty_archive(tmp_path), tmp=tmp_path)
            for a in COMMANDS[command]]
    done = _cli(url, *args, cwd=tmp_path)
    _one_line(done, f"cannot connect to the database at postgresql+psycopg://postgres:***@"
                    f"127.0.0.1:{closed}/nope (AGENTLEDGER_DATABASE_URL): connection refused")


def test_a_missing_postgresql_database_is_named(pg_database_url, tmp_path):
    absent = f"agentledger_absent_{uuid.uuid4().hex[:8]}"
    url = make_url(pg_database_url).set(database=absent).render_as_string(hide_password=False)
    done = _cli(url, "db", "upgrade", cwd=tmp_path)
    shown = make_url(url).render_as_string(hide_password=True)
    _one_line(done, f"cannot connect to the database at {shown} (AGENTLEDGER_DATABASE_URL): "
                    f'database "{absent}" does not exist')


@pytest.mark.parametrize("case", ["no directory", "not a url", "mysql", "bad port", "in memory",
                                  "not a database file", "bad read url"])
def test_database_url_mistakes_are_named(case, tmp_path):
    env = {}
    if case == "no directory":
        url = f"sqlite:///{tmp_path}/missing/agentledger.db"
        expected = (f"cannot open the database at {url} (AGENTLEDGER_DATABASE_URL): unable to "
                    f"open database file (no directory {tmp_path}/missing)")
    elif case == "not a url":
        url = "notaurl"
        expected = f"AGENTLEDGER_DATABASE_URL is not a database URL (notaurl): {SUPPORTED}"
    elif case == "mysql":
        url = "mysql://ops:s3cret@db.example/ledger"
        expected = ("AGENTLEDGER_DATABASE_URL names an unsupported database 'mysql' "
                    f"(mysql://ops:***@db.example/ledger): {SUPPORTED}")
    elif case == "bad port":
        url = "postgresql://ops:s3cret@db.example:fivefourthreetwo/ledger"
        expected = ("AGENTLEDGER_DATABASE_URL is not a database URL "
                    f"(postgresql://ops:***@db.example:fivefourthreetwo/ledger): {SUPPORTED}")
    elif case == "in memory":
        url = "sqlite://"
        expected = ("AGENTLEDGER_DATABASE_URL names an in-memory SQLite database (sqlite://): "
                    "agentledger needs a file, sqlite:///PATH")
    elif case == "not a database file":
        (tmp_path / "notes.txt").write_text("not a database, but long enough to be read " * 20)
        url = f"sqlite:///{tmp_path}/notes.txt"
        expected = (f"cannot open the database at {url} (AGENTLEDGER_DATABASE_URL): "
                    "file is not a database")
    else:
        url = f"sqlite:///{tmp_path}/agentledger.db"
        env["AGENTLEDGER_READ_DATABASE_URL"] = "replica"
        expected = f"AGENTLEDGER_READ_DATABASE_URL is not a database URL (replica): {SUPPORTED}"
    done = _cli(url, "db", "upgrade", cwd=tmp_path, **env)
    _one_line(done, expected)
    assert "s3cret" not in done.stderr


def test_a_database_error_after_start_up_is_not_turned_into_a_sentence(db_url, monkeypatch):
    import agentledger.core.migrate

    def broken(url, revision="head"):
        raise OperationalError("ALTER TABLE agent_run …", {}, RuntimeError("disk full"))

    monkeypatch.setenv("AGENTLEDGER_DATABASE_URL", db_url)
    monkeypatch.setattr(agentledger.core.migrate, "upgrade", broken)
    with pytest.raises(OperationalError, match="disk full"):
        main(["db", "upgrade"])


# ---- a database migrated by a newer agentledger ----------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def newer_database_url(request, tmp_path):
    """A database at a schema revision this package has no migration for: a newer agentledger
    migrated it, then the package was rolled back."""
    if request.param == "postgresql":
        request.getfixturevalue("pg_database_url")  # skips (or fails) without PostgreSQL
    with fresh_database(request.param, tmp_path) as url:
        upgrade(url)
        db = Database(url)
        try:
            with db.engine.begin() as conn:
                conn.exec_driver_sql("UPDATE alembic_version SET version_num = '0999'")
        finally:
            db.dispose()
        yield url


@pytest.mark.parametrize("command", ["db upgrade", "serve", "worker"])
def test_a_database_a_newer_agentledger_migrated_is_one_line(command, newer_database_url,
                                                             tmp_path):
    args = [a.format(port=free_port(), tmp=tmp_path) for a in COMMANDS[command]]
    done = _cli(newer_database_url, *args, cwd=tmp_path)
    shown = make_url(newer_database_url).render_as_string(hide_password=True)
    _one_line(done, f"the database at {shown} (AGENTLEDGER_DATABASE_URL) is at schema revision "
                    f"0999, newer than this agentledger {__version__} knows (its newest is "
                    f"{HEAD}): upgrade agentledger to the version that migrated it")
    assert current_revision(newer_database_url) == "0999"  # left as it was


# ---- a database without the schema -----------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def unmigrated_url(request, tmp_path):
    """An existing database of each kind that was never migrated."""
    if request.param == "sqlite":
        path = tmp_path / "unmigrated.db"
        path.touch()
        yield f"sqlite:///{path}"
        return
    server = request.getfixturevalue("pg_database_url")
    name = f"agentledger_unmigrated_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(_libpq(server), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield make_url(server).set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(_libpq(server), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.parametrize("command", ["verify", "verify --archive", "token revoke"])
def test_commands_on_existing_records_ask_for_a_migration(command, unmigrated_url, tmp_path):
    args = [a.format(archive=_empty_archive(tmp_path)) for a in COMMANDS[command]]
    done = _cli(unmigrated_url, *args, cwd=tmp_path)
    shown = make_url(unmigrated_url).render_as_string(hide_password=True)
    _one_line(done, f"the database at {shown} (AGENTLEDGER_DATABASE_URL) has no agentledger "
                    "schema (it was never migrated): run `agentledger db upgrade` first")
    assert current_revision(unmigrated_url) is None  # they check, they do not migrate


def test_verify_does_not_create_a_missing_sqlite_file(tmp_path):
    url = f"sqlite:///{tmp_path}/agentledger.db"
    done = _cli(url, "verify", cwd=tmp_path)
    _one_line(done, f"the database at {url} (AGENTLEDGER_DATABASE_URL) does not exist: create "
                    "it with `agentledger db upgrade`")
    assert not (tmp_path / "agentledger.db").exists()


@pytest.mark.parametrize("command", ["archive", "reconcile"])
def test_maintenance_on_a_missing_sqlite_file_is_a_wrong_url_not_nothing_to_do(command, tmp_path):
    # (they created and migrated an empty file and reported 0 trees archived, 0 runs reconciled)
    url = f"sqlite:///{tmp_path}/agentledger.db"
    args = [a.format(tmp=tmp_path / "out") for a in COMMANDS[command]]
    done = _cli(url, *args, cwd=tmp_path)
    _one_line(done, f"the database at {url} (AGENTLEDGER_DATABASE_URL) does not exist: create "
                    "it with `agentledger db upgrade`")
    assert not (tmp_path / "agentledger.db").exists()


def test_a_password_in_the_query_string_is_not_shown(tmp_path):
    closed = free_port()
    url = f"postgresql+psycopg://postgres@127.0.0.1:{closed}/nope?password=Sup3rSecret"
    done = _cli(url, "verify", cwd=tmp_path)
    _one_line(done, f"cannot connect to the database at postgresql+psycopg://postgres@127.0.0.1:"
                    f"{closed}/nope?password=*** (AGENTLEDGER_DATABASE_URL): connection refused")


@pytest.fixture(params=["sqlite", "postgresql"])
def read_only_url(request, tmp_path):
    """A migrated database with a token row that takes no writes: an immutable SQLite file, or
    a PostgreSQL database whose transactions are read-only by default."""
    if request.param == "postgresql":
        request.getfixturevalue("pg_database_url")  # skips (or fails) without PostgreSQL
    with fresh_database(request.param, tmp_path) as url:
        assert _cli(url, "token", "create", "--owner", "alice", cwd=tmp_path).returncode == 0
        if request.param == "sqlite":
            path = Path(make_url(url).database or "")
            for suffix in ("-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            subprocess.run(["chattr", "+i", str(path)], check=True)
            try:
                yield url, "is a read-only file: agentledger writes to it"
            finally:
                subprocess.run(["chattr", "-i", str(path)], check=True)
            return
        with psycopg.connect(_libpq(url), autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{make_url(url).database}" '
                         "SET default_transaction_read_only = on")
        yield url, ("takes no writes (default_transaction_read_only is on): agentledger writes "
                    "to it")


@pytest.mark.parametrize("command", ["db upgrade", "token create", "token revoke", "serve",
                                     "reconcile", "demo seed"])
def test_a_database_that_takes_no_writes_is_one_line_and_verify_still_reads_it(
        command, read_only_url, tmp_path):
    # (each command ended in a traceback at its first write: ReadOnlySqlTransaction, "attempt
    # to write a readonly database")
    url, refusal = read_only_url
    args = [a.format(port=free_port(), tmp=tmp_path) for a in COMMANDS[command]]
    done = _cli(url, *args, cwd=tmp_path)
    shown = make_url(url).render_as_string(hide_password=True)
    _one_line(done, f"the database at {shown} (AGENTLEDGER_DATABASE_URL) {refusal}")
    checked = _cli(url, "verify", cwd=tmp_path)
    assert checked.returncode == 0 and checked.stdout.startswith("OK"), checked
    checked = _cli(url, "verify", "--archive", str(_empty_archive(tmp_path)), cwd=tmp_path)
    assert checked.returncode == 0 and "\nOK: 0 archived runs" in checked.stdout, checked
    checked = _cli(url, "archive", "--older-than-days", "1", "--dry-run", cwd=tmp_path)
    assert checked.returncode == 0, checked


def test_an_offline_bundle_check_needs_no_settings(tmp_path):
    # (a setting out of range stopped it with exit status 1, which says "tampered")
    missing = tmp_path / "bundle.json"
    done = _cli(f"sqlite:///{tmp_path}/unused.db", "verify", "--bundle", str(missing),
                cwd=tmp_path, AGENTLEDGER_LEASE_SECONDS="0", AGENTLEDGER_METRICS_PUBLIC="maybe")
    assert done.returncode == 2 and "cannot read evidence bundle" in done.stderr, done.stderr


# ---- archive files ---------------------------------------------------------------------------


def _write_gzip(path: Path, data: bytes) -> Path:
    path.write_bytes(gzip.compress(data))
    return path


@pytest.mark.parametrize("case", ["not gzip", "cut short", "not json", "not runs", "missing"])
def test_an_unreadable_archive_file_is_one_line(case, tmp_path):
    path = tmp_path / "archive.jsonl.gz"
    if case == "not gzip":
        path = tmp_path / "notgzip.json"
        path.write_text(json.dumps({"run": {"id": "run_1"}}))
        reason = "not gzip data (archives are .jsonl.gz files)"
    elif case == "cut short":
        path.write_bytes(gzip.compress(b'{"run": {"id": "run_1"}, "events": []}\n')[:20])
        reason = ("the compressed data is broken: Compressed file ended before the "
                  "end-of-stream marker was reached")
    elif case == "not json":
        _write_gzip(path, b'{"run": {"id": "run_1"}, "events": []}\nnot json\n')
        reason = "record 2 is not a JSON line: Expecting value: line 1 column 1 (char 0)"
    elif case == "not runs":
        _write_gzip(path, b"[1, 2, 3]\n")
        reason = "record 1 is not a run record"
    else:
        reason = "no such file or directory"
    # The file is read before the database is opened: none is needed to refuse it.
    done = _cli(f"sqlite:///{tmp_path}/unused.db", "verify", "--archive", str(path),
                cwd=tmp_path)
    _one_line(done, f"cannot read archive file {path}: {reason}")


def test_a_malformed_archive_record_is_a_damaged_run(db_url, tmp_path):
    path = _write_gzip(tmp_path / "archive.jsonl.gz",
                       b'{"run": {"id": "run_1", "last_event_seq": 0}}\n')
    done = _cli(db_url, "verify", "--archive", str(path), cwd=tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0] == "TAMPERED run run_1: malformed record: the field 'events' is missing"
    assert lines[-1] == f"1 problem(s) in 1 run(s): 1 archived runs, 0 events checked in {path}"


def test_a_dry_run_shows_no_progress_bar(db_url, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AGENTLEDGER_DATABASE_URL", db_url)
    assert main(["archive", "--older-than-days", "30", "--out", str(tmp_path), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "0 run tree(s) ended before" in out
    assert "tree" not in err and "archive" not in err, err


# ---- arguments -------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "message"), [
    (["demo", "seed", "--runs", "-5"], "argument --runs: must be at least 1, got -5"),
    (["demo", "seed", "--days", "0"],
     "argument --days: must be a whole number of days from 1 to 3650, got 0"),
    (["demo", "seed", "--days", "100000"],
     "argument --days: must be a whole number of days from 1 to 3650, got 100000"),
    (["demo", "seed", "--runs", "many"], "argument --runs: must be a whole number, got 'many'"),
    (["serve", "--workers", "0"], "argument --workers: must be at least 1, got 0"),
    (["serve", "--threads", "0"], "argument --threads: must be at least 1, got 0"),
    (["serve", "--port", "70000"],
     "argument --port: must be a port number from 1 to 65535, got 70000"),
    (["worker", "--concurrency", "0"], "argument --concurrency: must be at least 1, got 0"),
    (["worker", "--token", "x"],
     "--api and --token go together (an executor token for that server)"),
    (["worker", "--api", "http://127.0.0.1:1"],
     "--api and --token go together (an executor token for that server)"),
    (["worker", "--api", "not-a-url", "--token", "t"],
     "--api must be an http:// or https:// URL, got 'not-a-url'"),
    (["worker", "--instance-id", ""],
     "--instance-id: executor_instance_id must be 1 to 200 characters"),
    (["worker", "--instance-id", "w" * 201],
     "--instance-id: executor_instance_id must be 1 to 200 characters"),
    (["worker", "--instance-id", "otlp:checkout"],
     "--instance-id: executor_instance_id must not start with 'otlp:': that prefix names the "
     "services whose runs were recorded from their traces"),
    (["archive", "--older-than-days", "-1"],
     "argument --older-than-days: must be from 0 to 36500 days, got -1"),
    (["archive", "--older-than-days", "99999999"],
     "argument --older-than-days: must be from 0 to 36500 days, got 99999999"),
    (["archive", "--older-than-days", "1", "--batch-size", "0"],
     "argument --batch-size: must be at least 1, got 0"),
    (["verify", "--run", "run_1", "--bundle", "b.json"],
     "argument --bundle: not allowed with argument --run"),
    (["verify", "--run", "run_1", "--archive", "a.gz"],
     "argument --archive: not allowed with argument --run"),
    (["verify", "--archive", "a.gz", "--bundle", "b.json"],
     "argument --bundle: not allowed with argument --archive"),
], ids=lambda value: " ".join(value) if isinstance(value, list) else "refused")
def test_arguments_out_of_range_are_refused_by_the_parser(args, message, tmp_path, monkeypatch,
                                                          capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AGENTLEDGER_DATABASE_URL", f"sqlite:///{tmp_path}/agentledger.db")
    with pytest.raises(SystemExit) as stopped:
        main(args)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].endswith(f": error: {message}"), err
    assert not (tmp_path / "agentledger.db").exists()  # refused before anything ran


@pytest.mark.parametrize(("lease", "heartbeat", "message"), [
    ("5000", "10", "AGENTLEDGER_LEASE_SECONDS (5000) must be between 1 and 3600: the lease a "
                   "claim may ask for"),
    ("0.5", "0.1", "AGENTLEDGER_LEASE_SECONDS (0.5) must be between 1 and 3600: the lease a "
                   "claim may ask for"),
    ("10", "10", "AGENTLEDGER_HEARTBEAT_SECONDS (10) must be below AGENTLEDGER_LEASE_SECONDS "
                 "(10): leases are renewed every heartbeat and would expire between two "
                 "renewals"),
])
def test_lease_settings_no_executor_can_work_with_stop_every_command_at_start(
        lease, heartbeat, message, tmp_path):
    # A worker started with them would have every claim refused, or lose every lease.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
    env.update(AGENTLEDGER_LEASE_SECONDS=lease, AGENTLEDGER_HEARTBEAT_SECONDS=heartbeat,
               PYTHONWARNINGS="ignore", AGENTLEDGER_DATABASE_URL=f"sqlite:///{tmp_path}/l.db")
    done = subprocess.run([sys.executable, "-m", "agentledger.cli", "worker"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    _one_line(done, message)
    assert not (tmp_path / "l.db").exists()


@pytest.mark.parametrize(("name", "value", "message"), [
    ("AGENTLEDGER_LEASE_SECONDS", "abc", "must be a number of seconds, got 'abc'"),
    ("AGENTLEDGER_RECONCILE_SECONDS", "0", "must be positive and at most 86400 seconds, got '0'"),
    # Past a day no timer can be computed: the reconciler's thread died of an OverflowError.
    ("AGENTLEDGER_RECONCILE_SECONDS", "1e10",
     "must be positive and at most 86400 seconds, got '1e10'"),
    ("AGENTLEDGER_RECONCILE_SECONDS", "inf",
     "must be positive and at most 86400 seconds, got 'inf'"),
    ("AGENTLEDGER_SSE_KEEPALIVE_SECONDS", "nan",
     "must be positive and at most 86400 seconds, got 'nan'"),
    ("AGENTLEDGER_OTLP_SETTLE_SECONDS", "-1",
     "must be 0 or more and at most 86400 seconds, got '-1'"),
    ("AGENTLEDGER_RUN_RATE_LIMIT", "-1", "must be from 0 to 1,000,000, got '-1'"),
    ("AGENTLEDGER_READ_REPLICA_MAX_WAIT_MS", "1e3", "must be a whole number, got '1e3'"),
    ("AGENTLEDGER_READ_REPLICA_MAX_WAIT_MS", "3600000", "must be from 0 to 60,000, got '3600000'"),
    # Read by a migration, yet checked by every command: it raised from the migration's module
    # on loading it, a traceback for any command on any database.
    ("AGENTLEDGER_EVENT_COPY_BATCH", "abc", "must be a whole number, got 'abc'"),
    ("AGENTLEDGER_EVENT_COPY_BATCH", "0", "must be from 1 to 10,000,000, got '0'"),
])
def test_settings_out_of_range_stop_every_command_at_start(name, value, message, tmp_path,
                                                           monkeypatch, capsys):
    monkeypatch.setenv("AGENTLEDGER_DATABASE_URL", f"sqlite:///{tmp_path}/s.db")
    monkeypatch.setenv(name, value)
    assert main(["token", "create", "--owner", "someone"]) == 2
    assert capsys.readouterr().err == f"agentledger: {name} {message}\n"
    assert not (tmp_path / "s.db").exists()


@pytest.mark.parametrize("owner", ["", "   ", "two\nlines", "bell\x07", "o" * 201])
def test_an_owner_id_no_list_or_log_could_show_is_refused(owner, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AGENTLEDGER_DATABASE_URL", f"sqlite:///{tmp_path}/o.db")
    assert main(["token", "create", "--owner", owner]) == 2
    out, err = capsys.readouterr()
    assert err == "agentledger: owner must be 1 to 200 printable characters\n" and out == ""
    assert _tokens(f"sqlite:///{tmp_path}/o.db") == 0


def test_serve_help_names_host_and_port_and_their_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--host HOST address to listen on (default: 127.0.0.1" in help_text
    assert "--port PORT port to listen on (default: 8050)" in help_text


# ---- serve: the port and the login link -----------------------------------------------------


def _listening(port: int) -> socket.socket:
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", port))
    holder.listen()
    return holder


def _tokens(db_url: str) -> int:
    db = Database(db_url)
    try:
        with db.read() as s:
            return s.execute(select(func.count()).select_from(ApiToken)).scalar_one()
    finally:
        db.dispose()


def test_serve_on_a_port_in_use_says_so_before_printing_or_creating_anything(db_url, tmp_path):
    port = free_port()
    before = _tokens(db_url)
    with _listening(port):
        done = _cli(db_url, "serve", "--port", str(port), "--workers", "1", "--no-worker",
                    cwd=tmp_path)
    _one_line(done, f"cannot listen on 127.0.0.1:{port}: address already in use")
    assert _tokens(db_url) == before  # no login link, so no admin token


def test_the_port_check_binds_as_gunicorn_does():
    port = free_port()
    with _listening(port) as holder:
        with pytest.raises(StartupError, match="address already in use"):
            check_can_listen(f"127.0.0.1:{port}")
        # A connection the server side closes first leaves the port in TIME_WAIT once the
        # listener is gone: gunicorn (SO_REUSEADDR) binds it again, so the check must too.
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = holder.accept()
        accepted.close()
        client.recv(1)
        client.close()
    check_can_listen(f"127.0.0.1:{port}")
    check_can_listen(f"127.0.0.1:{port}")  # the check let the port go again


def test_serve_prints_the_id_of_the_login_links_token(db_url, procs):
    server = procs.serve(db_url)
    log = server.log()
    link = re.search(r"^admin login: (\S+)$", log, re.MULTILINE)
    shown = re.search(r"^admin login token id: (tok_\w+) ", log, re.MULTILINE)
    assert link and shown, log
    token = link.group(1).split("login?token=", 1)[1]
    db = Database(db_url)
    try:
        with db.read() as s:
            row = s.execute(select(ApiToken.token_hash, ApiToken.owner_id, ApiToken.role)
                            .where(ApiToken.id == shown.group(1))).one()
    finally:
        db.dispose()
    assert tuple(row) == (token_hash(token), "admin", "admin")
    revoked = procs.run(["token", "revoke", shown.group(1)], procs.environment(db_url))
    assert revoked.returncode == 0, revoked.stderr
