"""What reading a streaming replica costs: ``python -m bench.replica_gate --primary URL --standby URL``.

``--standby`` must be a hot standby of ``--primary`` (``pg_basebackup -R``). The primary is
migrated (``agentledger.core.migrate.upgrade``) and given one session to read. Then, in this
process, with ``time.perf_counter()`` around each call and ``--n`` calls per line after 50
warm-up calls:

- the two statements of the replica check alone: ``SELECT pg_current_wal_lsn()`` on the
  primary, and ``pg_last_wal_replay_lsn() >= …`` on the standby;
- one ``get_session`` read (``with db.read() as s``) on the primary without a replica, on the
  standby through the check, and with ``primary=True``;
- ``GET /api/sessions/{id}`` through the Flask test client (the caller's look-up and the read:
  one check per request) without and with the replica.

Nothing is asserted; the numbers go to stdout (median and p95, in milliseconds).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from agentledger.app_factory import create_app
from agentledger.core.config import Settings
from agentledger.core.database import Database
from agentledger.core.errors import Conflict
from agentledger.core.migrate import upgrade
from ingest.agents import AgentDefinition, register_agent
from ingest.sessions import create_session
from ingest.tokens import create_token
from queries.sessions import get_session


def _timed(fn: Callable[[], object], n: int) -> tuple[float, float]:
    for _ in range(50):
        fn()
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.95) - 1]


def _wait_replayed(db: Database) -> None:
    gate = db.replica_gate
    lsn = gate.target()
    with db.read_engine.connect() as connection:
        deadline = time.monotonic() + 60
        while not gate.caught_up(connection, lsn):
            if time.monotonic() > deadline:
                raise SystemExit("the standby did not replay the primary's WAL within 60 s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--primary", required=True)
    parser.add_argument("--standby", required=True)
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args(argv)

    upgrade(args.primary)
    plain = Database(args.primary)
    replicated = Database(args.primary, args.standby)
    try:
        with plain.write() as s:
            register_agent(s, "bench-echo", AgentDefinition(name="Echo", kind="echo"))
    except Conflict:
        pass  # an earlier run registered it
    with plain.write() as s:
        session_id = create_session(s, owner_id="bench", agent_id="bench-echo", title="bench")
        _, token = create_token(s, owner_id="bench", role="user")
    _wait_replayed(replicated)

    gate = replicated.replica_gate
    lsn = gate.target()
    lines: list[tuple[str, tuple[float, float]]] = []
    lines.append(("primary: SELECT pg_current_wal_lsn()", _timed(gate.target, args.n)))
    with replicated.read_engine.connect() as connection:
        lines.append(("standby: replay LSN reached?",
                      _timed(lambda: gate.caught_up(connection, lsn), args.n)))
        connection.commit()

    def read(db: Database, **kw) -> Callable[[], object]:
        def once():
            with db.read(**kw) as s:
                return get_session(s, session_id, visible_to=None)
        return once

    lines.append(("db.read(): primary, no replica configured", _timed(read(plain), args.n)))
    lines.append(("db.read(): standby, after the check", _timed(read(replicated), args.n)))
    lines.append(("db.read(primary=True) with a replica",
                  _timed(read(replicated, primary=True), args.n)))

    auth = {"Authorization": f"Bearer {token}"}
    for name, db, read_url in (("no replica", plain, None), ("standby", replicated, args.standby)):
        settings = Settings(database_url=args.primary, read_database_url=read_url,
                            secret_key="bench")
        app = create_app(settings, database=db, dashboards=False)
        client = app.test_client()

        def get(client=client):
            response = client.get(f"/api/sessions/{session_id}", headers=auth)
            assert response.status_code == 200, response.get_data()
        lines.append((f"GET /api/sessions/{{id}}, {name}", _timed(get, args.n)))
        app.extensions["agentledger"].notifier.stop()

    print(f"{'what':<48} {'median ms':>10} {'p95 ms':>8}   (n={args.n})")
    for name, (median, p95) in lines:
        print(f"{name:<48} {median:>10.3f} {p95:>8.3f}")
    plain.dispose()
    replicated.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
