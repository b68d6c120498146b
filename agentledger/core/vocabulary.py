"""The ledger's words, spelled once: run statuses, event types, interrupt reasons, roles and admin
actions (CONTRACT §2, §3, §5). Every module that names one of these imports it from here; the
database's CHECK constraint on ``agent_run.status`` is generated from ``STATUSES``."""

from __future__ import annotations

from typing import Literal, get_args

# Run statuses (CONTRACT §2).
RunStatus = Literal[
    "queued", "running", "cancelling", "succeeded", "failed", "cancelled", "interrupted"
]
STATUSES: tuple[str, ...] = get_args(RunStatus)
NON_TERMINAL: tuple[str, ...] = ("queued", "running", "cancelling")
# Statuses in which an executor holds the run (at most one per thread).
ACTIVE: tuple[str, ...] = ("running", "cancelling")
TERMINAL: tuple[str, ...] = ("succeeded", "failed", "cancelled", "interrupted")

# Event types (CONTRACT §3). Progress events report without moving the run.
PROGRESS_EVENTS: frozenset[str] = frozenset({
    "message.delta", "tool.call", "tool.result", "usage", "agent.resolved", "agent.handoff",
    "run.child_created", "run.child_finished",
})

# Why a run ended ``interrupted`` (CONTRACT §3, ``run.interrupted``).
InterruptReason = Literal["lease_expired", "parent_terminal", "service_restart", "executor_shutdown"]
INTERRUPT_REASONS: tuple[str, ...] = get_args(InterruptReason)

# Token roles (CONTRACT §5).
Role = Literal["user", "viewer", "executor", "admin"]
ROLES: tuple[str, ...] = get_args(Role)
# Who may read through the API (their own objects for ``user``), and who may write.
READER_ROLES: tuple[str, ...] = ("user", "viewer", "admin")
WRITER_ROLES: tuple[str, ...] = ("user", "admin")
# Who may read a run and its events: the readers, and executors, which follow the children they
# delegated (any run; they read nothing else of the API).
RUN_FOLLOWER_ROLES: tuple[str, ...] = (*READER_ROLES, "executor")
# Who may open the dashboards and their JSON twins.
DASHBOARD_ROLES: tuple[str, ...] = ("viewer", "admin")

# What the admin action log records.
ADMIN_ACTIONS: tuple[str, ...] = (
    "token.created", "token.revoked", "agent.registered", "agent.versioned",
    "run.cancel_requested", "session.deleted",
)

assert set(NON_TERMINAL) | set(TERMINAL) == set(STATUSES)
assert set(ACTIVE) <= set(NON_TERMINAL)

# The agent kind of agents observed over OTLP (runs recorded elsewhere): registration only.
EXTERNAL_KIND = "external"
# The executor a run recorded from a trace names: ``otlp:<service.name>``. Such a service held no
# lease and sends no heartbeat, so lease health does not list it among the executors, and no
# claim may take a name under this prefix (which would make a live executor look recorded).
RECORDED_EXECUTOR_PREFIX = "otlp:"
