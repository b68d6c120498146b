"""An executor's append with an ``Idempotency-Key``: the same append sent again (its answer was
lost on the way) is answered with the seqs it wrote and writes nothing; the same key with
another request is 409 ``idempotency_conflict``; a run remembers only its latest keyed append.
On PostgreSQL a short batch that does not end the run takes the one-statement optimistic path,
anything else the locked path: both are covered."""

from __future__ import annotations

import json
import threading

import pytest
from support.api import (
    assert_error,
    claim_run,
    ledger_state,
    open_session,
    post_message,
    unique,
)


@pytest.fixture
def running(api):
    chat = open_session(api, api.alice, title="keys")["id"]
    run = post_message(api, api.alice, chat, "work")["run_id"]
    instance = unique("exec")
    claim_run(api, api.executor, run, instance)
    return run, instance


def _body(instance: str, events: list[tuple[str, dict]]) -> bytes:
    return json.dumps({"executor_instance_id": instance,
                       "events": [{"type": t, "data": d} for t, d in events]}).encode()


def _send(api, run: str, body: bytes, key: str | None):
    headers = {} if key is None else {"Idempotency-Key": key}
    return api.request("POST", f"/api/executor/runs/{run}/events", token=api.executor,
                       data=body, headers=headers)


def _events(api, run):
    return api.get(f"/api/agent-runs/{run}/events", api.admin,
                   query={"limit": 500}).json()["events"]


DELTAS = [("message.delta", {"text": "Hel"}), ("message.delta", {"text": "lo"})]
# Past the one-statement path's batch size on PostgreSQL: the locked path.
LONG = [("message.delta", {"text": f"w{i} "}) for i in range(40)]


@pytest.mark.parametrize("batch", [DELTAS, LONG], ids=["short", "long"])
def test_an_append_sent_again_with_its_key_is_answered_not_written_again(api, running, batch):
    run, instance = running
    body = _body(instance, batch)
    first = _send(api, run, body, "k-1")
    assert first.status == 200
    seqs = list(range(3, 3 + len(batch)))
    assert first.json() == {"seqs": seqs, "cancel_requested": False}
    before = ledger_state(api.db, run)
    again = _send(api, run, body, "k-1")
    assert again.status == 200 and again.json() == first.json()
    assert ledger_state(api.db, run) == before
    assert [e["seq"] for e in _events(api, run)] == list(range(1, 3 + len(batch)))
    # a new key is a new append
    other = _send(api, run, body, "k-2")
    assert other.json()["seqs"] == list(range(seqs[-1] + 1, seqs[-1] + 1 + len(batch)))


def test_the_same_key_with_another_append_is_409_and_writes_nothing(api, running):
    run, instance = running
    assert _send(api, run, _body(instance, DELTAS), "k").status == 200
    before = ledger_state(api.db, run)
    for other in (_body(instance, [("message.delta", {"text": "Hex"})]),
                  _body(instance, [*DELTAS, ("message.delta", {"text": "!"})]),
                  _body(instance, [("run.completed", {"content": "Hello"})])):
        assert_error(_send(api, run, other, "k"), 409, "idempotency_conflict")
    assert ledger_state(api.db, run) == before


def test_an_append_that_ended_the_run_is_answered_again_after_the_end(api, running):
    run, instance = running
    body = _body(instance, [("message.delta", {"text": "bye"}), ("run.completed", {})])
    done = _send(api, run, body, "last")
    assert done.json() == {"seqs": [3, 4], "cancel_requested": False}
    before = ledger_state(api.db, run)
    assert _send(api, run, body, "last").json() == done.json()
    assert ledger_state(api.db, run) == before
    detail = api.get(f"/api/agent-runs/{run}", api.alice).json()
    assert detail["status"] == "succeeded"
    provenance = api.get(f"/api/messages/{detail['final_message_id']}/provenance",
                         api.alice).json()
    assert provenance["message"]["content"] == "bye"
    # anything else after the end is refused as before
    assert_error(_send(api, run, body, None), 409, "lease_lost")
    assert_error(_send(api, run, body, "another"), 409, "lease_lost")
    assert ledger_state(api.db, run) == before


