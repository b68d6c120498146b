"""``INSERT … ON CONFLICT`` statements that SQLAlchemy 2.0 can cache once compiled.

SQLAlchemy 2.0's PostgreSQL and SQLite ``Insert`` classes opt out of the compiled-statement
cache because their ON CONFLICT clauses have no cache key (sqlalchemy#10445, fixed in 2.1).
So every upsert was compiled afresh on every execution, about 0.5 ms of CPU each, and the
hottest writes use them: run creation (the idempotent run insert, the rate-limit counter),
run ends (the outcome rollup) and context blobs.

The subclasses below give the ON CONFLICT clauses the cache key 2.1 gives them: the conflict
target, the SET expressions and the WHERE clauses. Any literal in a SET expression is a bound
parameter of that expression, so it is part of the key's parameters, not of the cached SQL.
A bare Python value as a SET value (``set_={"n": 5}``) would be turned into a parameter only
at compile time, after the key is taken, so it is refused here rather than silently cached;
write ``literal(5)`` or an expression instead.

Remove this module when the project requires SQLAlchemy 2.1.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects.postgresql import dml as postgresql_dml
from sqlalchemy.dialects.sqlite import dml as sqlite_dml
from sqlalchemy.sql.elements import ClauseElement
from sqlalchemy.sql.visitors import InternalTraversal

_TARGET = [
    ("inferred_target_elements", InternalTraversal.dp_multi_list),
    ("inferred_target_whereclause", InternalTraversal.dp_clauseelement),
]
_UPDATE = [
    ("update_values_to_set", InternalTraversal.dp_dml_ordered_values),
    ("update_whereclause", InternalTraversal.dp_clauseelement),
]


def _post_values(stmt) -> ClauseElement:
    """The ON CONFLICT clause an ``on_conflict_do_*`` call just set."""
    clause = stmt._post_values_clause
    assert clause is not None
    return clause


def _check_set_values(clause) -> None:
    for key, value in clause.update_values_to_set:
        if not isinstance(value, ClauseElement) and not hasattr(value, "__clause_element__"):
            raise TypeError(
                f"ON CONFLICT DO UPDATE SET {key}: pass a SQL expression (e.g. literal(...)), "
                "not a plain value, so the statement can be cached"
            )


class _PostgresDoNothing(postgresql_dml.OnConflictDoNothing):
    inherit_cache = False
    _cache_key_traversal = [("constraint_target", InternalTraversal.dp_string), *_TARGET]


class _PostgresDoUpdate(postgresql_dml.OnConflictDoUpdate):
    inherit_cache = False
    _cache_key_traversal = [("constraint_target", InternalTraversal.dp_string), *_TARGET, *_UPDATE]


class _SqliteDoNothing(sqlite_dml.OnConflictDoNothing):
    inherit_cache = False
    _cache_key_traversal = list(_TARGET)


class _SqliteDoUpdate(sqlite_dml.OnConflictDoUpdate):
    inherit_cache = False
    _cache_key_traversal = [*_TARGET, *_UPDATE]


class PostgresInsert(postgresql_dml.Insert):
    inherit_cache = True

    def on_conflict_do_nothing(self, *args: Any, **kwargs: Any) -> PostgresInsert:
        stmt = super().on_conflict_do_nothing(*args, **kwargs)
        # Same attributes, one more class in the hierarchy: the clause gains a cache key.
        _post_values(stmt).__class__ = _PostgresDoNothing
        return stmt

    def on_conflict_do_update(self, *args: Any, **kwargs: Any) -> PostgresInsert:
        stmt = super().on_conflict_do_update(*args, **kwargs)
        _check_set_values(_post_values(stmt))
        _post_values(stmt).__class__ = _PostgresDoUpdate
        return stmt


class SqliteInsert(sqlite_dml.Insert):
    inherit_cache = True

    def on_conflict_do_nothing(self, *args: Any, **kwargs: Any) -> SqliteInsert:
        stmt = super().on_conflict_do_nothing(*args, **kwargs)
        _post_values(stmt).__class__ = _SqliteDoNothing
        return stmt

    def on_conflict_do_update(self, *args: Any, **kwargs: Any) -> SqliteInsert:
        stmt = super().on_conflict_do_update(*args, **kwargs)
        _check_set_values(_post_values(stmt))
        _post_values(stmt).__class__ = _SqliteDoUpdate
        return stmt


def insert(dialect_name: str, table: Table) -> PostgresInsert | SqliteInsert:
    """A dialect ``Insert`` whose ON CONFLICT forms are cacheable."""
    return PostgresInsert(table) if dialect_name == "postgresql" else SqliteInsert(table)
