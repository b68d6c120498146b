"""The write path: the only code that inserts or updates rows.

Every function takes a SQLAlchemy ``Session`` whose transaction the caller owns (an HTTP view, the
worker loop or a CLI command begins and commits it), and raises ``agentledger.core.errors`` types,
never database exceptions.
"""
