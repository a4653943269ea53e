"""Leases that fit the work, owner ids per claim, and one clock (issue 11, items 7-8).

A media server on 127.0.0.1 (configured as the provider's endpoint, so the media policy
allows it) holds every download until the test answers it: a slow download is a test
decision, not a sleep. Time for leases is a logical clock the test moves.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp

from callwarden.calls.finalize import Finalizer
from callwarden.database.clock import DatabaseClock, utcnow
from callwarden.database.db import Conn, Pool
from callwarden.database.jobs import create_job
from callwarden.database.write import append, execute, load, load_events
from callwarden.events.types import (
    CallStarted,
    FinalizeClaimed,
    TaskCreated,
)
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.reconciler.config import ReconcileConfig
from callwarden.reconciler.loop import Reconciler
from tests.support import no_sleep
from tests.support.leases import (
    CONFIG,
    HeldMedia,
    LogicalClock,
    settings_for,
    succeeded_call,
)


async def events_of(conn: Conn, job: uuid.UUID) -> list[str]:
    return [type(e).__name__ for e in await load_events(conn, job)]


# -- 7. leases that fit the work --------------------------------------------------------------

async def test_slow_download_keeps_its_claim_past_the_short_lease(
        conn: Conn, pool: Pool, held: HeldMedia, tmp_path: Path) -> None:
    clock = LogicalClock(datetime(2026, 5, 19, 12, tzinfo=UTC))
    job = await succeeded_call(conn, f"{held.url}/a.png", clock())
    store = LocalFolderStore(tmp_path)
    worker = Finalizer(pool, store, settings_for(held), owner="worker:a", clock=clock,
                       config=CONFIG)
    other = Finalizer(pool, store, settings_for(held), owner="reconciler:b", clock=clock,
                      config=CONFIG)
    slow = asyncio.create_task(worker.finalize(job))
    await held.wait_for(1)
    clock.advance(CONFIG.finalize_lease_s + 120)  # past the shortest lease, inside this one
    assert (await other.finalize(job)).outcome == "not_claimable"
    held.pending[0].set_result(200)
    assert (await slow).outcome == "completed"
    assert (await events_of(conn, job)).count("FinalizeClaimed") == 1


async def test_two_finalizations_in_one_process_never_both_hold_the_claim(
        conn: Conn, pool: Pool, held: HeldMedia, tmp_path: Path) -> None:
    """Two webhook deliveries of one job reach the same process: one claims, the other
    is told it cannot (it never downloads a second time)."""
    clock = LogicalClock(datetime(2026, 5, 19, 12, tzinfo=UTC))
    job = await succeeded_call(conn, f"{held.url}/a.png", clock())
    one = Finalizer(pool, LocalFolderStore(tmp_path), settings_for(held), owner="webhook:x",
                    clock=clock, config=CONFIG)
    first = asyncio.create_task(one.finalize(job))
    await held.wait_for(1)
    assert (await one.finalize(job)).outcome == "not_claimable"
    held.pending[0].set_result(200)
    assert (await first).outcome == "completed"
    assert len(held.pending) == 1


async def test_a_losers_error_is_never_recorded_under_the_winners_claim(
        conn: Conn, pool: Pool, held: HeldMedia, tmp_path: Path) -> None:
    """In one process: claim A's lease expires, claim B takes over; A's download then
    fails. A must not append FinalizeFailed (B holds the claim); B completes."""
    clock = LogicalClock(datetime(2026, 5, 19, 12, tzinfo=UTC))
    job = await succeeded_call(conn, f"{held.url}/a.png", clock())
    one = Finalizer(pool, LocalFolderStore(tmp_path), settings_for(held), owner="webhook:x",
                    clock=clock, config=CONFIG)
    a = asyncio.create_task(one.finalize(job))
    await held.wait_for(1)
    clock.advance(CONFIG.lease_for(1) + 1)  # A's lease is over
    b = asyncio.create_task(one.finalize(job))
    await held.wait_for(2)
    held.pending[0].set_result(503)
    assert (await a).outcome == "lost_race"
    held.pending[1].set_result(200)
    assert (await b).outcome == "completed"
    assert await events_of(conn, job) == [
        "CallStarted", "TaskCreated", "UpstreamSucceeded", "FinalizeClaimed",
        "FinalizeClaimed", "Completed"]


async def test_reconciler_claim_renewal_extends_from_the_time_of_renewal(
        conn: Conn, pool: Pool, sim: RunningSimulator, http: aiohttp.ClientSession,
        tmp_path: Path) -> None:
    job = await create_job(conn, credits=10)
    start = utcnow()
    p = await load(conn, job)
    p = (await append(conn, job, p, CallStarted(at=start - timedelta(hours=1), actor="w",
                                                kind="kie-standard"))).projection
    await append(conn, job, p, TaskCreated(at=start - timedelta(hours=1), actor="w",
                                           task_id="t"))
    clock = LogicalClock(start)
    leases: list[datetime] = []

    async def signal(point: str, claimed: uuid.UUID) -> None:
        if point == "claimed":
            clock.advance(500)  # this row's turn comes 500 s into the pass
        if point == "decided":
            row = await (await conn.execute("SELECT reconcile_lease_until FROM jobs "
                                            "WHERE id = %s", (job,))).fetchone()
            assert row is not None
            leases.append(row["reconcile_lease_until"])

    config = ReconcileConfig(claim_lease_s=120)
    reconciler = Reconciler(pool, http, sim.settings, LocalFolderStore(tmp_path),
                            config=config, clock=clock, sleep=no_sleep, signal=signal)
    await reconciler.reconcile_once()
    assert leases == [start + timedelta(seconds=500 + 120)]


# -- 8. one clock for leases and heartbeats ---------------------------------------------------

async def test_reconciler_on_a_skewed_host_does_not_see_a_live_call_as_dead(
        conn: Conn, pool: Pool, sim: RunningSimulator, http: aiohttp.ClientSession,
        tmp_path: Path) -> None:
    """The worker heartbeats with the database's clock; a reconciler whose host clock runs
    10 minutes ahead compares on the database's clock too, and leaves the call alone. (The
    same host clock used as is would take the live call for a dead one.)"""
    job = await create_job(conn, credits=10)
    p = await load(conn, job)
    p = (await append(conn, job, p, CallStarted(at=utcnow() - timedelta(minutes=2), actor="w",
                                                kind="kie-standard"))).projection
    await append(conn, job, p, TaskCreated(at=utcnow(), actor="w", task_id="t"))
    await execute(conn, "heartbeat", {"job_id": job, "owner": "w", "progress": 10})

    def skewed() -> datetime:
        return utcnow() + timedelta(minutes=10)

    def reconciler(clock: DatabaseClock | LogicalClock) -> Reconciler:
        return Reconciler(pool, http, sim.settings, LocalFolderStore(tmp_path),
                          config=ReconcileConfig(), clock=clock, sleep=no_sleep)

    assert (await reconciler(DatabaseClock(local=skewed)).reconcile_once()).claimed == 0
    naive = LogicalClock(skewed())
    assert (await reconciler(naive).reconcile_once()).claimed == 1  # the bug it prevents


async def test_finalization_lease_is_written_on_the_databases_clock(
        conn: Conn, pool: Pool, held: HeldMedia, tmp_path: Path) -> None:
    behind = DatabaseClock(local=lambda: utcnow() - timedelta(minutes=5))
    job = await succeeded_call(conn, f"{held.url}/a.png", utcnow())
    finalizer = Finalizer(pool, LocalFolderStore(tmp_path), settings_for(held), owner="w",
                          clock=behind, config=CONFIG)
    task = asyncio.create_task(finalizer.finalize(job))
    await held.wait_for(1)
    db_now = (await execute(conn, "clock_now", {}))[0]["now"]
    claim = next(e for e in await load_events(conn, job) if isinstance(e, FinalizeClaimed))
    assert abs((claim.at - db_now).total_seconds()) < 5
    held.pending[0].set_result(200)
    assert (await task).outcome == "completed"
