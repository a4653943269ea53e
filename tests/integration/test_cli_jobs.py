"""``callwarden jobs`` on a real Postgres (issue 41, item 1): the calls, newest call start
first, filtered by call state (and its open/terminal groups), kind, user, age, who ended
the call and error text; ``--json`` one array with stable keys and whole ids; the table
fits 80 columns piped, ages read as people read them, and an id as the table shows it is
what ``audit`` takes."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from callwarden.database.db import Conn
from callwarden.database.jobs import create_job
from callwarden.events.types import (
    CallStarted,
    Cancelled,
    Completed,
    Event,
    FinalizeClaimed,
    Swept,
    TaskCreated,
    UpstreamFailed,
    UpstreamResult,
    UpstreamSucceeded,
)
from tests.support.audit import cli, drive, run_sync
from tests.support.human import FLOAT_REPR

KEYS = ["id", "user_id", "kind", "call_state", "status", "created_at", "updated_at",
        "started_at", "ended_at", "age_s", "provider_task_id", "settlement", "ended_by",
        "error"]


def _completed(at: datetime, task: str) -> list[Event]:
    s = timedelta(seconds=1)
    return [CallStarted(at=at, actor="worker:w1", kind="kie-standard"),
            TaskCreated(at=at + s, actor="worker:w1", task_id=task),
            UpstreamSucceeded(at=at + 2 * s, actor="worker:w1",
                              result=UpstreamResult(media_urls=("u",), cost=1.0)),
            FinalizeClaimed(at=at + 3 * s, actor="worker:w1", owner="worker:w1",
                            lease_until=at + timedelta(minutes=1)),
            Completed(at=at + 4 * s, actor="worker:w1", cost=1.0)]


async def _fleet(conn: Conn) -> dict[str, uuid.UUID]:
    """Five calls started 5 min to 1 day ago, ended in different ways by different
    actors, for two users; and a job of the host's whose call never started."""
    now = datetime.now(UTC)

    async def job(user: str, events: list[Event]) -> uuid.UUID:
        j = await create_job(conn, user_id=user, credits=5)
        await drive(conn, j, events)
        return j

    ago = {"open": 5 * 60, "done": 3 * 3600, "failed": 2 * 3600, "cancelled": 4 * 3600,
           "swept": 86400}
    at = {k: now - timedelta(seconds=v) for k, v in ago.items()}
    return {
        "open": await job("alice", [
            CallStarted(at=at["open"], actor="worker:w1", kind="kie-standard"),
            TaskCreated(at=at["open"], actor="worker:w1", task_id="t-open")]),
        "done": await job("alice", _completed(at["done"], "t-done")),
        "failed": await job("bob", [
            CallStarted(at=at["failed"], actor="worker:w1", kind="kie-veo"),
            TaskCreated(at=at["failed"], actor="worker:w1", task_id="t-failed"),
            UpstreamFailed(at=at["failed"] + timedelta(minutes=1), actor="reconciler:r1",
                           error="Content Policy violation")]),
        "cancelled": await job("bob", [
            CallStarted(at=at["cancelled"], actor="worker:w1", kind="kie-veo"),
            Cancelled(at=at["cancelled"] + timedelta(seconds=9), actor="admin", by="admin")]),
        "swept": await job("carol", [
            CallStarted(at=at["swept"], actor="worker:w1", kind="elevenlabs-sync", sync=True),
            Swept(at=at["swept"] + timedelta(minutes=10), actor="reconciler:r2")]),
        "no call": await create_job(conn, user_id="alice"),
    }


@pytest.fixture
def fleet(db_url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, uuid.UUID]:
    monkeypatch.setenv("COLUMNS", "80")
    return run_sync(db_url, _fleet)


def _listed(db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            ids: dict[str, uuid.UUID], *flags: str) -> list[str]:
    assert cli(db_url, monkeypatch, "jobs", "--json", *flags) == 0
    names = {str(v): k for k, v in ids.items()}
    return [names[r["id"]] for r in json.loads(capsys.readouterr().out)]


