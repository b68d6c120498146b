"""The ``agentledger`` command: thin wrappers that parse arguments and call into the packages."""

from __future__ import annotations

import argparse
import functools
import sys

from agentledger.core.config import Settings, exit_status


def _database(settings: Settings):
    from agentledger.core.database import Database

    return Database.from_settings(settings)


def _cli_actor():
    import getpass

    from ingest.admin_log import Actor

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return Actor(name=f"cli:{user}", role="admin")


def record(*args, **kwargs):
    from ingest.admin_log import record as write

    return write(*args, **kwargs)


def cmd_db_upgrade(args, settings: Settings) -> int:
    from agentledger.agent_kinds.storage import setup_framework_storage
    from agentledger.core.migrate import current_revision, ensure_event_partitions, upgrade
    from agentledger.core.server_checks import maintenance_warning

    settings.check_database()
    upgrade(settings.database_url)
    print(f"database at revision {current_revision(settings.database_url)}")
    warning = maintenance_warning(settings.database_url)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    created = ensure_event_partitions(settings.database_url)
    if created:
        print(f"run_event partitions created: {', '.join(created)}")
    frameworks = setup_framework_storage(settings.database_url)
    if frameworks:
        print(f"framework tables ready: {', '.join(frameworks)}")
    return 0


def cmd_token_create(args, settings: Settings) -> int:
    from agentledger.core.migrate import upgrade
    from ingest.tokens import create_token

    settings.check_database()
    upgrade(settings.database_url)
    db = _database(settings)
    try:
        with db.write() as session:
            token_id, token = create_token(session, owner_id=args.owner, role=args.role)
            record(session, _cli_actor(), "token.created", "token", token_id,
                   {"owner": args.owner.strip(), "role": args.role})
    finally:
        db.dispose()
    print(f"created {args.role} token {token_id} for owner {args.owner.strip()}", file=sys.stderr)
    print(token)
    return 0


def cmd_token_revoke(args, settings: Settings) -> int:
    from ingest.tokens import revoke_token

    # It changes an existing token, so it never migrates: a database without the schema has
    # no tokens, which deserves its own sentence.
    settings.check_database(schema=True)
    db = _database(settings)
    try:
        with db.write() as session:
            revoke_token(session, args.token_id)
            record(session, _cli_actor(), "token.revoked", "token", args.token_id)
    finally:
        db.dispose()
    print(f"revoked {args.token_id}")
    return 0


def cmd_verify(args, settings: Settings) -> int:
    from queries.chain_verification import verify_chains

    if args.archive:
        from agentledger.archive import verify_archive_command

        return verify_archive_command(settings, args.archive)

    settings.check_database(schema=True, writes=False)  # a check only reads: never migrates
    db = _database(settings)

    def progress(n: int) -> None:
        print(f"  … {n} events checked", file=sys.stderr)

    try:
        with db.read(transaction=True) as session:
            report = verify_chains(session, run_id=args.run, progress=progress)
    finally:
        db.dispose()
    if args.run and report.runs_checked == 0:
        print(f"run {args.run} does not exist", file=sys.stderr)
        return 2
    for problem in report.problems:
        print(f"TAMPERED run {problem.run_id} seq {problem.seq}: {problem.problem}")
    for note in report.notes:
        print(f"NOTE {note}")
    damaged = len({problem.run_id for problem in report.problems})  # a run can have several
    verdict = "OK" if report.ok else f"{damaged} damaged run(s)"
    print(f"{verdict}: {report.runs_checked} runs, {report.events_checked} events checked")
    return 0 if report.ok else 1


def verify_bundle_command(path: str) -> int:
    """Offline: nothing but the file (no database, no settings)."""
    import json

    from agentledger.core.evidence_format import verify_bundle

    try:
        with open(path, encoding="utf-8") as handle:
            doc = json.load(handle)
    except (OSError, ValueError) as exc:
        print(f"agentledger: cannot read evidence bundle {path}: {exc}", file=sys.stderr)
        return 2
    report = verify_bundle(doc)
    for problem in report.problems:
        print(f"TAMPERED {problem}")
    for note in report.notes:
        print(f"NOTE {note}")
    verdict = "OK" if report.ok else f"{len(report.problems)} problem(s)"
    print(f"{verdict}: {report.runs_checked} runs, {report.events_checked} events checked")
    return 0 if report.ok else 1


