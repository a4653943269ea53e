"""Jobs a host ends with plain SQL, outside callwarden (issue 38, part 5): the original
design's Phase 1 as written updates the job, then commits its credits in a second
statement, and leaves the reservation ``reserved`` forever when that one fails. The rows
here are written as such a host writes them (plain SQL, no callwarden call); the reconciler
must record every one of them in the log at once (so ``verify`` and ``audit`` cover it),
settle what the host left reserved on a completed job by the documented policy once
``host_left_after_s`` has passed since it recorded that, and report what it may not
settle (``stats``, ``/metrics``, ``check``)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, cast

from callwarden.database.db import Conn
from callwarden.database.port import Database, Row
from callwarden.database.write import load_events
from callwarden.events.types import HostEnded, LeftoverSettled
from callwarden.reconciler.config import ReconcileConfig
from callwarden.reconciler.outside import Outside
from callwarden.replay.audit import host_left
from callwarden.replay.verify import verify_job
from callwarden.service.metrics import CallGauges
from tests.integration.conftest import MakeReconciler
from tests.support.calls import dead_worker_call
from tests.support.paths import T0

GRACE = timedelta(seconds=301)


async def host_job(conn: Conn, status: str, *, credits: str | None = "10",
                   committed: str | None = None, age: timedelta = timedelta(0)) -> uuid.UUID:
    """A job the host made and ended by itself, as its own SQL does (no callwarden call):
    its row, its reservation (``committed``: the host's own commit of that amount)."""
    job = uuid.uuid4()
    await conn.execute(
        "INSERT INTO jobs (id, user_id, job_type, status, input_data, created_at, updated_at) "
        "VALUES (%s, 'u1', 'image', 'processing', '{}', now() - %s, now() - %s)",
        (job, age, age))
    if credits is not None:
        await conn.execute("INSERT INTO usage_logs (job_id, user_id, status, credits_reserved) "
                           "VALUES (%s, 'u1', 'reserved', %s)", (job, Decimal(credits)))
    await conn.execute("UPDATE jobs SET status = %s, completed_at = now() - %s WHERE id = %s",
                       (status, age, job))
    if committed is not None:
        await conn.execute("UPDATE usage_logs SET status = 'committed', credits_charged = %s "
                           "WHERE job_id = %s", (Decimal(committed), job))
    return job


async def db_now(conn: Conn) -> datetime:
    got = await (await conn.execute("SELECT now() AS now")).fetchone()
    assert got is not None
    return got["now"]  # type: ignore[no-any-return]


async def credits(conn: Conn, job: uuid.UUID) -> list[tuple[str, Decimal | None]]:
    cur = await conn.execute("SELECT status, credits_charged FROM usage_logs WHERE job_id = %s",
                             (job,))
    return [(r["status"], r["credits_charged"]) for r in await cur.fetchall()]


async def test_every_job_the_host_ended_gets_its_event_and_what_it_left_its_policy(
        conn: Conn, make_reconciler: MakeReconciler) -> None:
    completed_left = await host_job(conn, "completed")
    completed_paid = await host_job(conn, "completed", committed="3")
    failed_left = await host_job(conn, "failed")
    cancelled = await host_job(conn, "cancelled")
    no_credits = await host_job(conn, "completed", credits=None)
    jobs = [completed_left, completed_paid, failed_left, cancelled, no_credits]
    reconciler = make_reconciler()
    now = await db_now(conn)
    first = await reconciler.reconcile_once(now)
    assert (first.ended_outside, first.leftovers_settled) == (5, 0)
    # a completed job is the host's to commit (its commit is its next statement)...
    assert await credits(conn, completed_left) == [("reserved", None)]
    assert await credits(conn, completed_paid) == [("committed", Decimal(3))]
    # ...a failed or cancelled one is refunded at once
    assert await credits(conn, failed_left) == [("refunded", Decimal(0))]
    assert await credits(conn, cancelled) == [("refunded", Decimal(0))]
    for job in jobs:
        assert [type(e) for e in await load_events(conn, job)] == [HostEnded]
        assert await verify_job(conn, job) == []
    # host_left_after_s after callwarden recorded it, the host never committed: the policy
    later = await reconciler.reconcile_once(now + GRACE)
    assert (later.ended_outside, later.leftovers_settled) == (0, 1)
    assert await credits(conn, completed_left) == [("committed", Decimal(10))]
    assert [type(e) for e in await load_events(conn, completed_left)] == [
        HostEnded, LeftoverSettled]
    assert await credits(conn, completed_paid) == [("committed", Decimal(3))]  # untouched
    for job in jobs:
        assert await verify_job(conn, job) == []
    status = await (await conn.execute("SELECT status FROM jobs WHERE id = %s",
                                       (completed_left,))).fetchone()
    assert status is not None
    assert status["status"] == "completed"  # the host's word stays
    # another reconciler records nothing again
    again = await make_reconciler().reconcile_once(now + 2 * GRACE)
    assert (again.ended_outside, again.leftovers_settled) == (0, 0)


async def test_a_host_commit_within_the_grace_is_the_one_that_stands(
        conn: Conn, make_reconciler: MakeReconciler) -> None:
    job = await host_job(conn, "completed")
    reconciler = make_reconciler()
    now = await db_now(conn)
    assert (await reconciler.reconcile_once(now)).ended_outside == 1
    await conn.execute("UPDATE usage_logs SET status = 'committed', credits_charged = 2.5 "
                       "WHERE job_id = %s AND status = 'reserved'", (job,))
    assert (await reconciler.reconcile_once(now + GRACE)).leftovers_settled == 0
    assert await credits(conn, job) == [("committed", Decimal("2.5"))]
    assert await verify_job(conn, job) == []


async def test_an_open_call_the_host_completed_and_never_committed_is_settled(
        conn: Conn, make_reconciler: MakeReconciler) -> None:
    """The seed's worker: the call recorded, then the host's two statements, the second
    failed. The reconciler records HostEnded at once (the host's to commit), then the
    policy settles what it left."""
    job = await dead_worker_call(conn, "kie-standard", "t-left", age=timedelta(minutes=11))
    await conn.execute("UPDATE jobs SET status = 'completed' WHERE id = %s", (job,))
    reconciler = make_reconciler()
    now = await db_now(conn)
    assert (await reconciler.reconcile_once(now)).host_ended == 1
    assert await credits(conn, job) == [("reserved", None)]
    assert (await reconciler.reconcile_once(now + GRACE)).leftovers_settled == 1
    assert await credits(conn, job) == [("committed", Decimal(10))]
    assert await verify_job(conn, job) == []


async def test_what_the_policy_leaves_is_reported(conn: Conn,
                                                  make_reconciler: MakeReconciler) -> None:
    left = await host_job(conn, "completed")
    now = await db_now(conn)
    leave = make_reconciler(host_completed_reserved="leave")
    assert (await leave.reconcile_once(now)).ended_outside == 1
    assert (await leave.reconcile_once(now + GRACE)).leftovers_settled == 0
    assert await credits(conn, left) == [("reserved", None)]
    assert await verify_job(conn, left) == []  # recorded as the host's to settle
    assert (await host_left(conn, now=now, after_s=300)).reservations == 0  # not yet
    report = await host_left(conn, now=now + GRACE, after_s=300)
    assert (report.reservations, report.credits) == (1, 10.0)
    gauges = await CallGauges(ReconcileConfig().stale).families(conn, now + GRACE)
    gauge = next(f for f in gauges if f.name == "callwarden_reservations_host_left")
    assert [s.value for s in gauge.samples] == [1.0]


async def test_jobs_before_the_window_stay_as_the_host_left_them_and_are_reported(
        conn: Conn, make_reconciler: MakeReconciler) -> None:
    old = await host_job(conn, "failed", age=timedelta(days=8))
    now = await db_now(conn)
    assert (await make_reconciler().reconcile_once(now)).ended_outside == 0
    assert await load_events(conn, old) == []
    assert await credits(conn, old) == [("reserved", None)]
    assert (await host_left(conn, now=now, after_s=300)).reservations == 1
    recent = await host_job(conn, "failed")
    off = make_reconciler(outside_window_s=0)
    assert (await off.reconcile_once(now)).ended_outside == 0
    assert await load_events(conn, recent) == []


async def test_one_job_the_host_refuses_to_have_written_does_not_stop_the_others(
        conn: Conn, make_reconciler: MakeReconciler) -> None:
    """A host constraint that refuses any call on an archived job (a trigger would do it
    on plain Postgres; Citus takes constraints only): that job is logged and left; the
    newer one is recorded in the same pass."""
    archived = await host_job(conn, "failed", age=timedelta(days=1))
    fresh = await host_job(conn, "failed")
    await conn.execute(f"ALTER TABLE jobs ADD CONSTRAINT archived_read_only "
                       f"CHECK (id <> '{archived}' OR call_state IS NULL) NOT VALID")
    now = await db_now(conn)
    assert (await make_reconciler().reconcile_once(now)).ended_outside == 1
    assert await load_events(conn, archived) == []
    assert [type(e) for e in await load_events(conn, fresh)] == [HostEnded]


async def test_a_host_that_reopens_the_job_between_the_read_and_the_write_wins(
        conn: Conn, make_reconciler: MakeReconciler) -> None:
    """The append is fenced on the status read: a job the host put back to processing
    after the pass read it is left alone (open again: the host's)."""
    job = await host_job(conn, "failed")
    now = await db_now(conn)
    db = make_reconciler().db

    class Reopening:
        """The store, with the host reopening the job just after the pass's read."""

        async def ended_outside(self, since: datetime, batch_size: int) -> list[Row]:
            rows = await db.ended_outside(since, batch_size)
            await conn.execute("UPDATE jobs SET status = 'processing' WHERE id = %s", (job,))
            return rows

        def __getattr__(self, name: str) -> Any:
            return getattr(db, name)

    outside = Outside(cast(Database, Reopening()), "reconciler:t", ReconcileConfig())
    assert await outside.run(now) == (0, 0)
    assert await load_events(conn, job) == []
    assert await credits(conn, job) == [("reserved", None)]


def test_the_passes_run_on_the_first_reconcile_then_every_fifth_of_the_grace() -> None:
    outside = Outside(cast(Database, None), "r", ReconcileConfig())
    assert outside.due(T0)
    outside.last = T0
    assert not outside.due(T0 + timedelta(seconds=59))
    assert outside.due(T0 + timedelta(seconds=60))
    off = Outside(cast(Database, None), "r",
                  ReconcileConfig(outside_window_s=0, host_completed_reserved="leave"))
    assert not off.due(T0)
