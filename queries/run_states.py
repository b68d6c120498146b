"""Where each of a set of runs stands: what an executor checks of the runs it holds."""

from __future__ import annotations

from typing import Any

from sqlalchemy import String, any_, bindparam, select
from sqlalchemy.dialects.postgresql import ARRAY

from agentledger.core.schema import AgentRun

_COLUMNS = (AgentRun.id, AgentRun.status, AgentRun.executor_instance_id,
            AgentRun.final_message_id)
# On PostgreSQL the ids go as one array parameter, so the statement's SQL is the same for any
# number of runs and the driver runs it (``core.driver_statements``); an expanding ``IN`` is
# written into the SQL at each execution. SQLite has no arrays.
_BY_ARRAY = select(*_COLUMNS).where(AgentRun.id == any_(bindparam("run_ids", type_=ARRAY(String))))
_BY_IN = select(*_COLUMNS).where(AgentRun.id.in_(bindparam("run_ids", expanding=True)))


def run_states_read(run_ids: list[str], *, postgres: bool) -> tuple[Any, dict[str, Any]]:
    """The statement and parameters that read ``id``, ``status``, ``executor_instance_id``
    and ``final_message_id`` of each of ``run_ids`` that exists (for ``Database.read_rows``)."""
    return (_BY_ARRAY if postgres else _BY_IN), {"run_ids": list(run_ids)}
