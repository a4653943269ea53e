"""The CLI's small things on a real Postgres (issue 41, item 4): ``status --json`` and
``check --json`` are machine-readable with stable keys; ``audit``, ``stats`` and ``verify``
print durations as people read them (``+62 µs``, ``29 min 58 s``), never a float's repr;
a ``CALLWARDEN_*`` variable nothing reads is named on stderr with the closest one read."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest

from callwarden.database.db import Conn
from callwarden.database.jobs import create_job
from callwarden.events.types import (
    CallStarted,
    Completed,
    Event,
    FinalizeClaimed,
    Swept,
    TaskCreated,
    UpstreamResult,
    UpstreamSucceeded,
)
from tests.support.audit import cli, new_job, run_sync
from tests.support.human import FLOAT_REPR
from tests.support.paths import completed_path, failed_path


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    for name in ("CALLWARDEN_MEDIA_DIR", "CALLWARDEN_MEDIA_S3_BUCKET", "CALLWARDEN_CONFIG"):
        monkeypatch.delenv(name, raising=False)


def test_status_json_has_stable_keys(db_url: str, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(db_url, monkeypatch, "status", "--json") == 0
    empty = json.loads(capsys.readouterr().out)
    assert set(empty) == {"migrations_applied", "migrations_available", "pending", "jobs",
                          "call_events"}
    assert empty["migrations_applied"] == empty["migrations_available"] > 0
    assert (empty["pending"], empty["jobs"], empty["call_events"]) == ([], [], 0)
    run_sync(db_url, lambda c: create_job(c))
    run_sync(db_url, lambda c: new_job(c, completed_path()))
    assert cli(db_url, monkeypatch, "status", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert sorted(data["jobs"], key=lambda j: j["status"]) == [
        {"status": "completed", "call_state": "completed", "jobs": 1},
        {"status": "pending", "call_state": None, "jobs": 1}]
    assert data["call_events"] == len(completed_path())
    assert cli(db_url, monkeypatch, "status") == 0  # the table still says the same
    assert f"call events logged: {len(completed_path())}" in capsys.readouterr().out


def test_check_json_is_one_object_with_every_finding(
        db_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    code = cli(db_url, monkeypatch, "check", "--json")  # no media store: a problem
    out = capsys.readouterr().out
    data = json.loads(out)
    assert set(data) == {"findings", "problems"}
    assert all(set(f) == {"level", "text"} for f in data["findings"])
    assert {f["level"] for f in data["findings"]} <= {"ok", "note", "problem"}
    problems = [f["text"] for f in data["findings"] if f["level"] == "problem"]
    assert data["problems"] == len(problems) > 0
    assert any(t.startswith("media store:") for t in problems), problems
    assert code == 2
    assert any("migrations applied" in f["text"] for f in data["findings"])  # the database's
    monkeypatch.setenv("CALLWARDEN_MEDIA_DIR", str(tmp_path / "media"))
    code = cli(db_url, monkeypatch, "check", "--json")
    data = json.loads(capsys.readouterr().out)
    assert (code, data["problems"]) == (0, 0), data
    assert {"level": "ok", "text": "media store"} in data["findings"]


def _tiny_gaps() -> list[Event]:
    events = completed_path()
    start = events[0].at
    return [events[0], msgspec.structs.replace(events[1], at=start + timedelta(
        microseconds=62)), *events[2:]]


def test_audit_prints_human_durations(db_url: str, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    tiny = run_sync(db_url, lambda c: new_job(c, _tiny_gaps()))
    slow = run_sync(db_url, lambda c: new_job(c, failed_path()))
    assert cli(db_url, monkeypatch, "audit", str(tiny)) == 0
    out = capsys.readouterr().out
    assert "+62 µs" in out
    assert not FLOAT_REPR.search(out), out
    assert cli(db_url, monkeypatch, "audit", str(slow)) == 0
    out = capsys.readouterr().out
    assert "+29 min 58 s" in out
    assert "+5 min" in out
    assert not FLOAT_REPR.search(out), out


def _completed(start: datetime, seconds: float, task: str) -> list[Event]:
    """A call completed ``seconds`` after it started."""
    step = timedelta(seconds=seconds / 4)
    return [CallStarted(at=start, actor="w", kind="kie-standard"),
            TaskCreated(at=start + step, actor="w", task_id=task),
            UpstreamSucceeded(at=start + 2 * step, actor="w",
                              result=UpstreamResult(media_urls=("u",), cost=1.0)),
            FinalizeClaimed(at=start + 3 * step, actor="w", owner="w",
                            lease_until=start + 3 * step + timedelta(minutes=1)),
            Completed(at=start + 4 * step, actor="w", cost=1.0)]


def test_stats_and_verify_print_human_durations(
        db_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    now = datetime.now(UTC)

    async def fleet(c: Conn) -> None:
        for i, seconds in enumerate((10.123456789, 20.5, 7200.25)):
            await new_job(c, _completed(now - timedelta(hours=3), seconds, f"t-{i}"))
        await new_job(c, [CallStarted(at=now - timedelta(hours=1), actor="w", kind="kie-llm",
                                      sync=True), Swept(at=now, actor="reconciler:1")])
        await new_job(c, [CallStarted(at=now - timedelta(hours=2), actor="w",
                                      kind="kie-standard"),
                          TaskCreated(at=now - timedelta(hours=2), actor="w", task_id="old")])

    run_sync(db_url, fleet)
    assert cli(db_url, monkeypatch, "stats") == 0
    out = capsys.readouterr().out
    assert "last 1 d" in out
    assert "time to terminal (last 1 d)" in out
    assert re.search(r"\b10 min\b", out), out  # kie-standard's stale threshold
    # kie-standard's times to terminal: 10.1 s, 20.5 s, 2 h (interpolated percentiles)
    assert re.search(r"kie-standard\W+3\W+20\.5 s\W+1 h 48 min\W+1 h 58 min", out), out
    assert not FLOAT_REPR.search(out), out
    assert cli(db_url, monkeypatch, "verify") == 0
    out = capsys.readouterr().out
    assert "took" in out
    assert re.search(r"\d+(\.\d+)? (ns|µs|ms|s)\b", out), out
    assert not FLOAT_REPR.search(out), out


def test_an_unknown_variable_is_named_on_stderr_with_the_closest_known(
        db_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CALLWARDEN_MEDIA_DIRR", str(tmp_path))
    assert cli(db_url, monkeypatch, "status") == 0  # a warning: the command still runs
    err = capsys.readouterr().err
    assert ("warning: CALLWARDEN_MEDIA_DIRR: unknown variable, ignored (did you mean "
            "CALLWARDEN_MEDIA_DIR?)") in " ".join(err.split())
