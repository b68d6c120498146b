"""Yes/no settings (``AGENTLEDGER_METRICS_PUBLIC``, ``AGENTLEDGER_SECURE_COOKIES``) are read one
way: 1/true/yes/on and 0/false/no/off/empty in any case; any other value stops every command at
start naming the variable, instead of quietly meaning no."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agentledger.core.config import Settings

BOOLEANS = {"AGENTLEDGER_METRICS_PUBLIC": "metrics_public",
            "AGENTLEDGER_SECURE_COOKIES": "secure_cookies"}


@pytest.mark.parametrize("variable", BOOLEANS)
@pytest.mark.parametrize(("raw", "on"), [
    ("1", True), ("true", True), ("TRUE", True), ("yes", True), ("Yes", True), ("on", True),
    (" on ", True), ("0", False), ("false", False), ("No", False), ("off", False), ("", False),
])
def test_a_yes_no_setting_reads_every_spelling_the_same(monkeypatch, variable, raw, on):
    monkeypatch.setenv(variable, raw)
    assert getattr(Settings.from_env(), BOOLEANS[variable]) is on


@pytest.mark.parametrize("variable", BOOLEANS)
def test_an_unset_yes_no_setting_is_off(monkeypatch, variable):
    monkeypatch.delenv(variable, raising=False)
    assert getattr(Settings.from_env(), BOOLEANS[variable]) is False


@pytest.mark.parametrize("variable", BOOLEANS)
@pytest.mark.parametrize("raw", ["y", "2", "enabled", "ture"])
def test_any_other_value_is_refused_at_start_naming_the_variable(monkeypatch, variable, raw):
    monkeypatch.setenv(variable, raw)
    with pytest.raises(SystemExit) as refused:
        Settings.from_env()
    assert str(refused.value) == (
        f"{variable} must be 1, true, yes or on (to turn it on), or 0, false, no, off or empty "
        f"(to leave it off), got {raw!r}")


def test_a_command_stops_before_it_touches_the_database(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTLEDGER_")}
    env.update(AGENTLEDGER_METRICS_PUBLIC="maybe", PYTHONWARNINGS="ignore",
               AGENTLEDGER_DATABASE_URL=f"sqlite:///{tmp_path}/agentledger.db")
    done = subprocess.run([sys.executable, "-m", "agentledger.cli", "db", "upgrade"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr == ("agentledger: AGENTLEDGER_METRICS_PUBLIC must be 1, true, yes or on "
                                        "(to turn it on), or 0, false, no, off or empty (to "
                                        "leave it off), got 'maybe'\n")
    assert not (tmp_path / "agentledger.db").exists()
