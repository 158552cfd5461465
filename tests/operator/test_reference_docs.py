"""The reference pages name every flag there is: each option of the operator's command line stands in the synopsis
of docs/operator.md ("Command line"), and each option of every ``compilecache`` command in docs/cli.md (by its long
or short form), so that a flag added to a parser cannot go undocumented."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from compilecache_operator.main import build_parser as operator_parser

from cachelib.cli.parser import build_parser as cli_parser

DOCS = Path(__file__).resolve().parents[2] / "docs"


def named(option: str, text: str) -> bool:
    return re.search(re.escape(option) + r"(?![-\w])", text) is not None


def options(parser: argparse.ArgumentParser) -> list[list[str]]:
    return [list(a.option_strings) for a in parser._actions if a.option_strings and "--help" not in a.option_strings]


def test_every_operator_flag_is_in_the_synopsis() -> None:
    page = (DOCS / "operator.md").read_text()
    section = page.split("\n## Command line\n", 1)[1]
    synopsis = section.split("```", 2)[1]
    missing = [o[0] for o in options(operator_parser()) if not any(named(s, synopsis) for s in o)]
    assert not missing, f"docs/operator.md's command line lacks {missing}"


COMMANDS = next(a for a in cli_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_cli_option_is_in_the_cli_reference(command: str) -> None:
    page = (DOCS / "cli.md").read_text()
    assert named(command, page)
    missing = [o[0] for o in options(COMMANDS[command]) if not any(named(s, page) for s in o)]
    assert not missing, f"docs/cli.md does not name {command}'s {missing}"
