"""The examples of ``examples/`` as the README walks through them: a real ``agentledger serve``
with its worker, the LangGraph and Agents SDK example agents registered over HTTP, two messages
per session, and the conversation continuing after the server restarts."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from support.processes import Api, ProcessManager, make_token, wait_until

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = [
    ("weather-graph", "langgraph", {"graph": "langgraph_weather.agent:graph",
                                    "pricing": {"offline-example": {"input_per_million": 0.15,
                                                                    "output_per_million": 0.6}}}),
    ("sdk-assistant", "openai-agents", {"agent": "sdk_assistant.agent:assistant"}),
]


def answer(api: Api, session_id: str, text: str) -> dict:
    run_id = api.send(session_id, text)
    wait_until(lambda: api.get(f"/api/agent-runs/{run_id}")["status"] not in
               ("queued", "running", "cancelling"), timeout=90)
    run = api.get(f"/api/agent-runs/{run_id}")
    assert run["status"] == "succeeded", (run, api.events(run_id))
    messages = api.get(f"/api/sessions/{session_id}/messages?limit=100")["items"]
    return {"run": run, "answer": [m for m in messages if m["role"] == "assistant"][-1]["content"],
            "events": api.events(run_id)}


def test_examples_remember_across_messages_and_a_server_restart(db_url, tmp_path):
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "examples")])}
    admin = make_token(db_url)
    with ProcessManager(tmp_path, env=env) as procs:
        server = procs.serve(db_url, worker=True, args=("--workers", "1"), timeout=90)
        api = Api(server.base_url, admin)
        sessions = {}
        for agent_id, kind, params in EXAMPLES:
            api.register_agent(agent_id, kind, params=params)
            sessions[agent_id] = api.new_session(agent_id)
            assert answer(api, sessions[agent_id], "My name is Ada")["answer"] == \
                "Noted: 'My name is Ada'."
            second = answer(api, sessions[agent_id], "What is my name?")
            assert second["answer"] == ("Earlier you told me: 'My name is Ada'. "
                                        "Now you ask: 'What is my name?'.")
            weather = answer(api, sessions[agent_id], "weather in Lisbon")
            assert weather["answer"] == "It is sunny and 21°C in Lisbon."
            types = [e["type"] for e in weather["events"]["events"]]
            assert {"agent.resolved", "tool.call", "tool.result", "usage"} <= set(types), types
        api.close()
        server.send(signal.SIGTERM)
        server.wait(60)
        server = procs.serve(db_url, worker=True, args=("--workers", "1"), timeout=90,
                             name="serve-again")
        api = Api(server.base_url, admin)
        for agent_id, _, _ in EXAMPLES:
            after = answer(api, sessions[agent_id], "Still there?")
            assert after["answer"] == ("Earlier you told me: 'My name is Ada'. "
                                       "Now you ask: 'Still there?'."), agent_id
        api.close()
