"""``audit`` and ``stats`` on a real Postgres: timelines read back from the log, the CLI's
messages and exit codes, and operator statistics."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from callwarden.database.db import Conn
from callwarden.database.jobs import create_job
from callwarden.errors import JobNotFound
from callwarden.events.codec import EventDecodeError
from callwarden.events.types import (
    CallStarted,
    Completed,
    Event,
    FinalizeClaimed,
    ReconcileAttempted,
    Swept,
    TaskCreated,
    UpstreamResult,
    UpstreamSucceeded,
)
from callwarden.projections.stats import percentile
from callwarden.reconciler.config import ReconcileConfig
from callwarden.replay.audit import audit_job, stats
from tests.support.audit import cli, new_job, run_sync
from tests.support.paths import PATHS, completed_path


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_audit_shows_each_terminal_path_and_its_settlement(conn: Conn, path: str) -> None:
    make, settlement, by = PATHS[path]
    job = await new_job(conn, make())
    report = await audit_job(conn, job)
    assert [r.type for r in report.timeline] == [type(e).__name__ for e in make()]
    assert report.call_state == path
    last = report.timeline[-1]
    assert (last.state_after, last.settlement, last.settled_by) == (path, settlement, by)
    assert [r.status for r in report.reservations] == [settlement]


async def test_audit_of_a_completed_call_shows_the_charged_credits(conn: Conn) -> None:
    job = await new_job(conn, completed_path(cost=4.0), credits=10)
    report = await audit_job(conn, job)
    assert report.timeline[-1].settled_cost == 4.0
    (reservation,) = report.reservations
    assert (reservation.credits_reserved, reservation.credits_charged) == (10.0, 4.0)
    assert reservation.settled_at is not None


async def test_audit_of_an_unknown_job_is_a_typed_error(conn: Conn) -> None:
    with pytest.raises(JobNotFound):
        await audit_job(conn, uuid.uuid4())


async def test_audit_of_a_corrupt_log_names_job_and_seq(conn: Conn) -> None:
    job = await new_job(conn, completed_path())
    await conn.execute("UPDATE callwarden.call_events SET payload = '{\"type\": \"TaskCreated\"}' "
                       "WHERE job_id = %s AND seq = 2", (job,))
    with pytest.raises(EventDecodeError, match=f"job {job} seq 2"):
        await audit_job(conn, job)


def test_cli_audit_json_is_the_timeline(db_url: str, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    job = run_sync(db_url, lambda c: new_job(c, completed_path(cost=4.0)))
    assert cli(db_url, monkeypatch, "audit", str(job), "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["job_id"] == str(job)
    assert [r["state_after"] for r in data["timeline"]][-1] == "completed"
    assert data["timeline"][-1]["settlement"] == "committed"
    assert data["timeline"][1]["since_previous_s"] == 1.5


def test_cli_audit_table_names_events_and_settlement(
        db_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    job = run_sync(db_url, lambda c: new_job(c, completed_path(cost=4.0)))
    monkeypatch.setenv("COLUMNS", "250")
    assert cli(db_url, monkeypatch, "audit", str(job)) == 0
    out = capsys.readouterr().out
    for text in ("CallStarted", "Completed", "committed, priced 4", "reservation: committed"):
        assert text in out


def test_cli_audit_of_unknown_job_says_so_and_exits_1(
        db_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    missing = uuid.uuid4()
    assert cli(db_url, monkeypatch, "audit", str(missing)) == 1
    assert f"no job {missing}" in capsys.readouterr().err


def test_cli_audit_of_job_without_events_says_so_and_exits_0(
        db_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    job = run_sync(db_url, lambda c: create_job(c))
    assert cli(db_url, monkeypatch, "audit", str(job)) == 0
    assert "has no call events" in capsys.readouterr().out


def test_cli_audit_of_corrupt_event_exits_2_naming_job_and_seq(
        db_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    async def corrupt(c: Conn) -> uuid.UUID:
        job = await new_job(c, completed_path())
        await c.execute("UPDATE callwarden.call_events SET type = 'Teleported' "
                        "WHERE job_id = %s AND seq = 3", (job,))
        return job

    job = run_sync(db_url, corrupt)
    monkeypatch.setenv("COLUMNS", "250")
    assert cli(db_url, monkeypatch, "audit", str(job)) == 2
    err = capsys.readouterr().err
    assert f"job {job} seq 3" in err
    assert "Teleported" in err


def _completed(start: datetime, seconds: float, task: str,
               closer: str = "worker:1") -> list[Event]:
    step = timedelta(seconds=seconds / 4)
    return [
        CallStarted(at=start, actor="worker:1", kind="kie-standard"),
        TaskCreated(at=start + step, actor="worker:1", task_id=task),
        UpstreamSucceeded(at=start + 2 * step, actor=closer,
                          result=UpstreamResult(media_urls=("u",), cost=1.0)),
        FinalizeClaimed(at=start + 3 * step, actor=closer, owner=closer,
                        lease_until=start + 3 * step + timedelta(minutes=1)),
        Completed(at=start + 4 * step, actor=closer, cost=1.0),
    ]


async def _fleet(conn: Conn, now: datetime) -> list[float]:
    """Four completed calls of 10..40 s and one a reconciler completed after 2 h; two
    reconciler sweeps; one stale and one fresh open call. Returns the kie-standard
    times to terminal."""
    durations = [10.0, 20.0, 30.0, 40.0]
    for i, d in enumerate(durations):
        await new_job(conn, _completed(now - timedelta(hours=1), d, f"done-{i}"))
    await new_job(conn, _completed(now - timedelta(hours=2), 7200, "rec", "reconciler:a1"))
    for i in range(2):
        await new_job(conn, [CallStarted(at=now - timedelta(hours=1), actor="w",
                                         kind="kie-llm", sync=True),
                             Swept(at=now, actor=f"reconciler:{i}")])
    # (TaskCreated is a call's first heartbeat: the fresh one beat 30 s ago, inside the
    # 60 s heartbeat timeout; the stale one 30 min ago)
    old, fresh = now - timedelta(minutes=30), now - timedelta(seconds=30)
    for start, task in ((old, "stale-1"), (fresh, "fresh-1")):
        await new_job(conn, [CallStarted(at=start, actor="w", kind="kie-standard"),
                             TaskCreated(at=start, actor="w", task_id=task),
                             ReconcileAttempted(at=start, actor="reconciler:z",
                                                outcome="still_running")])
    return [*durations, 7200.0]


async def test_stats_counts_kinds_states_stale_recoveries_and_latency(conn: Conn) -> None:
    now = datetime.now(UTC)
    await _fleet(conn, now)
    report = await stats(conn, now=now, window=timedelta(hours=24),
                         stale=ReconcileConfig(thresholds_s={"kie-standard": 600.0,
                                                            "kie-llm": 300.0}).stale)
    by = {(k.kind, k.state): k.calls for k in report.by_kind_state}
    assert by == {("kie-standard", "completed"): 5, ("kie-standard", "polling"): 2,
                  ("kie-llm", "swept"): 2}
    assert [(s.kind, s.stale) for s in report.stale] == [("kie-standard", 1)]
    assert report.recoveries == {"Completed": 1, "Swept": 2}
    assert report.sweeps == {"kie-llm": 2}
    overall = next(x for x in report.time_to_terminal if x.kind == "all")
    assert overall.calls == 7


async def test_stats_percentiles_match_the_pure_definition(conn: Conn) -> None:
    now = datetime.now(UTC)
    durations = await _fleet(conn, now)
    report = await stats(conn, now=now, window=timedelta(hours=24), stale=ReconcileConfig().stale)
    std = next(x for x in report.time_to_terminal if x.kind == "kie-standard")
    assert std.calls == len(durations)
    assert std.p50_s == pytest.approx(percentile(durations, 0.5))
    assert std.p95_s == pytest.approx(percentile(durations, 0.95))
    assert std.p99_s == pytest.approx(percentile(durations, 0.99))


async def test_stats_window_excludes_older_events(conn: Conn) -> None:
    now = datetime.now(UTC)
    await _fleet(conn, now)
    await conn.execute("UPDATE callwarden.call_events SET recorded_at = now() - interval '3 days'")
    report = await stats(conn, now=now, window=timedelta(hours=24), stale=ReconcileConfig().stale)
    assert report.recoveries == {}
    assert report.sweeps == {}


def test_cli_stats_json(db_url: str, monkeypatch: pytest.MonkeyPatch,
                        capsys: pytest.CaptureFixture[str]) -> None:
    run_sync(db_url, lambda c: _fleet(c, datetime.now(UTC)))
    assert cli(db_url, monkeypatch, "stats", "--json", "--window", "12h") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["window_s"] == 12 * 3600
    assert data["sweeps"] == {"kie-llm": 2}
    # Real kind thresholds: the 30-minute-old kie-standard call is past its 10 minutes.
    assert {"kind": "kie-standard", "threshold_s": 600.0, "stale": 1} in data["stale"]
