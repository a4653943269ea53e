"""Issue 41, item 1, without a database: ``audit`` on a terminal narrower than 100 columns
wraps each event's detail under it (never a column shrunk to nothing), piped it prints
each line whole, a wide terminal keeps the table; a job id prefix's range of uuids; every
read command has ``--json``."""

from __future__ import annotations

import argparse
import io
import uuid

import pytest
from rich.console import Console

from callwarden.cli.main import build_parser
from callwarden.projections.timeline import timeline
from callwarden.replay.audit import AuditReport, Reservation
from callwarden.replay.lookup import digits, prefix_range
from callwarden.replay.render import show_audit
from tests.support.paths import W, completed_path

TASK = "task-0123456789abcdef0123456789abcdef"
READ_COMMANDS = ["audit", "check", "jobs", "stats", "status", "verify"]


def _report() -> AuditReport:
    return AuditReport(job_id=str(uuid.uuid4()), status="completed", call_state="completed",
                       call_version=5, provider_kind="kie-standard",
                       timeline=timeline(completed_path(task=TASK, cost=4.0)),
                       reservations=[Reservation(status="committed", credits_reserved=10,
                                                 credits_charged=4, settled_at=None)])


def _shown(width: int, *, terminal: bool = True) -> str:
    console = Console(force_terminal=terminal, width=width, record=True, file=io.StringIO())
    show_audit(console, _report())
    return console.export_text()


def test_a_narrow_terminal_wraps_each_events_detail_under_it() -> None:
    text = _shown(60)
    assert max(len(line) for line in text.splitlines()) <= 60, text
    assert "┃" not in text
    flat = " ".join(text.split())
    assert f"committed, priced 4 (at most the reservation) by {W}" in flat, text
    assert f"task {TASK}" in flat
    assert "Completed → completed" in flat
    assert "reservation: committed (10 reserved, charged 4;" in flat


def test_piped_each_line_is_whole_however_narrow() -> None:
    lines = _shown(40, terminal=False).splitlines()
    assert f"      committed, priced 4 (at most the reservation) by {W} · 1 media stored" \
        in lines
    assert f"      task {TASK}" in lines
    assert any(ln.endswith("Completed → completed") for ln in lines)
    assert "┃" not in "".join(lines)


def test_a_wide_terminal_keeps_the_table() -> None:
    text = _shown(200)
    assert "┃ seq" in text
    assert f"committed, priced 4 (at most the reservation) by {W}" in text


@pytest.mark.parametrize(("prefix", "low", "high"), [
    ("92ebf615", "92ebf615-0000-0000-0000-000000000000", "92ebf615-ffff-ffff-ffff-ffffffffffff"),
    ("ABCD-12", "abcd1200-0000-0000-0000-000000000000", "abcd12ff-ffff-ffff-ffff-ffffffffffff"),
    ("00000000-0000-0000-0000-000000000007", "00000000-0000-0000-0000-000000000007",
     "00000000-0000-0000-0000-000000000007"),
])
def test_a_prefix_is_the_range_of_uuids_starting_with_it(prefix: str, low: str,
                                                         high: str) -> None:
    assert prefix_range(prefix) == (uuid.UUID(low), uuid.UUID(high))


@pytest.mark.parametrize("bad", ["", "abc", "abcg", "92eb f615", "0" * 33])
def test_not_a_prefix(bad: str) -> None:
    with pytest.raises(ValueError, match="first 4 or more hex digits"):
        digits(bad)


@pytest.mark.parametrize("command", READ_COMMANDS)
def test_every_read_command_has_json(command: str) -> None:
    sub = next(a for a in build_parser()._actions
               if isinstance(a, argparse._SubParsersAction))
    assert command in sub.choices
    assert "--json" in sub.choices[command]._option_string_actions
