"""A framework agent's plain-code work held open by the test: ``hold_the_plodder``.

The plodding node (``framework_agents.lg_graphs``) and tool (``framework_agents.sdk_agents``)
sleep 0.1 s per step. A cancel test wants that work long (it must not end by itself before the
cancel lands, however slow the machine) and then over at once: the module's steps become
``seconds`` worth, and each sleep a wait on a gate the test opens when it is done.
"""

from __future__ import annotations

import threading
from types import ModuleType, SimpleNamespace

STEP_SECONDS = 0.1  # each step's sleep in the plodding modules


def hold_the_plodder(monkeypatch, module: ModuleType, seconds: float) -> threading.Event:
    """Make ``module``'s plodding work ``seconds`` long unless the returned gate is set."""
    let_go = threading.Event()
    monkeypatch.setattr(module, "PLOD_STEPS", int(seconds / STEP_SECONDS))
    monkeypatch.setattr(module, "time", SimpleNamespace(sleep=let_go.wait))
    return let_go
