"""``verify`` and ``rebuild`` on a real Postgres: tampering is found, the log repairs the
projection, and a rebuild racing live writers never loses their updates."""

from __future__ import annotations

import asyncio
import json
import uuid

import msgspec
import pytest

from callwarden.database.db import Conn, connect
from callwarden.database.snapshot import snapshot
from callwarden.database.write import Decide, load, load_events, transition
from callwarden.events.types import Event, TaskCreated
from callwarden.projections.fold import CallProjection, fold
from callwarden.replay.history import read_histories
from callwarden.replay.rebuild import RebuildReport, Write, apply_writes, plan, rebuild, rebuild_job
from callwarden.replay.verify import verify, verify_job
from tests.support.audit import cli, new_job, run_sync
from tests.support.paths import PATHS, at, completed_path


async def _all_paths(conn: Conn) -> dict[str, uuid.UUID]:
    return {name: await new_job(conn, make(f"t-{name}"))
            for name, (make, _, _) in PATHS.items()}


async def _columns(conn: Conn, job: uuid.UUID) -> dict[str, object]:
    cur = await conn.execute(
        "SELECT call_version, provider_task_id, status FROM jobs WHERE id = %s", (job,))
    row = await cur.fetchone()
    assert row is not None
    return dict(row)


async def test_a_truthful_database_verifies_clean(conn: Conn) -> None:
    await _all_paths(conn)
    summary, _ = await verify(conn, batch=2)
    assert summary.ok
    assert (summary.jobs, summary.events) == (5, 19)


async def test_verify_reports_a_tampered_projection_column(conn: Conn) -> None:
    jobs = await _all_paths(conn)
    await conn.execute("UPDATE jobs SET provider_task_id = 'evil' WHERE id = %s",
                       (jobs["completed"],))
    summary, batches = await verify(conn)
    (m,) = [m for b in batches for m in b.mismatches]
    assert (m.job_id, m.column, m.projected, m.folded) == (
        str(jobs["completed"]), "provider_task_id", "evil", "t-completed")
    assert (summary.mismatched_jobs, summary.jobs, summary.ok) == (1, 5, False)


async def test_verify_reports_a_tampered_settlement(conn: Conn) -> None:
    jobs = await _all_paths(conn)
    await conn.execute("UPDATE usage_logs SET status = 'refunded' WHERE job_id = %s",
                       (jobs["completed"],))
    _, batches = await verify(conn)
    (m,) = [m for b in batches for m in b.mismatches]
    assert (m.column, m.projected, m.folded) == (
        "usage_logs.status", "refunded (by seq 5)", "committed")


async def test_verify_tells_a_reservation_the_host_settled_from_a_leak(conn: Conn) -> None:
    """A reservation host code settled (no call seq) is the host's; one left reserved on a
    terminal call is a leak."""
    jobs = await _all_paths(conn)
    await conn.execute("UPDATE usage_logs SET status = 'committed', settled_by_seq = NULL "
                       "WHERE job_id = %s", (jobs["failed"],))
    await conn.execute("UPDATE usage_logs SET status = 'reserved', settled_by_seq = NULL "
                       "WHERE job_id = %s", (jobs["swept"],))
    _, batches = await verify(conn)
    found = [(m.job_id, m.projected, m.folded) for b in batches for m in b.mismatches]
    assert found == [(str(jobs["swept"]), "reserved", "refunded")]


async def test_verify_reports_a_missing_event_and_goes_on(conn: Conn) -> None:
    jobs = await _all_paths(conn)
    await conn.execute("DELETE FROM callwarden.call_events WHERE job_id = %s AND seq = 2",
                       (jobs["exhausted"],))
    summary, batches = await verify(conn, batch=2)
    (e,) = [e for b in batches for e in b.errors]
    assert (e.job_id, e.seq) == (str(jobs["exhausted"]), 2)
    assert "missing event" in e.reason
    assert (summary.jobs, summary.errors, summary.mismatches) == (5, 1, 0)


async def test_verify_reports_a_corrupt_payload_with_job_and_seq(conn: Conn) -> None:
    jobs = await _all_paths(conn)
    await conn.execute("UPDATE callwarden.call_events SET payload = '{\"type\": \"TaskCreated\", "
                       "\"at\": \"yesterday\", \"actor\": \"w\", \"task_id\": \"x\"}' "
                       "WHERE job_id = %s AND seq = 2", (jobs["failed"],))
    summary, batches = await verify(conn)
    (e,) = [e for b in batches for e in b.errors]
    assert (e.job_id, e.seq) == (str(jobs["failed"]), 2)
    assert "invalid TaskCreated payload" in e.reason
    assert summary.jobs == 5


