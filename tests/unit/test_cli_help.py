"""``callwarden --version``, and every command's --help naming the environment variables
it reads; each variable named there is really read somewhere in the code."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from callwarden.cli.main import build_parser, main
from callwarden.cli.process import COMMAND_ENV, ENV

ROOT = Path(__file__).parents[2]
SOURCE = "\n".join(p.read_text(encoding="utf-8")
                   for top in ("engine", "providers") for p in (ROOT / top).rglob("*.py")
                   if p.name != "process.py")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert re.fullmatch(r"callwarden \d+\.\d+\.\d+\n", capsys.readouterr().out)


@pytest.mark.parametrize("command", sorted(COMMAND_ENV))
def test_every_command_help_names_its_environment(command: str) -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    text = sub.choices[command].format_help()
    assert "environment:" in text
    for name in COMMAND_ENV[command]:
        assert name in text


@pytest.mark.parametrize("names", sorted(ENV))
def test_every_variable_in_the_help_is_read_by_the_code(names: str) -> None:
    for name in names.split(", "):
        stem = name.split("<", 1)[0]  # CALLWARDEN_CALL_<FIELD>: the prefix is what is read
        assert stem in SOURCE, name
