"""Reconcilers racing each other and a live worker on the same calls: one settlement per
call, each call processed by one reconciler at a time, nothing lost when a reconciler
dies mid-batch, and never an overwrite of a call completed after it was claimed (River
#1302)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest

from callwarden.calls.runner import CallRunner
from callwarden.database.clock import utcnow
from callwarden.database.db import Conn, Pool, open_pool
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load, load_events
from callwarden.events.types import CallStarted, TaskCreated
from callwarden.providers.base import AsyncKindClient
from callwarden.providers.registry import client_for
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.reconciler.config import ReconcileConfig
from callwarden.reconciler.loop import Counts, Reconciler, Signal
from callwarden.replay.verify import verify_job
from tests.support import no_sleep

KIE_REQ: dict[str, Any] = {"model": "nano-banana-pro",
                           "input": {"prompt": "a cat", "_sim": {"steps": [],
                                                                 "end": "succeeded"}}}
DEAD = "worker:dead0000"



@pytest.fixture
async def pools(db_url: str) -> AsyncIterator[tuple[Pool, Pool, Pool]]:
    """One pool per actor: two reconcilers and a worker, as separate processes would be."""
    async with open_pool(db_url, max_size=4, check=True) as a, \
            open_pool(db_url, max_size=4, check=True) as b, \
            open_pool(db_url, max_size=4, check=True) as w:
        yield a, b, w


MakeReconciler = Callable[..., Reconciler]


@pytest.fixture
def make_reconciler(sim: RunningSimulator, http: aiohttp.ClientSession,
                    tmp_path: Path) -> MakeReconciler:
    def make(pool: Pool, owner: str, signal: Signal | None = None,
             **config: Any) -> Reconciler:
        return Reconciler(pool, http, sim.settings, LocalFolderStore(tmp_path / "media"),
                          config=ReconcileConfig(**config), owner=owner, sleep=no_sleep,
                          signal=signal)
    return make


async def stale_calls(conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
                      n: int) -> list[uuid.UUID]:
    """``n`` KIE calls whose tasks succeeded upstream after their worker died."""
    client = cast(AsyncKindClient, client_for("kie-standard", http, sim.settings))
    jobs = []
    for _ in range(n):
        job = await create_job(conn, credits=10)
        at = utcnow() - timedelta(minutes=30)
        p = (await append(conn, job, await load(conn, job),
                          CallStarted(at=at, actor=DEAD, kind="kie-standard"))).projection
        await append(conn, job, p, TaskCreated(at=at, actor=DEAD,
                                               task_id=await client.create(KIE_REQ)))
        jobs.append(job)
    return jobs


def recorder(seen: list[uuid.UUID]) -> Signal:
    async def signal(point: str, job: uuid.UUID) -> None:
        if point == "decided":
            seen.append(job)
    return signal


def rendezvous(seen: list[uuid.UUID], mine: asyncio.Event, other: asyncio.Event) -> Signal:
    """``recorder``, and at the first call it claims, wait (bounded) until the other
    reconciler has claimed one too: both take part, whatever the scheduling."""
    record = recorder(seen)

    async def signal(point: str, job: uuid.UUID) -> None:
        if point == "claimed" and not mine.is_set():
            mine.set()
            async with asyncio.timeout(30):
                await other.wait()
        await record(point, job)
    return signal


async def settled_once(conn: Conn, job: uuid.UUID) -> None:
    """The job completed exactly once: one Completed event, credits committed once, the
    projection equal to the fold of its log."""
    names = [type(e).__name__ for e in await load_events(conn, job)]
    assert names.count("Completed") == 1, names
    assert names[-1] == "Completed", names
    logs = await (await conn.execute(
        "SELECT status FROM usage_logs WHERE job_id = %s", (job,))).fetchall()
    assert logs == [{"status": "committed"}]
    assert await verify_job(conn, job) == []


async def drain(r: Reconciler) -> Counts:
    """Passes until a pass claims nothing; the sum of what they did."""
    total = Counts()
    while True:
        c = await r.reconcile_once()
        if not c.claimed:
            return total
        for name in ("claimed", "completed", "lost_race", "errors"):
            setattr(total, name, getattr(total, name) + getattr(c, name))


async def test_two_reconcilers_never_process_the_same_call(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        pools: tuple[Pool, Pool, Pool], make_reconciler: MakeReconciler) -> None:
    jobs = await stale_calls(conn, http, sim, 16)
    seen_a: list[uuid.UUID] = []
    seen_b: list[uuid.UUID] = []
    claimed_a, claimed_b = asyncio.Event(), asyncio.Event()
    a = make_reconciler(pools[0], "reconciler:a", rendezvous(seen_a, claimed_a, claimed_b),
                        batch_size=3)
    b = make_reconciler(pools[1], "reconciler:b", rendezvous(seen_b, claimed_b, claimed_a),
                        batch_size=3)
    ca, cb = await asyncio.gather(drain(a), drain(b))
    assert seen_a  # both took part (made sure of by the rendezvous, not by the scheduler)
    assert seen_b
    assert not set(seen_a) & set(seen_b)
    assert sorted(seen_a + seen_b) == sorted(jobs)  # each call processed by exactly one
    assert ca.completed + cb.completed == len(jobs)
    for job in jobs:
        await settled_once(conn, job)


async def test_reconciler_dying_mid_batch_loses_nothing(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        pools: tuple[Pool, Pool, Pool], make_reconciler: MakeReconciler) -> None:
    jobs = await stale_calls(conn, http, sim, 5)
    dead = make_reconciler(pools[0], "reconciler:dies")
    now = utcnow()
    assert len(await dead.claim(now)) == 5  # claimed, then the process is gone
    heir = make_reconciler(pools[1], "reconciler:heir")
    assert (await heir.reconcile_once(now + timedelta(seconds=60))).claimed == 0
    counts = await heir.reconcile_once(now + timedelta(seconds=121))  # lease expired
    assert (counts.claimed, counts.completed) == (5, 5)
    for job in jobs:
        await settled_once(conn, job)


async def test_two_reconcilers_and_a_live_worker_settle_each_call_once(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator, tmp_path: Path,
        pools: tuple[Pool, Pool, Pool], make_reconciler: MakeReconciler) -> None:
    jobs = await stale_calls(conn, http, sim, 8)
    a = make_reconciler(pools[0], "reconciler:a", batch_size=4)
    b = make_reconciler(pools[1], "reconciler:b", batch_size=4)
    worker = CallRunner(pools[2], http, sim.settings, LocalFolderStore(tmp_path / "media"),
                        sleep=no_sleep)
    await asyncio.gather(
        drain(a), drain(b), *(worker.run(job, "kie-standard", KIE_REQ) for job in jobs))
    # (A worker that lost a call to a reconciler mid-finalization reports it as left to
    # the reconciler: its outcome is not asserted, the stored result is.)
    for job in jobs:
        await settled_once(conn, job)
    assert sim.sim.journal.count("kie", "create") == len(jobs)  # never re-created
    assert (await a.reconcile_once()).claimed == 0


async def test_call_completed_after_the_claim_is_never_overwritten(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator, tmp_path: Path,
        pools: tuple[Pool, Pool, Pool], make_reconciler: MakeReconciler) -> None:
    """River #1302: the reconciler fetched the call, then the worker completed it; the
    reconciler's write is fenced on what it read, so it changes nothing."""
    (job,) = await stale_calls(conn, http, sim, 1)
    worker = CallRunner(pools[2], http, sim.settings, LocalFolderStore(tmp_path / "w"),
                        sleep=no_sleep)

    async def worker_finishes_first(point: str, j: uuid.UUID) -> None:
        if point == "decided":
            assert (await worker.run(j, "kie-standard", KIE_REQ)).result == "completed"

    r = make_reconciler(pools[0], "reconciler:late", worker_finishes_first)
    counts = await r.reconcile_once()
    assert (counts.claimed, counts.lost_race, counts.completed) == (1, 1, 0)
    await settled_once(conn, job)
    events = await load_events(conn, job)
    assert all(e.actor != "reconciler:late" for e in events)
