"""The CLI's small things (issue 41, item 4), without a database: every command's --help is
plain text with a help for every option and the default shown where there is one; the
global options are taken after the command too; durations read as people read them, in
the demo's summary and its HTML page, which says where it was written."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from rich.console import Console

from callwarden.cli.demo import _summary_table, write_report
from callwarden.cli.main import build_parser, main
from callwarden.demo.run import DemoRun
from callwarden.demo.summary import Credits, DemoSummary
from callwarden.rules.human import duration
from tests.support.human import FLOAT_REPR

PARSER = build_parser()
SUB = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction))
COMMANDS = sorted(SUB.choices)
MARKUP = re.compile(r"``|:(class|func|meth|mod|data|attr|exc):|`")
#: a float's repr where a person reads a duration (23.431637549999976, 6.2e-05)


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_is_plain_text_with_a_help_and_default_for_every_option(
        command: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    parser = SUB.choices[command] if command else PARSER
    text = _help([command] if command else [], capsys)
    assert not MARKUP.search(text), MARKUP.search(text)
    said = " ".join(text.split())
    formatter = parser._get_formatter()
    for action in parser._actions:
        name = "/".join(action.option_strings) or action.dest
        assert action.help, f"{name}: no help"
        assert action.help is not argparse.SUPPRESS, f"{name}: its help hidden"
        shown = formatter._expand_help(action)
        assert " ".join(shown.split()) in said, (name, shown)
        if (action.option_strings and isinstance(action.default, str | int | float | Path)
                and not isinstance(action.default, bool) and action.default != ""
                and action.default is not argparse.SUPPRESS):
            assert "default" in shown, f"{name}: its default ({action.default!r}) not shown"


def test_the_check_help_no_longer_shows_its_docstrings_markup(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's own case: ``check --help`` printed ``jobs.status`` and
    ``:mod:`callwarden.cli.grant``` as written in the module's docstring."""
    text = _help(["check"], capsys)
    assert "``" not in text
    assert ":mod:" not in text
    assert "jobs.status" in text


@pytest.mark.parametrize("command", COMMANDS)
def test_the_data_dir_is_taken_before_or_after_the_command(command: str, tmp_path: Path) -> None:
    base = {"audit": ["00000000-0000-0000-0000-000000000001"], "rebuild": ["--all"],
            "enqueue": ["--kind", "kie-standard", "--request", "{}"],
            "grant": ["callwarden_runtime"]}.get(command, [])
    before, after = tmp_path / "before", tmp_path / "after"
    assert PARSER.parse_args([command, *base]).data_dir is None
    assert PARSER.parse_args(["--data-dir", str(before), command, *base]).data_dir == before
    assert PARSER.parse_args([command, *base, "--data-dir", str(after)]).data_dir == after
    assert PARSER.parse_args(["--data-dir", str(before), command, *base,
                              "--data-dir", str(after)]).data_dir == after


@pytest.mark.parametrize(("seconds", "shown"), [
    (0, "0 s"), (6.2e-05, "62 µs"), (0.0123, "12.3 ms"), (1.2, "1.2 s"),
    (23.431637549999976, "23.4 s"), (59.96, "1 min"), (184, "3 min 4 s"), (3599.6, "1 h"),
    (7500, "2 h 5 min"), (86400, "1 d"), (90000, "1 d 1 h"), (-0.5, "-500 ms"),
    (3e-10, "< 1 ns"), (4.5e-7, "450 ns"), (float("nan"), "unknown"),
])
def test_a_duration_reads_as_people_read_it(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown


def test_no_duration_is_ever_a_float_repr() -> None:
    for exponent in range(-12, 9):
        for mantissa in (1.0, 1.23456789, 6.2, 9.99951):
            text = duration(mantissa * 10.0 ** exponent)
            assert not FLOAT_REPR.search(text), text
            assert re.fullmatch(r"(< )?[\d.]+ (ns|µs|ms|s|min|h|d)( \d+ (s|min|h))?", text), text


def _run() -> DemoRun:
    summary = DemoSummary(
        jobs=4, terminal={"completed": 4}, non_terminal=0, recovered_by_reconciler=1,
        settled_by_webhook=2, upstream_creates_max_per_job=1, late_callbacks=0,
        duplicate_settlements=0, credits=Credits(reserved=40.000000000001, committed=30.1,
                                                 released=9.9),
        verify_mismatches=0, p50_s=3.0000000000000004, p95_s=23.431637549999976,
        database_down_s=0.1 + 0.2)
    return DemoRun(summary=summary, samples=[], latencies=[(3.0, False), (23.4, True)],
                   kills=2, seconds=31.5)


def test_the_demo_summary_prints_durations_not_reprs() -> None:
    console = Console(record=True, width=200)
    console.print(_summary_table(_run()))
    text = console.export_text()
    assert "3 s / 23.4 s" in text
    assert "(300 ms)" in text
    assert not FLOAT_REPR.search(text), text


def test_the_demo_report_says_where_it_went_and_shows_no_reprs(tmp_path: Path) -> None:
    console = Console(record=True, width=400)
    page = tmp_path / "report.html"
    write_report(page, _run(), console)
    assert f"report written to {page.resolve()}" in console.export_text()
    html = page.read_text(encoding="utf-8")
    assert "<th>time to terminal p95</th><td>23.4 s</td>" in html
    assert "reserved 40, committed 30.1" in html
    assert not FLOAT_REPR.search(re.sub(r"<svg.*?</svg>", "", html)), html