async def test_verify_reports_a_log_that_cannot_be_replayed(conn: Conn) -> None:
    job = await new_job(conn, completed_path())
    await conn.execute("UPDATE callwarden.call_events SET type = 'Completed', payload = jsonb_set("
                       "payload, '{type}', '\"Completed\"') WHERE job_id = %s AND seq = 2",
                       (job,))
    _, batches = await verify(conn)
    (e,) = [e for b in batches for e in b.errors]
    assert e.seq == 2
    assert "Completed may not follow state created" in e.reason


async def test_verify_sees_a_projection_whose_log_is_gone(conn: Conn) -> None:
    job = await new_job(conn, completed_path())
    await conn.execute("DELETE FROM callwarden.call_events WHERE job_id = %s", (job,))
    _, batches = await verify(conn)
    columns = {m.column for b in batches for m in b.mismatches}
    assert {"state", "version"} <= columns


async def test_verify_since_checks_only_jobs_with_recent_events(conn: Conn) -> None:
    jobs = await _all_paths(conn)
    await conn.execute("UPDATE callwarden.call_events SET recorded_at = now() - interval '2 days' "
                       "WHERE job_id <> %s", (jobs["swept"],))
    await conn.execute("UPDATE jobs SET provider_task_id = 'evil' WHERE id = %s",
                       (jobs["completed"],))
    cur = await conn.execute("SELECT now() - interval '1 day' AS t")
    row = await cur.fetchone()
    assert row is not None
    summary, _ = await verify(conn, since=row["t"])
    assert (summary.jobs, summary.ok) == (1, True)


