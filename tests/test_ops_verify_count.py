"""``agentledger verify`` (the whole database) counts damaged runs, not problems: one run can
break in several ways at once (its input and its answer here), and is still one damaged run."""

from __future__ import annotations

import re

from sqlalchemy import text
from support.factories import answered_run, make_agent

from agentledger.cli import main


def test_a_run_with_several_problems_is_one_damaged_run(db, db_url, capsys, monkeypatch):
    make_agent(db, "echo")
    runs = [answered_run(db, f"question {name}", [("message.delta", {"text": f"answer {name}"}),
                                                   ("run.completed", {})]) for name in "ab"]
    victim = runs[0]
    with db.engine.begin() as conn:  # behind the application's back
        conn.execute(text("UPDATE agent_run SET input = 'forged' WHERE id = :r"), {"r": victim})
        conn.execute(text("UPDATE message SET content = 'forged' WHERE run_id = :r "
                          "AND role = 'assistant'"), {"r": victim})
    monkeypatch.setenv("AGENTLEDGER_DATABASE_URL", db_url)

    assert main(["verify"]) == 1
    out = capsys.readouterr().out.splitlines()
    tampered = [line for line in out if line.startswith("TAMPERED")]
    assert len(tampered) == 2 and all(f"run {victim} " in line for line in tampered), out
    assert re.fullmatch(r"1 damaged run\(s\): 2 runs, \d+ events checked", out[-1]), out
