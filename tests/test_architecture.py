"""Architecture rules, checked by tools: import contracts (import-linter) and lint (ruff)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

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
