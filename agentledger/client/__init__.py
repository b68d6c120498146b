"""Python clients for a running agentledger server (CONTRACT §8), built on ``httpx``.

- ``LedgerClient``: sessions, messages (idempotent, safely retried), run streams, cancel, trees
  and provenance, for applications that talk to agents.
- ``ExecutorClient``: the executor routes, and ``run_forever`` to execute runs with the
  installed agent kinds from a machine that has no access to the ledger's database.

Every error answer of the server raises ``ApiError`` (``status``, ``code``, ``message``).
"""

from agentledger.client.errors import ApiError, ConnectionFailed
from agentledger.client.executor import ExecutorClient
from agentledger.client.ledger import LedgerClient
from agentledger.client.transport import DEFAULT_TIMEOUT, RetryPolicy

__all__ = ["DEFAULT_TIMEOUT", "ApiError", "ConnectionFailed", "ExecutorClient", "LedgerClient",
           "RetryPolicy"]
