"""``ExecutorClient``: the executor routes of a ledger server, and a worker built on them."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterable
from typing import Any

import httpx

from agentledger.client.errors import ApiError
from agentledger.client.ledger import checked_idempotency_key, new_idempotency_key
from agentledger.client.transport import (
    SAFE,
    UNSENT,
    RetryPolicy,
    Transport,
    json_of,
    segment,
)

log = logging.getLogger("agentledger.client")

# The memory routes and how each is retried after an unclear failure. Reads repeat harmlessly;
# so do LangGraph's writes, which its savers store by key (a checkpoint by its id, a write by
# task, channel and index): a repeat stores the same rows again. A session's ``add-items``
# would add the items twice and ``pop-item`` take a second one: retried only when certainly
# never sent. ``clear`` twice is clear once.
MEMORY_OPERATIONS = {
    "checkpoints/get": SAFE,
    "checkpoints/list": SAFE,
    "checkpoints/put": SAFE,
    "checkpoints/put-writes": SAFE,
    "session/get-items": SAFE,
    "session/add-items": UNSENT,
    "session/pop-item": UNSENT,
    "session/clear": SAFE,
}


class ExecutorClient:
    """``ExecutorClient(base_url, token, instance_id)`` with an ``executor`` token.

    What repeats harmlessly is retried after an unclear failure (a heartbeat, reads), and so are
    an append and a child, which carry an ``Idempotency-Key``: the server answers a repeat of
    one it already took with what it wrote. A claim is retried only when the request never
    reached the server (see ``agentledger.client.transport``).
    """

    def __init__(self, base_url: str, token: str, instance_id: str, *,
                 timeout: float | httpx.Timeout | None = None, retry: RetryPolicy | None = None,
                 transport: httpx.BaseTransport | None = None):
        self._http = Transport(base_url, token, timeout=timeout, retry=retry, transport=transport)
        self.base_url = self._http.base_url
        self.instance_id = instance_id

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ExecutorClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _post(self, path: str, body: dict, retry: str, *, unsent_seconds: float = 0.0,
              headers: dict[str, Any] | None = None) -> Any:
        return json_of(self._http.request("POST", path, json=body, retry=retry, headers=headers,
                                          unsent_seconds=unsent_seconds))

    # ---- the executor routes -------------------------------------------------------------

    def claim(self, max_runs: int = 1, *, lease_seconds: float | None = None,
              wait_seconds: float | None = None) -> list[dict]:
        """Lease up to ``max_runs`` queued runs; each ``{"run_id", "thread_id", "input",
        "agent_execution_snapshot", "context_pack_snapshot", "context", "lease_expires_at", …}``.

        With ``wait_seconds`` (at most 5), when nothing is claimable the server holds its
        answer until a run may have become claimable or the time passes, then answers ``[]``
        (it never claims after waiting): claim again then. A worker loop that claims this way
        starts runs as they are queued, without polling."""
        body: dict[str, Any] = {"executor_instance_id": self.instance_id, "max_runs": max_runs}
        if lease_seconds is not None:
            body["lease_seconds"] = lease_seconds
        if wait_seconds:
            body["wait_seconds"] = wait_seconds
        return self._post("/api/executor/claim", body, UNSENT)["runs"]

    def heartbeat(self, run_id: str) -> dict:
        """``{"lease_expires_at", "cancel_requested"}``; a lost lease raises ``ApiError`` 409
        ``lease_lost``."""
        return self._post(f"/api/executor/runs/{segment(run_id, 'run')}/heartbeat",
                          {"executor_instance_id": self.instance_id}, SAFE)

    def append(self, run_id: str, events: Iterable[dict | tuple[str, dict]], *,
               unsent_seconds: float = 0.0, idempotency_key: str | None = None) -> dict:
        """Append ``[{"type", "data"}, …]`` (or ``(type, data)`` pairs), all or nothing;
        returns ``{"seqs", "cancel_requested"}``.

        The append carries an ``Idempotency-Key`` (a new one per call unless given), so an
        unclear failure (the answer lost, a 5xx) is retried like a read: a repeat of an append
        the server took is answered with the seqs it wrote. A request that certainly never
        reached the server is also tried again for ``unsent_seconds`` after the retry
        policy's attempts (a restarting server is waited for). The server remembers only a
        run's latest keyed append: send a run's next append once this call has returned."""
        batch = [e if isinstance(e, dict) else {"type": e[0], "data": e[1]} for e in events]
        key = (new_idempotency_key() if idempotency_key is None
               else checked_idempotency_key(idempotency_key))
        return self._post(f"/api/executor/runs/{segment(run_id, 'run')}/events",
                          {"executor_instance_id": self.instance_id, "events": batch}, SAFE,
                          unsent_seconds=unsent_seconds, headers={"Idempotency-Key": key.encode()})

    def create_child(self, run_id: str, agent_id: str, input: str, *,
                     idempotency_key: str | None = None) -> dict:
        """Delegate: a child run of ``run_id``; returns ``{"run_id", "events_url"}``. Keyed
        and retried as ``append`` is: a repeat answers the child the first send created."""
        key = (new_idempotency_key() if idempotency_key is None
               else checked_idempotency_key(idempotency_key))
        return self._post(f"/api/executor/runs/{segment(run_id, 'run')}/children",
                          {"executor_instance_id": self.instance_id, "agent_id": agent_id,
                           "input": input}, SAFE, headers={"Idempotency-Key": key.encode()})

    # ---- the run's framework memory (LangGraph checkpoints, Agents SDK session) ------------

    def memory(self, run_id: str, operation: str, body: dict[str, Any]) -> dict:
        """``POST /api/executor/runs/{run_id}/<operation>`` (one of ``MEMORY_OPERATIONS``) for
        this instance, which must hold the run's lease; the thread is always the run's own.
        ``agentledger.agent_kinds.remote_checkpointer`` and ``remote_session`` build the bodies."""
        try:
            retry = MEMORY_OPERATIONS[operation]
        except KeyError:
            raise ValueError(f"no memory operation {operation!r}; known: "
                             f"{', '.join(MEMORY_OPERATIONS)}") from None
        return self._post(f"/api/executor/runs/{segment(run_id, 'run')}/{operation}",
                          {**body, "executor_instance_id": self.instance_id}, retry)

    # ---- what an executor may read: any run and its events -------------------------------

    def get_run(self, run_id: str) -> dict:
        return json_of(self._http.request("GET", f"/api/agent-runs/{segment(run_id, 'run')}"))

    def events(self, run_id: str, after_seq: int = 0) -> dict:
        return json_of(self._http.request("GET", f"/api/agent-runs/{segment(run_id, 'run')}/events",
                                          params={"after_seq": after_seq}))

    # ---- a worker ------------------------------------------------------------------------

    def run_forever(self, concurrency: int = 4, *, settings=None,
                    stop: threading.Event | None = None) -> list[str]:
        """Execute claimed runs with the installed agent kinds, exactly as ``agentledger worker``
        does (heartbeats, cancel within a second), until SIGTERM/SIGINT (when called from the
        main thread) or ``stop`` is set; then end the runs still held ``interrupted``
        (``executor_shutdown``) and return their ids. ``settings`` (lease and heartbeat
        seconds) default to the ``AGENTLEDGER_*`` environment.

        A server that refuses the token (401 ``unauthenticated``, 403 ``forbidden``: unknown,
        revoked, or not an executor's) or the claim itself (422 ``validation_error``: an
        ``instance_id`` under ``otlp:``, the name of runs recorded from traces) is not retried:
        the worker stops as above and raises that ``ApiError``."""
        from agentledger.core.config import Settings
        from agentledger.worker.executor import Executor
        from agentledger.worker.http_backend import HttpBackend

        settings = settings or Settings.from_env()
        done = stop or threading.Event()
        executor = Executor(None, settings, instance_id=self.instance_id, concurrency=concurrency,
                            backend=HttpBackend(self))
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, lambda *_: done.set())
        try:
            executor.start()
            log.info("worker %s executing up to %d run(s) from %s; lease %gs, heartbeat %gs",
                     self.instance_id, concurrency, self.base_url, settings.lease_seconds,
                     settings.heartbeat_seconds)
            while not done.wait(0.5) and executor.refusal is None:
                pass
        finally:
            ended = executor.stop(reason="executor_shutdown")
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            log.info("worker %s stopped; %d run(s) interrupted (executor_shutdown)",
                     self.instance_id, len(ended))
        refusal = executor.refusal
        if refusal is not None:
            raise ApiError(refusal.status, refusal.code, refusal.message)
        return ended
