"""Architecture rules, checked by tools: import contracts (import-linter), lint (ruff), the read
side loading without the write path in a fresh interpreter, and frozen migrations."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WRITE_NAMES = {"insert", "update", "delete"}


def run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_import_contracts_hold():
    lint_imports = shutil.which("lint-imports")
    assert lint_imports, "import-linter is not installed (pip install -e '.[test]')"
    done = run(lint_imports, "--no-cache")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout, done.stdout


def test_ruff_is_clean():
    done = run(sys.executable, "-m", "ruff", "check", ".", "--no-cache", "--output-format",
               "concise")
    assert done.returncode == 0, done.stdout + done.stderr


def sqlalchemy_write_imports(source: str) -> list[str]:
    """Names a module imports from SQLAlchemy that build INSERT/UPDATE/DELETE statements."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
            found += [a.name for a in node.names if a.name in WRITE_NAMES]
    return found


def test_queries_never_build_write_statements():
    assert sqlalchemy_write_imports("from sqlalchemy import select, update") == ["update"]
    assert sqlalchemy_write_imports("from sqlalchemy.dialects.postgresql import insert") == [
        "insert"]
    offenders = {
        str(path.relative_to(ROOT)): names
        for path in sorted((ROOT / "queries").rglob("*.py"))
        if (names := sqlalchemy_write_imports(path.read_text()))
    }
    assert offenders == {}, f"queries/ must only read: {offenders}"


# ---- the read side never loads the write path, in a fresh interpreter -------------------------

# Import every module of the package (the dashboards' pages register with a Dash app, so they
# are loaded by mounting the dashboards on a bare Flask app), then list what of ``ingest`` loaded.
FRESH_IMPORT = """
import importlib, json, pkgutil, sys
name = sys.argv[1]
package = importlib.import_module(name)
if name == "dashboards":
    from flask import Flask
    package.mount_dashboards(Flask("architecture-check"))
else:
    for info in pkgutil.walk_packages(package.__path__, name + "."):
        importlib.import_module(info.name)
print(json.dumps({
    "loaded": sorted(m for m in sys.modules if m == name or m.startswith(name + ".")),
    "ingest": sorted(m for m in sys.modules if m == "ingest" or m.startswith("ingest.")),
}))
"""


@pytest.mark.parametrize("package", ["dashboards", "queries"])
def test_read_side_packages_load_without_ingest(package):
    done = run(sys.executable, "-c", FRESH_IMPORT, package)
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(found["loaded"]) > 3, found  # the package's modules really were imported
    assert found["ingest"] == [], f"importing {package} loaded the write path: {found['ingest']}"


# ---- migrations are frozen: they never import live project code -------------------------------

MIGRATIONS = ROOT / "agentledger" / "core" / "migrations" / "versions"
PROJECT_PACKAGES = ("agentledger", "ingest", "queries", "dashboards")


def project_imports(source: str) -> list[str]:
    """Modules of the project (or relative imports) that ``source`` imports, anywhere in it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = ["." * node.level + (node.module or "")]
        else:
            continue
        found += [n for n in names if n.startswith(".") or n.split(".")[0] in PROJECT_PACKAGES]
    return found


def test_migrations_import_no_project_module():
    assert project_imports("from agentledger.core.schema import AgentRun") == [
        "agentledger.core.schema"]
    assert project_imports("def f():\n    import ingest.runs\n") == ["ingest.runs"]
    assert project_imports("from . import helpers") == ["."]
    assert project_imports("import sqlalchemy as sa\nfrom alembic import op") == []
    paths = sorted(MIGRATIONS.glob("*.py"))
    assert paths, MIGRATIONS
    offenders = {p.name: names for p in paths if (names := project_imports(p.read_text()))}
    assert offenders == {}, f"migrations must use op and raw SQL only: {offenders}"
