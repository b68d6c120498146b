"""The README documents every command, setting and route (Datasette's test_docs idea)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from agentledger.api import api
from agentledger.cli import build_parser

README = (Path(__file__).parent.parent / "README.md").read_text()


def _commands(parser: argparse.ArgumentParser, prefix: str = "agentledger") -> list[str]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = _commands(sub, f"{prefix} {name}")
                found.extend(nested or [f"{prefix} {name}"])
    return found


@pytest.mark.parametrize("command", _commands(build_parser()))
def test_every_cli_command_is_documented(command):
    assert f"`{command}" in README, f"README does not document {command}"


def test_every_cli_option_is_documented():
    missing = []
    for command in _commands(build_parser()):
        parser = build_parser()
        for word in command.split()[1:]:
            sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            parser = sub.choices[word]
        for action in parser._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help" and flag not in README:
                    missing.append(f"{command} {flag}")
    assert not missing, f"undocumented options: {missing}"


def test_every_setting_is_documented():
    source = (Path(__file__).parent.parent / "agentledger" / "core" / "config.py").read_text()
    variables = set(re.findall(r"AGENTLEDGER_[A-Z_]+", source))
    assert variables, "no settings found"
    missing = sorted(v for v in variables if f"`{v}`" not in README)
    assert not missing, f"README lacks {missing}"


@pytest.mark.parametrize("operation", api.operations, ids=lambda op: f"{op.method} {op.path}")
def test_every_route_is_documented(operation):
    assert f"`{operation.method} {operation.openapi_path}`" in README