def cmd_archive(args, settings: Settings) -> int:
    from agentledger.archive import archive_command

    # It moves existing records: a database that does not exist is a wrong URL, not nothing
    # to archive (and is not created for it).
    settings.check_database(schema=True, writes=not args.dry_run)
    return archive_command(settings, older_than_days=args.older_than_days, out=args.out,
                           batch_size=args.batch_size, dry_run=args.dry_run)


def cmd_serve(args, settings: Settings) -> int:
    from agentledger.server import serve

    return serve(settings, host=args.host, port=args.port, run_worker=not args.no_worker,
                 run_reconciler=not args.no_reconciler, demo=args.demo, workers=args.workers, threads=args.threads,
                 concurrency=args.concurrency)


def _check_worker_arguments(parser: argparse.ArgumentParser, args) -> None:
    """Refuse ``--api`` without ``--token`` and the reverse before anything opens a database:
    without ``--api`` the worker would first check (and for SQLite create) the database."""
    if (args.api is None) != (args.token is None):
        parser.error("--api and --token go together (an executor token for that server)")
    if args.api is not None and not args.api.startswith(("http://", "https://")):
        parser.error(f"--api must be an http:// or https:// URL, got {args.api!r}")
    if args.instance_id is not None:
        from agentledger.core.errors import ValidationFailed
        from ingest.leases import check_executor_instance_id

        try:
            check_executor_instance_id(args.instance_id)
        except ValidationFailed as exc:
            parser.error(f"--instance-id: {exc}")


def cmd_worker(args, settings: Settings) -> int:
    from agentledger.worker.process import run_worker_process

    if args.api is None:  # with --api it needs no database
        settings.check_database()
    return run_worker_process(settings, instance_id=args.instance_id, concurrency=args.concurrency,
                              api_url=args.api, token=args.token)


def cmd_reconcile(args, settings: Settings) -> int:
    from agentledger.worker.reconciler_loop import run_reconciler

    settings.check_database(schema=args.once)  # a one-off pass on nothing is a wrong URL
    return run_reconciler(settings, once=args.once)


def cmd_demo_seed(args, settings: Settings) -> int:
    from agentledger.demo import seed_command

    settings.check_database()
    return seed_command(settings, runs=args.runs, days=args.days, seed=args.seed)


