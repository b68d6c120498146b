"""Usage with an unknown cost (CONTRACT §3, §7): ``cost_usd`` priced from ``params.pricing`` or
null, and every sum (rollup, per-agent outcomes, the /agents page) treating null as unknown,
never as zero; per-agent outcomes that say when groups were left out (§9 ``groups_truncated``).
"""

from __future__ import annotations

import functools
import importlib
from datetime import UTC, datetime, timedelta

import pytest
from support import history as h
from support.dashboards import call, logged_in, make_app, texts, tokens
from support.factories import make_agent
from support.rollup import assert_rollup_matches_scan

from agentledger.agent_kinds import RunContext, cost_usd, validate_definition
from agentledger.agent_kinds.scripted import run_scripted
from agentledger.core.errors import ValidationFailed
from ingest.bulk_import import ImportedEvent, ImportedRun, ImportedSession, bulk_import
from queries.agent_outcomes import agent_outcomes
from queries.common import TimeWindow

PRICING = {"m1": {"input_per_million": 2.0, "output_per_million": 10.0}}
DAY = timedelta(days=1)

# Every bulk import of this module starts after this: the minute rollup's cut of each import
# lies between the minutes kept then and when it is checked (support.rollup).
IMPORTS_FROM = datetime.now(UTC)


class Port:
    def __init__(self):
        self.events = []

    def emit(self, run_id, event_type, data):
        self.events.append((event_type, data))


def scripted(steps, *, model="m1", pricing=None) -> list:
    port = Port()
    snapshot = {"kind": "scripted", "model": model,
                "params": {"steps": steps, **({"pricing": pricing} if pricing else {})}}
    run_scripted(RunContext(run_id="run_x", thread_id="thr_x", input="hi",
                            agent_execution_snapshot=snapshot, context_pack_snapshot={"items": []},
                            context=[], port=port))
    return [data for _, data in port.events]


def test_pricing_names_the_model_or_the_cost_is_unknown():
    params = {"pricing": PRICING}
    assert cost_usd(params, "m1", 1_000_000, 100_000) == pytest.approx(3.0)
    assert cost_usd(params, "other-model", 10, 10) is None
    assert cost_usd({}, "m1", 10, 10) is None
    assert cost_usd(params, None, 10, 10) is None


def test_scripted_usage_is_priced_from_params_unless_it_names_its_cost():
    steps = [{"usage": {"input_tokens": 1000, "output_tokens": 100}},
             {"usage": {"input_tokens": 1000, "output_tokens": 100, "model": "m2"}},
             {"usage": {"input_tokens": 1, "output_tokens": 1, "cost_usd": 0.5}}]
    priced = scripted(steps, pricing=PRICING)
    assert priced[0] == {"input_tokens": 1000, "output_tokens": 100, "cost_usd": pytest.approx(0.003),
                         "model": "m1"}
    assert priced[1]["cost_usd"] is None and priced[1]["model"] == "m2"
    assert priced[2]["cost_usd"] == 0.5
    assert [d["cost_usd"] for d in scripted(steps[:1])] == [None]  # no pricing: unknown


@pytest.mark.parametrize("pricing", ["cheap", {"m1": 3}, {"m1": {"input_per_million": -1}},
                                     {"m1": {"per_call": 1}},
                                     {"m1": {"output_per_million": 1e300}},
                                     {"m1": {"input_per_million": 1_000_001}}])
def test_pricing_that_cannot_price_is_refused_at_registration(pricing):
    with pytest.raises(ValueError, match="pricing"):
        validate_definition("echo", {"pricing": pricing})
    validate_definition("echo", {"pricing": PRICING})


def test_a_usage_event_may_have_a_null_cost_but_not_a_negative_one(db):
    h.agent(db, "a")
    chat = h.chat(db, owner="alice", agent_id="a")
    run = h.ask(db, chat, "q", owner="alice", when=h.at_seconds(0)).run_id
    h.start(db, run, h.at_seconds(1))
    h.events(db, run, h.at_seconds(2), [("usage", {"input_tokens": 1, "output_tokens": 1,
                                                   "cost_usd": None})])
    with pytest.raises(ValidationFailed):
        h.events(db, run, h.at_seconds(3), [("usage", {"input_tokens": 1, "output_tokens": 1,
                                                       "cost_usd": -0.1})])


@pytest.fixture
def ledger(db):
    """``priced``: two runs with known cost. ``unpriced``: two runs whose calls had no price.
    ``mixed``: one priced run, one with one priced and one unpriced call, one without usage."""
    for agent in ("priced", "unpriced", "mixed"):
        h.agent(db, agent)
    chat = h.chat(db, owner="alice", agent_id="priced")
    t = h.at_seconds

    def run(agent, when, costs):
        posted = h.ask(db, chat, "q", owner="alice", when=t(when), agent_id=agent)
        h.start(db, posted.run_id, t(when + 1))
        for n, cost in enumerate(costs):
            h.events(db, posted.run_id, t(when + 2 + n / 10),
                     [("usage", {"input_tokens": 10, "output_tokens": 1, "cost_usd": cost})])
        h.complete(db, posted.run_id, t(when + 3), "a")

    run("priced", 0, [0.25])
    run("priced", 10, [0.5, 0.25])
    run("unpriced", 20, [None])
    run("unpriced", 30, [None, None])
    run("mixed", 40, [0.125])
    run("mixed", 50, [0.5, None])
    run("mixed", 60, [])