def test_cli_verify_json_lists_each_mismatch_and_exits_1(
        db_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    async def tamper(c: Conn) -> dict[str, uuid.UUID]:
        jobs = await _all_paths(c)
        await c.execute("UPDATE jobs SET reconcile_attempts = 7 WHERE id = %s",
                        (jobs["failed"],))
        await c.execute("DELETE FROM callwarden.call_events WHERE job_id = %s AND seq = 1",
                        (jobs["swept"],))
        return jobs

    jobs = run_sync(db_url, tamper)
    assert cli(db_url, monkeypatch, "verify", "--json", "--batch", "2") == 1
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    mismatches = [x["mismatch"] for x in lines if "mismatch" in x]
    assert mismatches == [{"job_id": str(jobs["failed"]), "column": "reconcile_attempts",
                           "projected": 7, "folded": 1}]
    errors = [x["error"] for x in lines if "error" in x]
    assert errors == [{"job_id": str(jobs["swept"]), "seq": 1,
                       "reason": "missing event (next is 2)"}]
    summary = lines[-1]
    assert summary["ok"] is False
    assert (summary["summary"]["jobs"], summary["summary"]["mismatches"]) == (5, 1)


def test_cli_verify_of_a_clean_database_exits_0(
        db_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    run_sync(db_url, _all_paths)
    assert cli(db_url, monkeypatch, "verify") == 0
    assert "verify ok" in capsys.readouterr().out


async def test_rebuild_repairs_a_tampered_column(conn: Conn) -> None:
    jobs = await _all_paths(conn)
    await conn.execute("UPDATE jobs SET provider_task_id = 'evil', reconcile_attempts = 9 "
                       "WHERE id = %s", (jobs["exhausted"],))
    report = await rebuild(conn, batch=2)
    assert (report.jobs, report.rebuilt, report.unchanged, report.failed) == (5, 1, 4, 0)
    assert await verify_job(conn, jobs["exhausted"]) == []
    summary, _ = await verify(conn)
    assert summary.ok


async def test_rebuild_never_touches_the_reservation(conn: Conn) -> None:
    jobs = await _all_paths(conn)
    await conn.execute("UPDATE usage_logs SET status = 'reserved' WHERE job_id = %s",
                       (jobs["cancelled"],))
    report = await rebuild(conn)
    assert report.rebuilt == 0
    summary, _ = await verify(conn)
    assert summary.mismatches == 1


async def test_rebuild_refuses_to_lower_call_version(conn: Conn) -> None:
    job = await new_job(conn, completed_path())
    await conn.execute("UPDATE jobs SET call_version = 9 WHERE id = %s", (job,))
    report = await rebuild(conn, job_id=job)
    assert (report.failed, report.rebuilt) == (1, 0)
    assert "ahead of its log" in report.failures[0].reason
    assert (await _columns(conn, job))["call_version"] == 9


async def test_rebuild_keeps_a_host_cancel_the_log_has_not_recorded(conn: Conn) -> None:
    job = await new_job(conn, completed_path()[:2])
    await conn.execute("UPDATE jobs SET status = 'cancelled', provider_task_id = 'x' "
                       "WHERE id = %s", (job,))
    report = await rebuild(conn, job_id=job)
    assert report.rebuilt == 1
    assert await _columns(conn, job) == {"call_version": 2, "provider_task_id": "t-1",
                                         "status": "cancelled"}


async def test_rebuild_skips_jobs_whose_log_cannot_be_replayed(conn: Conn) -> None:
    jobs = await _all_paths(conn)
    await conn.execute("DELETE FROM callwarden.call_events WHERE job_id = %s AND seq = 2",
                       (jobs["completed"],))
    report = await rebuild(conn, force=True)
    assert (report.rebuilt, report.failed) == (4, 1)
    assert (report.failures[0].job_id, report.failures[0].seq) == (str(jobs["completed"]), 2)


def test_cli_rebuild_reports_counts(db_url: str, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    async def tamper(c: Conn) -> None:
        jobs = await _all_paths(c)
        await c.execute("UPDATE jobs SET error_message = 'lies', reconcile_last_error = 'x'"
                        " WHERE id = %s", (jobs["failed"],))

    run_sync(db_url, tamper)
    assert cli(db_url, monkeypatch, "rebuild", "--all", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert {k: report[k] for k in ("jobs", "rebuilt", "unchanged", "retried", "failed")} == {
        "jobs": 5, "rebuilt": 1, "unchanged": 4, "retried": 0, "failed": 0}
    assert cli(db_url, monkeypatch, "verify") == 0


def test_cli_rebuild_of_unknown_job_exits_1(db_url: str, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    missing = uuid.uuid4()
    assert cli(db_url, monkeypatch, "rebuild", "--job", str(missing)) == 1
    assert f"no job {missing}" in capsys.readouterr().err


async def test_rebuild_write_is_fenced_on_the_version_it_read(db_url: str) -> None:
    """Deterministic interleaving: rebuild reads, a writer appends, rebuild writes. The
    stale write matches nothing; the retry folds the writer's event in."""
    async with await connect(db_url) as rb, await connect(db_url) as writer:
        job = await new_job(writer, completed_path()[:1])
        await rb.execute("UPDATE jobs SET reconcile_attempts = 5 WHERE id = %s", (job,))
        async with snapshot(rb):
            (h,) = await read_histories(rb, [job])
        decision = plan(h)
        assert isinstance(decision, Write)
        await rb.execute("UPDATE jobs SET reconcile_attempts = 0 WHERE id = %s", (job,))
        assert (await transition(writer, job, _task)).ok
        assert await apply_writes(rb, [decision]) == set()
        report = RebuildReport()
        await rebuild_job(rb, job, report)
        assert await verify_job(rb, job) == []
        assert (await _columns(rb, job))["call_version"] == 2


def _task(p: CallProjection) -> Event | None:
    return TaskCreated(at=at(p.version), actor="worker:race", task_id="t-race")


def _always(event: Event) -> Decide:
    return lambda _p: event


async def _writer(db_url: str, jobs: list[uuid.UUID]) -> int:
    """Drive every job through the rest of its happy path, one event per job in turn."""
    rest = completed_path()[1:]
    written = 0
    async with await connect(db_url) as conn:
        for step in rest:
            for i, job in enumerate(jobs):
                event = step
                if isinstance(step, TaskCreated):
                    event = TaskCreated(at=step.at, actor=step.actor, task_id=f"race-{i}")
                written += (await transition(conn, job, _always(event))).ok
    return written


async def _rebuilder(db_url: str, passes: int) -> list[RebuildReport]:
    async with await connect(db_url) as conn:
        return [await rebuild(conn, batch=7, force=True) for _ in range(passes)]


async def test_rebuild_racing_a_live_writer_never_loses_its_update(db_url: str) -> None:
    async with await connect(db_url) as setup:
        jobs = [await new_job(setup, completed_path()[:1]) for _ in range(40)]
    written, reports = await asyncio.gather(_writer(db_url, jobs), _rebuilder(db_url, 6))
    assert written == 40 * 4
    assert sum(r.rebuilt for r in reports) > 0
    assert all(r.failed == 0 for r in reports)
    async with await connect(db_url) as check:
        for job in jobs:
            events = await load_events(check, job)
            assert len(events) == 5
            stored = await load(check, job)  # (with the observed reservation count)
            assert stored == msgspec.structs.replace(fold(events), settled_reservations=1)
        summary, _ = await verify(check)
        assert summary.ok


async def test_verify_snapshot_reads_do_not_block_a_writer(db_url: str) -> None:
    async with await connect(db_url) as reader, await connect(db_url) as writer:
        job = await new_job(writer, completed_path()[:1])
        async with snapshot(reader):
            await read_histories(reader, [job])
            done = await asyncio.wait_for(transition(writer, job, _task), timeout=10)
            assert done.ok
            (h,) = await read_histories(reader, [job])  # still the snapshot's view
            assert h.folded is not None
            assert h.folded.version == 1

