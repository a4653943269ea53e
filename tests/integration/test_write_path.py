"""The write path on a real Postgres: one transition, one transaction, settled once."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from callwarden.database.db import Conn, connect
from callwarden.database.jobs import create_job
from callwarden.database.write import append, cancel, load, transition
from callwarden.errors import DatabaseUnavailable, JobNotFound, TaskAlreadyClaimed
from callwarden.events import (
    CallStarted,
    Completed,
    Event,
    FinalizeClaimed,
    TaskCreated,
    UpstreamFailed,
    UpstreamResult,
    UpstreamSucceeded,
)
from callwarden.events.states import CallState, InvalidTransition, TerminalStateError
from callwarden.projections.fold import EMPTY as EMPTY_PROJECTION
from callwarden.projections.fold import CallProjection

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


async def _usage(conn: Conn, job_id: uuid.UUID) -> list[dict[str, object]]:
    cur = await conn.execute(
        "SELECT status, credits_reserved, credits_charged FROM usage_logs WHERE job_id = %s",
        (job_id,))
    return [dict(r) for r in await cur.fetchall()]


async def _events(conn: Conn, job_id: uuid.UUID) -> list[str]:
    cur = await conn.execute(
        "SELECT type FROM callwarden.call_events WHERE job_id = %s ORDER BY seq", (job_id,))
    return [r["type"] for r in await cur.fetchall()]


async def _drive(conn: Conn, job_id: uuid.UUID, events: list[Event]) -> CallProjection:
    p = await load(conn, job_id)
    for e in events:
        r = await append(conn, job_id, p, e)
        assert r.ok
        p = r.projection
    return p


def _happy(cost: float | None = 4.0) -> list[Event]:
    return [
        CallStarted(at=T0, actor="w", kind="kie-standard"),
        TaskCreated(at=T0 + timedelta(seconds=1), actor="w", task_id="t-1"),
        UpstreamSucceeded(at=T0 + timedelta(seconds=9), actor="w",
                          result=UpstreamResult(media_urls=("http://x/a.png",), cost=cost)),
        FinalizeClaimed(at=T0 + timedelta(seconds=10), actor="w", owner="w",
                        lease_until=T0 + timedelta(seconds=70)),
        Completed(at=T0 + timedelta(seconds=12), actor="w", cost=cost),
    ]


async def test_completed_call_commits_actual_cost_once(conn: Conn) -> None:
    job = await create_job(conn, credits=10)
    p = await _drive(conn, job, _happy(cost=4.0))
    assert p.state is CallState.COMPLETED
    row = await (await conn.execute(
        "SELECT status, call_state, call_version, progress, provider_task_id, completed_at "
        "FROM jobs WHERE id = %s", (job,))).fetchone()
    assert row is not None
    assert (row["status"], row["call_state"], row["call_version"], row["progress"]) == (
        "completed", "completed", 5, 100)
    assert row["provider_task_id"] == "t-1"
    assert row["completed_at"] == T0 + timedelta(seconds=12)
    assert await _usage(conn, job) == [
        {"status": "committed", "credits_reserved": 10, "credits_charged": 4}]
    assert await _events(conn, job) == [
        "CallStarted", "TaskCreated", "UpstreamSucceeded", "FinalizeClaimed", "Completed"]


async def test_commit_never_charges_above_the_reservation(conn: Conn) -> None:
    job = await create_job(conn, credits=3)
    await _drive(conn, job, _happy(cost=50.0))
    assert (await _usage(conn, job))[0]["credits_charged"] == 3


async def test_commit_without_reported_cost_charges_the_reservation(conn: Conn) -> None:
    job = await create_job(conn, credits=7)
    await _drive(conn, job, _happy(cost=None))
    assert (await _usage(conn, job))[0]["credits_charged"] == 7


async def test_upstream_failure_refunds(conn: Conn) -> None:
    job = await create_job(conn, credits=5)
    p = await _drive(conn, job, [
        CallStarted(at=T0, actor="w", kind="kie-standard"),
        UpstreamFailed(at=T0, actor="w", error="nsfw"),
    ])
    assert p.state is CallState.FAILED
    assert await _usage(conn, job) == [
        {"status": "refunded", "credits_reserved": 5, "credits_charged": 0}]
    row = await (await conn.execute(
        "SELECT status, error_message FROM jobs WHERE id = %s", (job,))).fetchone()
    assert row == {"status": "failed", "error_message": "nsfw"}


async def test_stale_writer_loses_and_learns_the_winner(conn: Conn) -> None:
    job = await create_job(conn)
    p0 = await _drive(conn, job, [CallStarted(at=T0, actor="w", kind="kie-standard")])
    won = await append(conn, job, p0, TaskCreated(at=T0, actor="w1", task_id="a"))
    lost = await append(conn, job, p0, UpstreamFailed(at=T0, actor="w2", error="x"))
    assert won.ok
    assert not lost.ok
    assert lost.projection.state is CallState.POLLING
    assert lost.projection.provider_task_id == "a"
    assert await _events(conn, job) == ["CallStarted", "TaskCreated"]
    assert (await _usage(conn, job))[0]["status"] == "reserved"


async def test_invalid_transition_writes_nothing(conn: Conn) -> None:
    job = await create_job(conn)
    p = await load(conn, job)
    with pytest.raises(InvalidTransition):
        await append(conn, job, p, TaskCreated(at=T0, actor="w", task_id="a"))
    assert await _events(conn, job) == []


async def test_terminal_state_is_absorbing(conn: Conn) -> None:
    job = await create_job(conn)
    p = await _drive(conn, job, [
        CallStarted(at=T0, actor="w", kind="kie-standard"),
        UpstreamFailed(at=T0, actor="w", error="boom"),
    ])
    with pytest.raises(TerminalStateError):
        await append(conn, job, p, UpstreamFailed(at=T0, actor="w", error="again"))
    result = await cancel(conn, job, by="user:1", now=T0)
    assert not result.ok
    assert result.projection.state is CallState.FAILED
    assert (await _usage(conn, job))[0]["status"] == "refunded"


async def test_cancel_refunds_and_blocks_completion(conn: Conn) -> None:
    job = await create_job(conn, credits=9)
    p = await _drive(conn, job, _happy()[:4])  # finalizing
    assert (await cancel(conn, job, by="user:1", now=T0)).ok
    late = await append(conn, job, p, Completed(at=T0, actor="w", cost=1.0))
    assert not late.ok
    assert late.projection.state is CallState.CANCELLED
    assert await _usage(conn, job) == [
        {"status": "refunded", "credits_reserved": 9, "credits_charged": 0}]


async def test_job_cancelled_by_host_column_fences_workers(conn: Conn) -> None:
    """The seed's CAS: a host that sets status='cancelled' directly stops completion; the
    next transition records the host's decision (HostEnded), which refunds."""
    job = await create_job(conn, credits=2)
    p = await _drive(conn, job, _happy()[:4])
    await conn.execute("UPDATE jobs SET status = 'cancelled' WHERE id = %s", (job,))
    late = await append(conn, job, p, Completed(at=T0, actor="w", cost=1.0))
    assert not late.ok
    r = await cancel(conn, job, by="admin", now=T0)
    assert (r.ok, r.host_ended, r.projection.state) == (False, True, CallState.CANCELLED)
    assert (await _usage(conn, job))[0]["status"] == "refunded"
    assert (await _events(conn, job))[-1] == "HostEnded"


