"""Embedded mode: ``python app.py``.

SQLite file by default (``AGENTLEDGER_DATABASE_URL`` overrides), migrations applied, demo data
seeded when the database is empty, API + dashboards + in-process worker + reconciler on
http://127.0.0.1:8050. Prints the URL and an admin login link.
"""

import sys

from agentledger.core.config import Settings, exit_status
from agentledger.server import serve

if __name__ == "__main__":
    sys.exit(exit_status(lambda: serve(Settings.from_env(), host="127.0.0.1", port=8050,
                                       run_worker=True, demo=True)))