def _whole_number(text: str, low: int, high: int | None = None, *, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if high is None and value < low:
        raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
    if high is not None and not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be {what} from {low} to {high}, got {value}")
    return value


def _at_least_one(text: str) -> int:
    """A count or size option: a whole number, 1 or more."""
    return _whole_number(text, 1, what="a whole number")


def _port(text: str) -> int:
    return _whole_number(text, 1, 65535, what="a port number")


MAX_DAYS = 36_500  # a century: any retention horizon an operator means


def _days(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of days, got {text!r}") from None
    if not 0 <= value <= MAX_DAYS:  # beyond it the horizon is before year 1: an overflow
        raise argparse.ArgumentTypeError(f"must be from 0 to {MAX_DAYS} days, got {text}")
    return value


def _seed_days(text: str) -> int:
    """Demo history reaches back at most ten years: the read routes' date filters start at 1900."""
    return _whole_number(text, 1, 3650, what="a whole number of days")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentledger",
        description="Audit ledger for AI-agent runs. The database comes from "
        "AGENTLEDGER_DATABASE_URL (default sqlite:///agentledger.db).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("serve", help="run the API, dashboards, worker and reconciler")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1, this machine only; "
                        "0.0.0.0 for every IPv4 interface)")
    p.add_argument("--port", type=_port, default=8050, help="port to listen on (default: 8050)")
    p.add_argument("--no-worker", action="store_true", help="do not execute runs in this process")
    p.add_argument("--no-reconciler", action="store_true",
                   help="do not reconcile expired leases in this process (it does by default, "
                        "also with --no-worker)")
    p.add_argument("--demo", action="store_true", help="seed demo data when the database is empty")
    p.add_argument("--workers", type=_at_least_one, default=None,
                   help="HTTP worker processes (gunicorn); default: one per CPU core on "
                        "PostgreSQL, 1 on SQLite")
    p.add_argument("--threads", type=_at_least_one, default=128,
                   help="threads per HTTP worker process (each open event stream uses one; "
                        "default: 128)")
    p.add_argument("--concurrency", type=_at_least_one, default=4,
                   help="runs executed at once by each in-process executor (default: 4)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("worker", help="a standalone executor process")
    p.add_argument("--instance-id", default=None,
                   help="stable id of this executor; on the database, runs it left unfinished "
                        "are interrupted (service_restart) when it starts again; with --api they "
                        "end lease_expired when their lease runs out")
    p.add_argument("--concurrency", type=_at_least_one, default=4,
                   help="runs executed at once (default: 4)")
    p.add_argument("--api", default=None, metavar="URL",
                   help="execute runs through this ledger server's executor routes, without "
                        "database access (needs --token)")
    p.add_argument("--token", default=None, help="an executor token of the --api server")
    p.set_defaults(func=cmd_worker, check=functools.partial(_check_worker_arguments, p))

    p = sub.add_parser("reconcile", help="interrupt runs whose lease expired or whose parent ended")
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.set_defaults(func=cmd_reconcile)

    db = sub.add_parser("db", help="database administration").add_subparsers(
        dest="db_command", required=True, metavar="ACTION"
    )
    p = db.add_parser("upgrade", help="apply migrations (idempotent)")
    p.set_defaults(func=cmd_db_upgrade)

    token = sub.add_parser("token", help="API tokens").add_subparsers(
        dest="token_command", required=True, metavar="ACTION"
    )
    p = token.add_parser("create", help="print a new API token as the last line of stdout")
    p.add_argument("--owner", required=True)
    p.add_argument("--role", default="user", choices=["user", "viewer", "executor", "admin"])
    p.set_defaults(func=cmd_token_create)
    p = token.add_parser("revoke", help="revoke a token by its id (tok_…)")
    p.add_argument("token_id")
    p.set_defaults(func=cmd_token_revoke)

    demo = sub.add_parser("demo", help="demo data").add_subparsers(
        dest="demo_command", required=True, metavar="ACTION"
    )
    p = demo.add_parser("seed", help="write realistic history through the ingest path")
    p.add_argument("--runs", type=_at_least_one, default=300,
                   help="root runs to write (default: 300)")
    p.add_argument("--days", type=_seed_days, default=14,
                   help="spread them over this many past days (default: 14)")
    p.add_argument("--seed", type=int, default=None, help="random seed (repeatable data)")
    p.set_defaults(func=cmd_demo_seed)

    p = sub.add_parser("archive", help="move old, finished run trees to compressed JSONL files")
    p.add_argument("--older-than-days", type=_days, required=True,
                   help="archive trees whose root run ended more than this many days ago")
    p.add_argument("--out", default="archive", help="directory for the archive files")
    p.add_argument("--batch-size", type=_at_least_one, default=500,
                   help="run trees per transaction (default: 500)")
    p.add_argument("--dry-run", action="store_true", help="only count what would be archived")
    p.set_defaults(func=cmd_archive)

    p = sub.add_parser("verify", help="check every stored event hash chain")
    # One thing is checked per call: the database (all of it or one run), an archive file or
    # an evidence bundle; naming two would leave one of them unchecked.
    what = p.add_mutually_exclusive_group()
    what.add_argument("--run", default=None, help="only this run")
    what.add_argument("--archive", default=None, metavar="FILE",
                      help="check an archive file written by agentledger archive instead")
    what.add_argument("--bundle", default=None, metavar="FILE",
                      help="check an evidence bundle (GET /api/messages/{id}/evidence) offline")
    p.set_defaults(func=cmd_verify)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "check", None) is not None:
        args.check(args)  # arguments that only go together; refused as the parser refuses
    if getattr(args, "bundle", None):
        # Offline: the file is all there is to it; no setting of this machine has a say (a
        # setting refused here would read as the bundle's verdict).
        return verify_bundle_command(args.bundle)
    return exit_status(lambda: args.func(args, Settings.from_env()))


if __name__ == "__main__":
    sys.exit(main())