@pytest.mark.parametrize("window", [
    TimeWindow(h.at_seconds(0) - DAY, h.at_seconds(0) + 2 * DAY),  # whole days: the rollup
    TimeWindow(h.at_seconds(0) - timedelta(minutes=5), h.at_seconds(0) + timedelta(minutes=5)),
])  # the second lies inside one hour: every run is scanned
def test_cost_sums_say_unknown_and_how_many_runs_had_no_price(db, ledger, window):
    found = _outcomes(db, window)
    assert (found["priced"].cost_usd, found["priced"].runs_without_cost) == (pytest.approx(1.0), 0)
    assert (found["unpriced"].cost_usd, found["unpriced"].runs_without_cost) == (None, 2)
    # the run with one unpriced call is unknown as a whole: its priced call is not summed
    assert (found["mixed"].cost_usd, found["mixed"].runs_without_cost) == (pytest.approx(0.125), 1)
    assert found["unpriced"].input_tokens == 30 and found["unpriced"].as_dict()["cost_usd"] is None
    assert found["mixed"].as_dict()["runs_without_cost"] == 1


def _outcomes(db, window, **kw):
    with db.read() as s:
        return {o.agent_id: o for o in agent_outcomes(s, window, **kw).agents}


def test_the_rollup_counts_unpriced_runs_apart(db, ledger):
    assert assert_rollup_matches_scan(db) == 7


def test_outcomes_keep_the_busiest_groups_and_say_others_were_left_out(db, ledger):
    window = TimeWindow(h.at_seconds(0) - DAY, h.at_seconds(0) + 2 * DAY)
    with db.read() as s:
        everything = agent_outcomes(s, window)
        one = agent_outcomes(s, window, max_groups=1)
        again = agent_outcomes(s, window, max_groups=1)
        three = agent_outcomes(s, window, max_groups=3)
    assert not everything.groups_truncated and len(everything.agents) == 3
    assert one.groups_truncated and one.as_dict()["groups_truncated"] is True
    assert everything.as_dict()["agents"][0]["runs_without_cost"] == 1  # mixed, sorted by id
    # the most runs first (mixed: 3), the same answer every time
    assert [o.agent_id for o in one.agents] == ["mixed"] == [o.agent_id for o in again.agents]
    assert [(v.agent_id, v.version) for v in one.versions] == [("mixed", 1)]
    assert one.agents[0].runs == 3
    assert not three.groups_truncated and [o.agent_id for o in three.agents] == [
        "mixed", "priced", "unpriced"]


def test_the_agents_page_says_unknown_and_notes_left_out_groups(db, ledger, monkeypatch):
    client = logged_in(make_app(db), tokens(db)["viewer"])
    agents_page = importlib.import_module("dashboards.pages.agents")  # registered by the app
    since = (h.at_seconds(0) - DAY).date().isoformat()
    until = (h.at_seconds(0) + DAY).date().isoformat()
    outputs = [("agents-all", "rowData"), ("agents-note", "children"),
               ("agents-detail", "children"), ("agents-url", "search"), ("agents-json", "href"),
               ("agents-dates-col", "style")]
    inputs = [("agents-window", "value", "custom"), ("agents-dates", "start_date", since),
              ("agents-dates", "end_date", until), ("agents-agent", "value", None),
              ("agents-a", "value", None), ("agents-b", "value", None)]
    state = [("agents-url", "search", "")]
    response = call(client, outputs, inputs, state, changed=["agents-window.value"])
    cost = {row["label"]: row["cost"] for row in response["agents-all"]["rowData"]}
    assert cost["Unpriced (unpriced)"] == "unknown"
    assert cost["Priced (priced)"] == "$1.0000"
    assert cost["Mixed (mixed)"] == "$0.1250 (+1 run unpriced)"
    assert "busiest" not in " ".join(texts(response["agents-note"]["children"]))

    monkeypatch.setattr(agents_page, "agent_outcomes",
                        functools.partial(agent_outcomes, max_groups=1))
    response = call(client, outputs, inputs, state, changed=["agents-window.value"])
    assert [row["label"] for row in response["agents-all"]["rowData"]] == ["Mixed (mixed)"]
    assert "Only the 1 busiest agents" in " ".join(texts(response["agents-note"]["children"]))


def test_a_bulk_import_counts_unpriced_runs_apart_too(db):
    make_agent(db, "alpha")
    start = h.at_seconds(0)

    def at(seconds):
        return start + timedelta(seconds=seconds)

    chat = ImportedSession(owner_id="alice", agent_id="alpha", created_at=at(-10), title="imported")

    def imported(n, cost):
        return ImportedRun(agent_id="alpha", agent_version=1, input="q", created_at=at(10 * n),
                           session=chat, events=[
            ImportedEvent("run.started", {"executor_instance_id": "ext",
                                          "lease_expires_at": at(10 * n + 60).isoformat()}, at(10 * n + 1)),
            ImportedEvent("usage", {"input_tokens": 5, "output_tokens": 1, "cost_usd": cost},
                          at(10 * n + 2)),
            ImportedEvent("run.failed", {"error": {"code": "x", "message": "y"}}, at(10 * n + 3)),
        ])

    bulk_import(db, [imported(0, 0.5), imported(1, None), imported(2, None)])
    assert_rollup_matches_scan(db, imported_since=IMPORTS_FROM)
    alpha = _outcomes(db, TimeWindow(start - DAY, start + 2 * DAY))["alpha"]
    assert (alpha.runs, alpha.cost_usd, alpha.runs_without_cost) == (3, pytest.approx(0.5), 2)
