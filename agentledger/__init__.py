"""agentledger: an audit ledger for AI-agent executions.

The core package holds what both sides share (settings, ids, the schema and the database
lifecycle) plus the entry points (HTTP API, worker, CLI). Writes live in ``ingest``; reads in
``queries``; pages in ``dashboards``.
"""

__version__ = "0.1.0"