async def test_job_without_reservation_settles_as_documented_noop(conn: Conn) -> None:
    job = await create_job(conn, credits=None)
    p = await _drive(conn, job, _happy()[:4])
    r = await append(conn, job, p, Completed(at=T0, actor="w", cost=1.0))
    assert r.ok
    assert r.settlement == "no_reservation"


async def test_reservation_settled_elsewhere_is_reported_not_overwritten(conn: Conn) -> None:
    """A write decided before the host settled the reservation is refused (the fence on
    the reservations read); decided again on the fresh read it lands, settling nothing."""
    job = await create_job(conn, credits=4)
    p = await _drive(conn, job, _happy()[:4])
    await conn.execute("UPDATE usage_logs SET status = 'refunded' WHERE job_id = %s", (job,))
    stale = await append(conn, job, p, Completed(at=T0, actor="w", cost=1.0))
    assert (stale.ok, stale.projection.settled_reservations) == (False, 1)
    r = await append(conn, job, stale.projection, Completed(at=T0, actor="w", cost=1.0))
    assert r.ok
    assert r.settlement == "already_settled"
    assert (await _usage(conn, job))[0]["status"] == "refunded"


async def test_two_jobs_cannot_claim_one_upstream_task(conn: Conn) -> None:
    a, b = await create_job(conn), await create_job(conn)
    for job in (a, b):
        await _drive(conn, job, [CallStarted(at=T0, actor="w", kind="kie-standard")])
    await _drive(conn, a, [TaskCreated(at=T0, actor="w", task_id="same")])
    pb = await load(conn, b)
    with pytest.raises(TaskAlreadyClaimed):
        await append(conn, b, pb, TaskCreated(at=T0, actor="w", task_id="same"))
    assert await _events(conn, b) == ["CallStarted"]