def test_a_repeat_answers_whether_the_run_is_being_cancelled_now(api, running):
    run, instance = running
    body = _body(instance, DELTAS)
    assert _send(api, run, body, "k").json()["cancel_requested"] is False
    assert api.post(f"/api/agent-runs/{run}/cancel", api.alice).status in (200, 202)
    assert _send(api, run, body, "k").json() == {"seqs": [3, 4], "cancel_requested": True}


def test_only_the_latest_keyed_append_is_remembered(api, running):
    """An executor sends a run's next append once the last is settled, so the latest is the
    only one a repeat can be of; an older key is not known any more and writes again."""
    run, instance = running
    first, second = _body(instance, DELTAS), _body(instance, [("message.delta", {"text": "!"})])
    assert _send(api, run, first, "a").json()["seqs"] == [3, 4]
    assert _send(api, run, second, "b").json()["seqs"] == [5]
    assert _send(api, run, first, "a").json()["seqs"] == [6, 7]
    # an append without a key forgets nothing: the latest keyed one is still answered
    assert _send(api, run, second, None).json()["seqs"] == [8]
    assert _send(api, run, first, "a").json()["seqs"] == [6, 7]


def test_keys_are_per_run(api, running):
    run, instance = running
    chat = open_session(api, api.alice)["id"]
    other = post_message(api, api.alice, chat, "other")["run_id"]
    claim_run(api, api.executor, other, instance)
    assert _send(api, run, _body(instance, DELTAS), "same").json()["seqs"] == [3, 4]
    assert _send(api, other, _body(instance, DELTAS), "same").json()["seqs"] == [3, 4]
    assert len(_events(api, run)) == len(_events(api, other)) == 4


# An empty key was taken for no key: a sender that meant its append to be keyed had it
# written again on every retry.
@pytest.mark.parametrize("key", ["x" * 256, "tab\tkey", "nul\x7f", ""])
def test_a_malformed_key_is_400_and_writes_nothing(api, running, key):
    run, instance = running
    before = ledger_state(api.db, run)
    assert_error(_send(api, run, _body(instance, DELTAS), key), 400, "idempotency_key_required")
    assert ledger_state(api.db, run) == before


def test_the_same_append_sent_at_once_from_many_threads_is_written_once(api, running):
    run, instance = running
    body = _body(instance, DELTAS)
    answers: list = []
    start = threading.Barrier(8)

    def send() -> None:
        start.wait()
        answers.append(_send(api, run, body, "racing"))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [a.status for a in answers] == [200] * 8
    assert {tuple(a.json()["seqs"]) for a in answers} == {(3, 4)}
    assert [e["seq"] for e in _events(api, run)] == [1, 2, 3, 4]


def _child(api, run: str, instance: str, key: str | None, agent: str = "echo", text: str = "sub"):
    body = json.dumps({"executor_instance_id": instance, "agent_id": agent,
                       "input": text}).encode()
    headers = {} if key is None else {"Idempotency-Key": key}
    return api.request("POST", f"/api/executor/runs/{run}/children", token=api.executor,
                       data=body, headers=headers)


def test_a_child_request_sent_again_with_its_key_answers_the_child_it_created(api, running):
    run, instance = running
    first = _child(api, run, instance, "c-1")
    assert first.status == 201
    before = ledger_state(api.db, run)
    again = _child(api, run, instance, "c-1")
    assert again.status == 201 and again.json() == first.json()
    assert ledger_state(api.db, run) == before
    tree = api.get(f"/api/agent-runs/{run}/tree", api.alice).json()
    assert [n["run_id"] for n in tree["nodes"] if n["parent_run_id"] == run] == [
        first.json()["run_id"]]
    assert_error(_child(api, run, instance, "c-1", text="another question"), 409,
                 "idempotency_conflict")
    assert ledger_state(api.db, run) == before
    # a new key (or none) is a new child
    second = _child(api, run, instance, "c-2")
    third = _child(api, run, instance, None)
    assert len({first.json()["run_id"], second.json()["run_id"], third.json()["run_id"]}) == 3
