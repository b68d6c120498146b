"""Results as Markdown and JSON under ``bench/results/``: a timestamped pair and ``latest.*``."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import Row, is_postgres, libpq


def machine_info(url: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "memory_gb": None,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "database": "postgresql" if is_postgres(url) else "sqlite",
        "postgresql": None,
        "git_commit": None,
    }
    try:
        with open("/proc/meminfo") as f:
            kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        info["memory_gb"] = round(kb / 1024 / 1024, 1)
    except (OSError, StopIteration, ValueError):
        pass
    try:
        info["git_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
            cwd=Path(__file__).parent, check=True).stdout.strip()
        # the bench's own result files do not make the measured code "uncommitted"
        dirty = subprocess.run(["git", "status", "--porcelain", "--", ":(top)",
                                ":(top,exclude)bench/results"], capture_output=True, text=True,
                               cwd=Path(__file__).parent).stdout.strip()
        if dirty:
            info["git_commit"] += " (+ uncommitted changes)"
    except (OSError, subprocess.SubprocessError):
        pass
    if is_postgres(url):
        import psycopg

        with psycopg.connect(libpq(url)) as conn:
            info["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
            info["autovacuum"] = conn.execute("SHOW autovacuum").fetchone()[0]
    else:
        import sqlite3

        info["sqlite"] = sqlite3.sqlite_version
    return info


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if value >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}" if value < 10 else f"{value:.1f}"
    return str(value)


_MARK = {"pass": "✅ pass", "miss": "❌ miss", "skipped": "skipped", "n/a": ""}


def row_cells(row: dict[str, Any]) -> str:
    """A result row's table cells: path, unit, project, raw / peer, ratio, target, result, note."""
    return (f"{row['name']} | {row['unit']} | {_fmt(row['project'])} | {_fmt(row['raw'])} | "
            f"{_fmt(row['ratio'])} | {row['target']} | {_MARK.get(row['status'], row['status'])} | "
            f"{row['note']}")


def markdown(result: dict[str, Any]) -> str:
    m, cfg, load = result["machine"], result["config"], result["load"]
    lines = [
        f"# agentledger benchmark — {result['started_at']}",
        "",
        f"`{result['command']}`",
        "",
        "| machine | |",
        "|---|---|",
        f"| CPUs | {m['cpus']} |",
        f"| memory | {m['memory_gb']} GB |",
        f"| Python | {m['python']} |",
        f"| database | {m['database']} {m.get('postgresql') or m.get('sqlite') or ''}"
        + (f"; autovacuum {m['autovacuum']}" if m.get("autovacuum") else "") + " |",
        f"| git commit | {m['git_commit']} |",
        f"| platform | {m['platform']} |",
        *([f"| calibration (fixed Python workload, CPU ms, best of 5; start / end) | "
           f"{m['calibration_ms'][0]} / {m['calibration_ms'][1]} |"]
          if m.get("calibration_ms") else []),
        "",
        f"Data set: {load['runs']:,} runs, {load['events']:,} events"
        + (" (reused)" if load["reused"] else
           f"; loaded through {load['path']} in {load['seconds']:.1f} s"),
        f"mode: {'smoke' if cfg.get('smoke') else 'quick' if cfg['quick'] else 'full'}; "
        f"duration {result['seconds']:.0f} s; "
        f"`agentledger serve` with {cfg.get('server_workers', 1)} gunicorn worker process(es).",
        "",
        "Ratios: throughput = project / raw psycopg; latency = raw p95 / project p95 (1.0 = as fast "
        "as PostgreSQL itself); peer rows: see each note.",
        "",
        "| section | path | unit | project | raw / peer | ratio | target | result | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(f"| {row['section']} | {row_cells(row)} |")
    reads = [r for r in result["rows"] if r["section"] == "reads"]
    if reads:
        lines += ["", "## Reads in detail (ms)", "",
                  "| read | queries p50 / p95 / p99 | HTTP p50 / p95 / p99 | raw SQL p50 / p95 / p99 | n |",
                  "|---|---|---|---|---|"]
        for r in reads:
            def trio(key: str, d=r["detail"]) -> str:
                x = d.get(key)
                return " / ".join(_fmt(x[p]) for p in ("p50", "p95", "p99")) if x else "—"
            lines.append(f"| {r['name']} | {trio('queries')} | {trio('http')} | {trio('raw')} | "
                         f"{r['detail']['queries']['n']} |")
    passed = sum(r["status"] == "pass" for r in result["rows"])
    missed = [r for r in result["rows"] if r["status"] == "miss"]
    lines += ["", f"**Targets: {passed} pass, {len(missed)} miss.**"]
    for r in missed:
        lines.append(f"- miss: {r['section']} / {r['name']}: {_fmt(r['project'])} {r['unit']} "
                     f"(target {r['target']})")
    lines += ["", "Method: see `bench/__init__.py` (timing, sizes, what each path does).", ""]
    return "\n".join(lines)


def write(result: dict[str, Any], out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    text = markdown(result)
    payload = json.dumps(result, indent=2, default=str) + "\n"
    for name in (stamp, "latest"):
        (out / f"{name}.md").write_text(text)
        (out / f"{name}.json").write_text(payload)
    return out / "latest.md", out / "latest.json"


def rows_as_dicts(rows: list[Row]) -> list[dict[str, Any]]:
    return [r.as_dict() for r in rows]