def test_jobs_json_is_one_array_of_calls_newest_first_with_stable_keys(
        db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        fleet: dict[str, uuid.UUID]) -> None:
    assert cli(db_url, monkeypatch, "jobs", "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == [str(fleet[k]) for k in (
        "open", "failed", "done", "cancelled", "swept")]  # the host's job has no call
    assert all(list(r) == KEYS for r in rows)
    failed, swept = rows[1], rows[4]
    assert (failed["user_id"], failed["kind"], failed["call_state"], failed["status"],
            failed["provider_task_id"], failed["settlement"], failed["ended_by"],
            failed["error"]) == ("bob", "kie-veo", "failed", "failed", "t-failed",
                                 "refunded", "reconciler", "Content Policy violation")
    assert failed["age_s"] == pytest.approx(7200, abs=120)
    assert failed["ended_at"] is not None
    assert rows[0]["ended_at"] is None
    assert (swept["call_state"], swept["ended_by"]) == ("swept", "reconciler")
    assert rows[2]["settlement"] == "committed"


@pytest.mark.parametrize(("flags", "expect"), [
    (["--state", "open"], ["open"]),
    (["--state", "terminal"], ["failed", "done", "cancelled", "swept"]),
    (["--state", "completed,failed"], ["failed", "done"]),
    (["--state", "swept", "--state", "cancelled"], ["cancelled", "swept"]),
    (["--kind", "kie-veo"], ["failed", "cancelled"]),
    (["--user", "alice"], ["open", "done"]),
    (["--user", "alice", "--state", "terminal"], ["done"]),
    (["--older-than", "150m"], ["done", "cancelled", "swept"]),
    (["--newer-than", "10m"], ["open"]),
    (["--newer-than", "5h", "--older-than", "1h"], ["failed", "done", "cancelled"]),
    (["--ended-by", "reconciler"], ["failed", "swept"]),
    (["--ended-by", "admin"], ["cancelled"]),
    (["--error", "content policy"], ["failed"]),
    (["--error", "nothing like it"], []),
    (["--limit", "2"], ["open", "failed"]),
])
def test_jobs_filters(db_url: str, monkeypatch: pytest.MonkeyPatch,
                      capsys: pytest.CaptureFixture[str], fleet: dict[str, uuid.UUID],
                      flags: list[str], expect: list[str]) -> None:
    assert _listed(db_url, monkeypatch, capsys, fleet, *flags) == expect


def test_an_unknown_state_is_refused_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    from callwarden.cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main(["jobs", "--state", "open,doneish"])
    assert exit_.value.code == 2
    assert "unknown call state 'doneish'" in capsys.readouterr().err


def test_the_table_fits_80_columns_and_its_ids_are_what_audit_takes(
        db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        fleet: dict[str, uuid.UUID]) -> None:
    assert cli(db_url, monkeypatch, "jobs") == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert not FLOAT_REPR.search(out), out
    lines = {k: next(ln for ln in out.splitlines() if ln.startswith(str(v)[:8]))
             for k, v in fleet.items() if k != "no call"}
    assert str(fleet["failed"]) not in out  # ids shortened in the table
    assert re.search(r"\bkie-veo\b.*\bfailed\b.*\breconciler\b.*\b2 h\b", lines["failed"])
    assert re.search(r"\bpolling\b.*\b5 min\b", lines["open"])
    assert re.search(r"\b1 d\b", lines["swept"])
    assert "5 call(s)" in out
    shown = lines["failed"].split()[0]
    assert cli(db_url, monkeypatch, "audit", shown) == 0
    assert str(fleet["failed"]) in capsys.readouterr().out


def test_the_table_says_when_more_match_than_the_limit(
        db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        fleet: dict[str, uuid.UUID]) -> None:
    assert cli(db_url, monkeypatch, "jobs", "--limit", "3") == 0
    out = capsys.readouterr().out
    assert "the newest 3 shown; more match" in out
    assert cli(db_url, monkeypatch, "jobs", "--kind", "no-such-kind") == 0
    assert "no call matches" in capsys.readouterr().out
