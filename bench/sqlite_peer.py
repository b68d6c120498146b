"""The peer comparison on the embedded default: ``agentledger serve`` on a fresh SQLite file
against LangGraph's dev server, measured side by side in one run.

    python -m bench.sqlite_peer               # about 2 minutes (LangGraph installed on first use)
    python -m bench.sqlite_peer --skip-peer   # agentledger only
    python -m bench.sqlite_peer --smoke --skip-peer --out /tmp/x  # does it run? (seconds)

The workload is ``bench.peer_langgraph``'s (each client posts a message and reads its event
stream to the end; 1 client, then 10 and 50), with one ``serve`` process, what ``serve`` starts
on SQLite. The server CPU per run includes SQLite's own work, which runs in that process (on
PostgreSQL the database's CPU is not in the figure). Results: ``bench/results/sqlite-peer-
<time>.md`` and ``.json`` (``--out`` elsewhere); ``latest.md`` is the full PostgreSQL run's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench import peer_langgraph, report
from bench.common import Sizes, calibration_ms, log


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sqlite_peer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--skip-peer", action="store_true", help="do not run LangGraph (the peer)")
    p.add_argument("--smoke", action="store_true",
                   help="smallest sizes: does it run? (the test suite's; figures not comparable)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"),
                   help="directory for the results (default bench/results)")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="agentledger-sqlite-peer-"))
    url = f"sqlite:///{workdir / 'bench.db'}"
    started, started_at = time.perf_counter(), datetime.now(UTC)
    calibration_at_start = calibration_ms()
    sizes = Sizes.smoke() if args.smoke else Sizes()
    rows = peer_langgraph.run(url, workdir, sizes, skip_peer=args.skip_peer, workers=1)
    result = {
        "started_at": started_at.strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench.sqlite_peer " + " ".join(argv if argv is not None
                                                              else sys.argv[1:]),
        "seconds": round(time.perf_counter() - started, 1),
        "machine": {**report.machine_info(url),
                    "calibration_ms": [calibration_at_start, calibration_ms()]},
        "rows": report.rows_as_dicts(rows),
    }
    text = markdown(result)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = started_at.strftime("%Y%m%dT%H%M%SZ")
    (out / f"sqlite-peer-{stamp}.md").write_text(text)
    (out / f"sqlite-peer-{stamp}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(text)
    log(f"results: {out / f'sqlite-peer-{stamp}.md'}")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"# Trivial runs on SQLite — {result['started_at']}",
        "",
        f"`{result['command']}` ({result['seconds']:.0f} s); {m['cpus']} CPUs, Python "
        f"{m['python']}, SQLite {m.get('sqlite') or ''}, commit {m['git_commit']}, calibration "
        f"{m['calibration_ms'][0]} / {m['calibration_ms'][1]} ms (start / end).",
        "",
        "One `agentledger serve` process on a fresh SQLite file, its in-process executor running "
        "`echo` runs; each client posts a message and reads its event stream to the end. "
        "LangGraph's dev server runs the same clients in the same run.",
        "",
        "| path | unit | agentledger | LangGraph | ratio | target | result | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {report.row_cells(row)} |" for row in result["rows"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