async def test_a_fenced_out_task_created_naming_a_held_task_is_a_lost_race(
        conn: Conn) -> None:
    """The fences come before the task's claim, on plain Postgres (the unique index is
    checked only on the row the update wins) and on Citus (the claim in callwarden_tasks
    is made only once the update has won): a stale writer whose job the host cancelled
    loses the race (ok=False, the host's end shown), never TaskAlreadyClaimed."""
    a, b = await create_job(conn), await create_job(conn)
    for job in (a, b):
        await _drive(conn, job, [CallStarted(at=T0, actor="w", kind="kie-standard")])
    await _drive(conn, a, [TaskCreated(at=T0, actor="w", task_id="held")])
    stale = await load(conn, b)
    await conn.execute("UPDATE jobs SET status = 'cancelled' WHERE id = %s", (b,))
    r = await append(conn, b, stale, TaskCreated(at=T0, actor="w", task_id="held"))
    assert (r.ok, r.projection.status) == (False, "cancelled")
    assert await _events(conn, b) == ["CallStarted"]


async def test_unknown_job_is_a_typed_error(conn: Conn) -> None:
    with pytest.raises(JobNotFound):
        await load(conn, uuid.uuid4())


async def test_transition_redecides_after_losing(db_url: str) -> None:
    """Many concurrent cancellers and failers: exactly one terminal event, one refund."""
    setup = await connect(db_url)
    async with setup:
        job = await create_job(setup, credits=3)
        await _drive(setup, job, [CallStarted(at=T0, actor="w", kind="kie-standard")])

    async def actor(i: int) -> bool:
        c = await connect(db_url)
        async with c:
            def decide(p: CallProjection) -> Event | None:
                if p.terminal:
                    return None
                return UpstreamFailed(at=T0, actor=f"a{i}", error="x")
            return (await transition(c, job, decide)).ok

    results = await asyncio.gather(*(actor(i) for i in range(6)))
    assert sorted(results) == [False] * 5 + [True]
    async with await connect(db_url) as check:
        assert await _events(check, job) == ["CallStarted", "UpstreamFailed"]
        assert (await _usage(check, job))[0]["status"] == "refunded"


@pytest.mark.own_backend
async def test_dead_database_is_a_typed_error_and_loses_nothing(db_url: str) -> None:
    victim = await connect(db_url)
    async with await connect(db_url) as admin:
        job = await create_job(admin)
        pid = (await (await victim.execute("SELECT pg_backend_pid() AS pid")).fetchone())
        assert pid is not None
        await admin.execute("SELECT pg_terminate_backend(%s::int)", (pid["pid"],))
        p = await load(admin, job)
        with pytest.raises(DatabaseUnavailable):
            await append(victim, job, p, CallStarted(at=T0, actor="w", kind="kie-standard"))
        assert await _events(admin, job) == []
    await victim.close()


async def test_a_run_of_events_is_one_fenced_statement(conn: Conn) -> None:
    """UpstreamSucceeded, FinalizeClaimed and Completed decided at once are appended in one
    statement (issue 26.2): seqs 3, 4, 5, the projection at version 5, the reservation
    committed once, by the last event; the same run from a stale read writes nothing."""
    job = await create_job(conn, credits=10)
    happy = _happy(cost=4.0)
    p = await _drive(conn, job, happy[:2])
    r = await append(conn, job, p, happy[2:])
    assert r.ok
    assert [type(e).__name__ for e in r.events] == [
        "UpstreamSucceeded", "FinalizeClaimed", "Completed"]
    assert r.settlement == "settled"
    assert r.projection.version == 5
    assert (await load(conn, job)).version == 5
    assert await _events(conn, job) == [
        "CallStarted", "TaskCreated", "UpstreamSucceeded", "FinalizeClaimed", "Completed"]
    settled = await (await conn.execute(
        "SELECT settled_by_seq FROM usage_logs WHERE job_id = %s", (job,))).fetchone()
    assert settled is not None
    assert settled["settled_by_seq"] == 5
    assert await _usage(conn, job) == [
        {"status": "committed", "credits_reserved": 10, "credits_charged": 4}]
    again = await append(conn, job, p, happy[2:])  # the same run from the stale read
    assert not again.ok
    assert len(await _events(conn, job)) == 5


async def test_a_run_must_be_legal_event_by_event_and_never_holds_a_start(conn: Conn) -> None:
    job = await create_job(conn, credits=10)
    happy = _happy()
    p = await _drive(conn, job, happy[:2])
    with pytest.raises(InvalidTransition):
        await append(conn, job, p, [happy[2], happy[4]])  # Completed without a claim
    with pytest.raises(ValueError, match="alone"):
        await append(conn, job, EMPTY_PROJECTION, happy[:2])
    assert await _events(conn, job) == ["CallStarted", "TaskCreated"]
