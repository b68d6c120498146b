"""Flat reads as history grows: the hot reads at 1M runs and again at 5M (PostgreSQL).

``python -m bench.flat_reads --db URL [--sizes 1000000,5000000] [--reload]``

History grows the way a deployment's does: the first size is loaded over the last 30 days, each
further size adds older history at the same daily rate (5M runs = 150 days), so recent windows
hold the same runs at every size and only the total grows. After each load (``VACUUM ANALYZE``)
the reads of ``bench.reads`` run in-process (``queries`` functions, the same the API serves; the
HTTP layer adds the same cost at every size), and the storage per event is measured.

The goal (each read's p95 at the largest size ≤ 1.5× its p95 at the smallest) is judged on the
hot reads: point reads (provenance, run, events page, tree) of runs and answers created in the
last 30 days, the same rows at every size, each sampled id read once before the timed calls,
as a deployment's page cache holds what it serves; lists and outcomes read recent windows. Cold
point reads (ids from all history, mostly read for the first time) are measured before them and
reported beside them: they show how much of the history the machine's memory holds, not how
the layout scales. Results go to ``bench/results/flat-reads-<stamp>.md``.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from sqlalchemy import text

from agentledger import demo
from agentledger.core.config import Settings
from agentledger.core.database import Database
from bench import reads
from bench.common import Sizes, is_postgres, libpq, log
from bench.dataset import analyze, counts, prepare

DAYS_PER_MILLION = 30
RUNS_PER_ROOT = 1.95
GOAL = 1.5
POINT_READS = ("provenance", "run", "events page of 100", "run tree")


def load_to(url: str, runs: int, now: datetime) -> dict:
    """Add older history until the database holds ``runs`` runs; what was loaded, and how fast."""
    db = Database(url)
    try:
        before = counts(db)
        with db.read() as s:
            oldest, held_roots = s.execute(text(
                "SELECT min(created_at), count(*) FILTER (WHERE parent_run_id IS NULL) "
                "FROM agent_run")).one()
    finally:
        db.dispose()
    missing = runs - before["agent_run"]
    if missing <= 0:
        return {"runs_added": 0, "seconds": 0.0, "events_per_second": None}
    days = max(1, round(missing / 1_000_000 * DAYS_PER_MILLION))
    end = min(oldest, now) if oldest else now
    # The seed's trees hold ~1.95 runs per root (delegation); measured on what is there.
    per_root = before["agent_run"] / held_roots if held_roots else RUNS_PER_ROOT
    roots = max(1, int(missing / per_root))
    log(f"loading ~{missing:,} runs ({roots:,} roots) over the {days} days before {end:%Y-%m-%d}")
    started = time.perf_counter()
    report = demo.bulk_seed(Settings(database_url=url), runs=roots, days=days, now=end,
                            seed=before["agent_run"] + 42, progress=True, batch_runs=5000)
    seconds = time.perf_counter() - started
    log(f"loaded {report.runs:,} runs / {report.events:,} events in {seconds:.0f} s "
        f"({report.events / seconds:,.0f} events/s)")
    return {"runs_added": report.runs, "seconds": seconds,
            "events_per_second": report.events / seconds}


def storage(url: str) -> dict:
    with psycopg.connect(libpq(url)) as conn:
        events, total, partitions = conn.execute(
            "SELECT (SELECT count(*) FROM run_event), "
            "(SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('run_event')), "
            "(SELECT count(*) FROM pg_partition_tree('run_event') WHERE isleaf)").fetchone()
    return {"events": events, "bytes": int(total), "bytes_per_event": total / max(events, 1),
            "partitions": partitions}


def measure(url: str, sizes: Sizes, hot_since: datetime | None) -> dict[str, float]:
    db = Database(url)
    try:
        # In-process reads only: the raw-SQL baselines answer another question (how far the
        # project is from plain SQL, in `python -m bench`) and scan whole windows.
        rows = reads.run(db, None, "", False, sizes, hot_since=hot_since)
    finally:
        db.dispose()
    return {row.name: row.project for row in rows if row.project is not None}


def report(stages: list[dict]) -> list[str]:
    head = " | ".join(f"p95 at {s['runs']:,} runs (ms)" for s in stages)
    lines = ["Hot reads (the goal): point reads of runs and answers of the last "
             f"{DAYS_PER_MILLION} days, the same rows at every size, each read once before "
             "the timed calls; lists and outcomes read recent windows.", "",
             f"| read | {head} | ratio | ≤ {GOAL}× |",
             "|---|" + "---|" * len(stages) + "---|---|"]
    lines += _ratios(stages, "reads", judged=True)
    lines += ["", "Cold point reads (not a goal): ids from all history, most read for the first "
              "time, so the page cache's share of the data decides them.", "",
              f"| read | {head} | ratio |", "|---|" + "---|" * len(stages) + "---|"]
    lines += _ratios(stages, "cold", judged=False)
    lines += ["", "| runs | events | run_event (all partitions) | bytes / event | partitions |"
              " load (events/s) |", "|---|---|---|---|---|---|"]
    for s in stages:
        st, load = s["storage"], s["load"]
        rate = f"{load['events_per_second']:,.0f}" if load["events_per_second"] else "reused"
        lines.append(f"| {s['runs']:,} | {st['events']:,} | {st['bytes'] / 2**30:.2f} GB | "
                     f"{st['bytes_per_event']:.0f} | {st['partitions']} | {rate} |")
    return lines


def _ratios(stages: list[dict], key: str, *, judged: bool) -> list[str]:
    lines = []
    for name, base in stages[0][key].items():
        values = [s[key].get(name) for s in stages]
        ratio = stages[-1][key][name] / base if base else None
        cells = " | ".join(f"{v:.2f}" for v in values) + f" | {ratio:.2f}"
        if judged:
            cells += " | " + ("pass" if ratio is not None and ratio <= GOAL else "miss")
        lines.append(f"| {name} | {cells} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.flat_reads", description=__doc__.split("\n")[0])
    p.add_argument("--db", required=True, help="PostgreSQL URL of the bench database")
    p.add_argument("--sizes", default="1000000,5000000", help="run counts, ascending")
    p.add_argument("--reload", action="store_true", help="drop and recreate the database first")
    p.add_argument("--point-reads", type=int, default=300)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    if not is_postgres(args.db):
        raise SystemExit("bench.flat_reads measures PostgreSQL (partitioned run_event)")
    targets = sorted(int(n) for n in args.sizes.split(","))
    sizes = Sizes(point_reads=args.point_reads, list_reads=max(args.point_reads // 3, 10),
                  outcome_reads=max(args.point_reads // 6, 10))
    prepare(args.db, reload=args.reload)
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(minutes=1)
    stages = []
    for runs in targets:
        load = load_to(args.db, runs, now)
        analyze(args.db)
        found = storage(args.db)
        db = Database(args.db)
        try:
            held = counts(db)["agent_run"]
        finally:
            db.dispose()
        log(f"measuring reads at {held:,} runs, {found['events']:,} events")
        # Cold first: the hot pass reads its sample once before timing it.
        cold = measure(args.db, Sizes(point_reads=sizes.point_reads, list_reads=0,
                                      outcome_reads=0), None)
        hot = measure(args.db, sizes, now - timedelta(days=DAYS_PER_MILLION))
        stages.append({"runs": held, "load": load, "storage": found, "reads": hot,
                       "cold": {k: v for k, v in cold.items() if k in POINT_READS}})
        log("p95 at this size: " + "; ".join(f"{name} {ms:.1f} ms"
                                             for name, ms in stages[-1]["reads"].items()))
    lines = [f"# Flat reads, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "",
             f"`python -m bench.flat_reads --sizes {args.sizes}` (in-process `queries` reads, "
             f"p95 of {sizes.point_reads} point / {sizes.list_reads} list / "
             f"{sizes.outcome_reads} outcome reads per size)", "", *report(stages)]
    text_out = "\n".join(lines) + "\n"
    print(text_out)
    out = Path(args.out) / f"flat-reads-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.md"
    out.write_text(text_out)
    log(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
