"""The read side: one module per question its users ask.

Functions take a read-only SQLAlchemy ``Session`` and return plain data (frozen dataclasses,
dicts, lists), never ORM objects. Nothing here writes, and nothing here imports ``ingest``
(an import-linter contract in the tests keeps it so).
"""
