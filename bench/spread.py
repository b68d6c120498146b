"""The spread of measured rows across full bench runs: ``python -m bench.spread RUN.json …``

A goal such as "per-agent outcomes p95 ≤ 20 ms in three consecutive full runs" is judged on
several runs of ``python -m bench``, not one. Given their JSON results (``bench/results/*.json``,
oldest first), this prints a Markdown table: for each row with a target, its value in every run,
the smallest and largest, and whether it met its target in all of them. ``--match TEXT`` keeps
the rows whose name contains TEXT; ``--out FILE`` writes the table there too.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _value(row: dict) -> float | None:
    value = row.get("project")
    return float(value) if isinstance(value, int | float) else None


def _figure(value: float) -> str:
    """Three significant digits, never an exponent (24,677 rather than 2.47e+04)."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def spread(runs: list[dict], match: str | None = None) -> str:
    """The table for ``runs`` (parsed result files, oldest first)."""
    names: list[tuple[str, str]] = []
    for run in runs:
        for row in run["rows"]:
            key = (row["section"], row["name"])
            if row.get("target") and key not in names and (not match or match in row["name"]):
                names.append(key)
    stamps = [run.get("started_at", "?") for run in runs]
    lines = [f"Runs: {', '.join(f'`{s}`' for s in stamps)}", "",
             "| section | path | unit | " + " | ".join(f"run {i + 1}" for i in range(len(runs)))
             + " | min – max | target | met in every run |",
             "|---|---|---|" + "---|" * len(runs) + "---|---|---|"]
    for section, name in names:
        found = [next((r for r in run["rows"] if (r["section"], r["name"]) == (section, name)),
                      None) for run in runs]
        values = [_value(r) if r else None for r in found]
        measured = [v for v in values if v is not None]
        present = [r for r in found if r is not None]
        unit = present[0]["unit"] if present else ""
        target = present[0]["target"] if present else ""
        statuses = [r["status"] if r else "absent" for r in found]
        every = ("yes" if all(s == "pass" for s in statuses)
                 else "no (" + ", ".join(statuses) + ")")
        cells = " | ".join(_figure(v) if v is not None else "—" for v in values)
        extent = f"{_figure(min(measured))} – {_figure(max(measured))}" if measured else "—"
        lines.append(f"| {section} | {name} | {unit} | {cells} | {extent} | {target} | {every} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.spread", description=__doc__)
    p.add_argument("runs", nargs="+", help="result JSON files of full bench runs, oldest first")
    p.add_argument("--match", default=None, help="only rows whose name contains this text")
    p.add_argument("--out", default=None, help="also write the table to this file")
    args = p.parse_args(argv)
    table = spread([json.loads(Path(f).read_text()) for f in args.runs], args.match)
    print(table, end="")
    if args.out:
        Path(args.out).write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
