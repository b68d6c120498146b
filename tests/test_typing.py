"""Static types: pyright (basic mode, ``[tool.pyright]`` in pyproject.toml) over the ground
(``agentledger/core``), the write path (``ingest``) and the read path (``queries``).

The installed ``pyright`` CLI (the PyPI wrapper) fetches its node package from the npm registry
on its first run; later runs use the cached copy.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ["agentledger/core", "ingest", "queries"]


def test_pyright_covers_core_ingest_and_queries():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pyright"]
    assert sorted(config["include"]) == sorted(CHECKED)
    assert config["typeCheckingMode"] == "basic"


@pytest.mark.slow  # minutes of wall time on a loaded machine
@pytest.mark.timeout(900)
def test_pyright_finds_no_type_errors():
    pyright = shutil.which("pyright")
    assert pyright, "pyright is not installed (pip install -e '.[test]')"
    done = subprocess.run([pyright, "--outputjson"], cwd=ROOT, capture_output=True, text=True,
                          timeout=880)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        pytest.fail(f"pyright did not report (exit {done.returncode}):\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    errors = [d for d in report["generalDiagnostics"] if d["severity"] == "error"]
    listing = "\n".join(f"{d['file']}:{d['range']['start']['line'] + 1}: {d['message']}"
                        for d in errors)
    assert errors == [], f"{len(errors)} type errors:\n{listing}"
    assert report["summary"]["filesAnalyzed"] > 20, report["summary"]
