"""The commands docs/operations.md gives operators work when pasted: building the interrupted
runs' index beforehand (``CREATE INDEX CONCURRENTLY``, with the ``postgresql+psycopg://`` form of
``AGENTLEDGER_DATABASE_URL`` that psql does not take), then ``agentledger db upgrade``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import text
from support.ledger import fresh_database

from agentledger.core.database import Database
from agentledger.core.migrate import current_revision, upgrade

OPERATIONS = Path(__file__).resolve().parent.parent / "docs" / "operations.md"


def _block_after(heading: str) -> str:
    doc = OPERATIONS.read_text()
    return re.search(r"```bash\n(.*?)```", doc[doc.index(heading):], re.S).group(1)


@pytest.mark.skipif(shutil.which("psql") is None or shutil.which("agentledger") is None,
                    reason="needs psql and the agentledger command")
def test_the_concurrent_index_example_pastes_and_the_upgrade_keeps_the_index(pg_database_url,
                                                                            tmp_path):
    block = _block_after("## Upgrading: the interrupted runs' index")
    assert "CREATE INDEX CONCURRENTLY" in block
    with fresh_database("postgresql", tmp_path) as url:
        upgrade(url, "0015")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
        env.update(AGENTLEDGER_DATABASE_URL=url, PYTHONWARNINGS="ignore")
        assert url.startswith("postgresql+psycopg://")
        done = subprocess.run(["bash", "-euc", block], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "CREATE INDEX" in done.stdout
        assert current_revision(url) != "0015"
        db = Database(url)
        try:
            with db.read() as s:
                definition = s.execute(text(
                    "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_agent_run_interrupted'"
                )).scalar_one()
        finally:
            db.dispose()
        assert "INCLUDE (end_reason, agent_id, executor_instance_id)" in definition
