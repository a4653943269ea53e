"""The reference worker's queue on a real Postgres: at-least-once delivery with a
visibility timeout, exclusive claims, owner-fenced acks; and the in-process worker loop
(acks every outcome, keeps a live call's lease, refunds what it cannot run)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from callwarden.calls.config import CallConfig
from callwarden.calls.runner import CallRunner
from callwarden.database.db import Conn, Pool, connect
from callwarden.database.jobs import create_job
from callwarden.database.write import AppendResult, append
from callwarden.events.types import CallStarted
from callwarden.projections.fold import EMPTY
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.queue.claims import JobSpec, ack, claim, input_data, parse_job, reject
from callwarden.queue.worker import Worker
from callwarden.replay.verify import verify_job
from tests.support import no_sleep
from tests.support.queues import blocked_on_a_lock

KIE = input_data("kie-standard", {"model": "nano-banana-pro", "input": {"prompt": "a cat"}})


async def _queue_row(conn: Conn, job: uuid.UUID) -> dict[str, Any]:
    row = await (await conn.execute(
        "SELECT j.queue_owner, j.queue_deliveries, j.queue_acked_at IS NOT NULL AS acked, "
        "j.call_state, u.status AS credits FROM jobs j "
        "LEFT JOIN usage_logs u ON u.job_id = j.id WHERE j.id = %s", (job,))).fetchone()
    assert row is not None
    return dict(row)


async def _eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


# ------------------------------------------------------------------ claim / ack


@pytest.mark.plain_postgres  # on Citus the claim waits for the lock (no SKIP LOCKED there)
async def test_claim_skips_rows_locked_by_another_transaction(conn: Conn, db_url: str) -> None:
    locked = await create_job(conn, input_data=KIE)
    free = await create_job(conn, input_data=KIE)
    other = await connect(db_url)
    async with other, other.transaction():
        await other.execute("SELECT id FROM jobs WHERE id = %s FOR UPDATE", (locked,))
        got = await claim(conn, owner="w:a", batch=10, visibility_s=30)
    assert [c.job_id for c in got] == [free]


async def test_claim_skips_leased_acked_and_finished_jobs(conn: Conn) -> None:
    leased = await create_job(conn, input_data=KIE)
    assert [c.job_id for c in await claim(conn, owner="w:a", batch=1, visibility_s=30)] == [
        leased]
    acked = await create_job(conn, input_data=KIE)
    await conn.execute("UPDATE jobs SET queue_acked_at = now() WHERE id = %s", (acked,))
    await create_job(conn, input_data=KIE, status="completed")
    await create_job(conn, input_data=KIE, status="cancelled")
    assert await claim(conn, owner="w:b", batch=10, visibility_s=30) == []


async def test_expired_lease_is_redelivered_and_the_old_owner_is_fenced_out(
        conn: Conn) -> None:
    """The lease is compared on the database's clock; instead of waiting for it, the
    dead worker's lease is made to have run out (the row's deadline moved 1 s into the
    past, as 30 s of waiting would have left it)."""
    job = await create_job(conn, input_data=KIE)
    first = await claim(conn, owner="w:dead", batch=1, visibility_s=30)
    assert [(c.job_id, c.deliveries) for c in first] == [(job, 1)]
    assert await claim(conn, owner="w:next", batch=1, visibility_s=30) == []  # still leased
    await conn.execute("UPDATE jobs SET queue_lease_until = now() - interval '1 second' "
                       "WHERE id = %s", (job,))
    again = await claim(conn, owner="w:next", batch=1, visibility_s=30)
    assert [(c.job_id, c.deliveries) for c in again] == [(job, 2)]
    assert not await ack(conn, job, owner="w:dead")
    assert await ack(conn, job, owner="w:next")
    await conn.execute("UPDATE jobs SET queue_lease_until = now() - interval '1 second' "
                       "WHERE id = %s", (job,))
    assert await claim(conn, owner="w:later", batch=1, visibility_s=30) == []  # acked


async def test_concurrent_claimers_never_get_the_same_job(conn: Conn, db_url: str) -> None:
    jobs = {await create_job(conn, input_data=KIE) for _ in range(40)}

    async def claimer(name: str) -> list[uuid.UUID]:
        got: list[uuid.UUID] = []
        async with await connect(db_url) as c:
            while batch := await claim(c, owner=name, batch=3, visibility_s=30):
                got.extend(b.job_id for b in batch)
        return got

    results = await asyncio.gather(*(claimer(f"w:{i}") for i in range(4)))
    claimed = [j for r in results for j in r]
    assert len(claimed) == len(set(claimed))
    assert set(claimed) == jobs


# ------------------------------------------------------------------ the worker loop



@pytest.fixture
def make_worker(pool: Pool, sim: RunningSimulator, http: aiohttp.ClientSession,
                tmp_path: Path) -> Callable[..., Worker]:
    def make(owner: str = "worker:test", visibility_s: float = 30, poll_s: float = 0.0,
             **kw: Any) -> Worker:
        # poll_s 0: no wait between polls (an interval must be positive; sleep is no_sleep)
        config = CallConfig(poll_interval_s={"kie-standard": poll_s or 1e-6})
        runner = CallRunner(pool, http, sim.settings, LocalFolderStore(tmp_path / "media"),
                            owner=owner, config=config,
                            sleep=asyncio.sleep if poll_s else no_sleep)
        return Worker(pool, runner, concurrency=2, visibility_s=visibility_s,
                      poll_empty_s=0.05, grace_s=5, **kw)
    return make


async def _run_until(workers: list[Worker], done: Callable[[], Awaitable[bool]]) -> None:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(w.run(stop)) for w in workers]
    try:
        await _eventually(done)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)


def _acked(conn: Conn, *jobs: uuid.UUID) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return all([(await _queue_row(conn, j))["acked"] for j in jobs])
    return check


async def test_worker_runs_claimed_jobs_and_acks_them(
        conn: Conn, make_worker: Callable[..., Worker], sim: RunningSimulator) -> None:
    jobs = [await create_job(conn, input_data=KIE) for _ in range(3)]
    await _run_until([make_worker()], _acked(conn, *jobs))
    rows = [await _queue_row(conn, j) for j in jobs]
    assert {(r["call_state"], r["credits"], r["queue_deliveries"]) for r in rows} == {
        ("completed", "committed", 1)}
    assert sim.sim.journal.count("kie", "create") == 3


@pytest.mark.parametrize("data", [
    {"provider_kind": "midjourney", "request": {}},
    {"request": {"prompt": "no kind"}},
    {"provider_kind": "kie-standard", "request": "not an object"},
])
async def test_job_the_worker_cannot_read_is_refunded_and_acked(
        conn: Conn, make_worker: Callable[..., Worker], sim: RunningSimulator,
        data: dict[str, Any]) -> None:
    job = await create_job(conn, input_data=data, credits=4)
    await _run_until([make_worker()], _acked(conn, job))
    row = await _queue_row(conn, job)
    assert (row["call_state"], row["credits"]) == ("cancelled", "refunded")
    assert sim.sim.journal.count() == 0
    assert await verify_job(conn, job) == []


async def test_a_live_workers_lease_is_extended_so_its_job_is_not_redelivered(
        conn: Conn, db_url: str, pool: Pool, sim: RunningSimulator,
        http: aiohttp.ClientSession, tmp_path: Path,
        make_worker: Callable[..., Worker]) -> None:
    """Worker a claims the job (b starts claiming only once a's call is running: a
    signal, so which worker claims first is not left to the scheduler). a's call is held
    between two polls until the lease it was claimed with has run out on the database's
    clock — the condition is observed, not guessed from a number of polls — while b
    claims all the while: a's lease keeper extended the lease, so b never got the job.
    (The keeper extends every visibility/2 = 1 s; only a keeper late by more than 1 s
    could lose the lease.)"""
    script = {"steps": [{"phase": "running", "polls": 2}], "end": "succeeded"}
    req = {"model": "m", "input": {"prompt": "slow", "_sim": script}}
    job = await create_job(conn, input_data=input_data("kie-standard", req))
    seen: dict[str, Any] = {}
    running = asyncio.Event()

    async def outlive_the_claimed_lease(_: float) -> None:
        if seen:
            return
        async with await connect(db_url) as c:
            row = await (await c.execute("SELECT queue_lease_until AS lease FROM jobs "
                                         "WHERE id = %s", (job,))).fetchone()
            assert row is not None
            seen["claimed_until"] = row["lease"]
            running.set()

            async def ran_out() -> bool:
                got = await (await c.execute(
                    "SELECT now() > %s AS out, queue_lease_until AS lease, queue_owner, "
                    "queue_deliveries FROM jobs WHERE id = %s",
                    (seen["claimed_until"], job))).fetchone()
                assert got is not None
                seen.update(got)
                return bool(got["out"])
            await _eventually(ran_out, timeout_s=30.0)

    runner = CallRunner(pool, http, sim.settings, LocalFolderStore(tmp_path / "media"),
                        owner="worker:a", sleep=outlive_the_claimed_lease,
                        config=CallConfig(poll_interval_s={"kie-standard": 1e-6}))
    a = Worker(pool, runner, concurrency=2, visibility_s=2.0, poll_empty_s=0.05, grace_s=5)
    b = make_worker("worker:b", visibility_s=2.0)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(a.run(stop))]
    try:
        async with asyncio.timeout(30):
            await running.wait()  # a holds the job and its call runs: now b claims too
        tasks.append(asyncio.create_task(b.run(stop)))
        await _eventually(_acked(conn, job))
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)
    assert seen["lease"] > seen["claimed_until"]  # extended by a's keeper ...
    assert (seen["queue_owner"], seen["queue_deliveries"]) == ("worker:a", 1)  # ... still a's
    row = await _queue_row(conn, job)
    assert (row["call_state"], row["queue_deliveries"], row["queue_owner"]) == (
        "completed", 1, "worker:a")
    assert sim.sim.journal.count("kie", "create") == 1


async def test_job_delivered_too_often_is_given_up_and_refunded(
        conn: Conn, make_worker: Callable[..., Worker], sim: RunningSimulator) -> None:
    job = await create_job(conn, input_data=KIE, credits=2)
    await conn.execute("UPDATE jobs SET queue_deliveries = 3 WHERE id = %s", (job,))
    await _run_until([make_worker(max_deliveries=3)], _acked(conn, job))
    row = await _queue_row(conn, job)
    assert (row["call_state"], row["credits"], row["queue_deliveries"]) == (
        "cancelled", "refunded", 4)
    assert sim.sim.journal.count() == 0


# ------------------------------------------------------------------ callwarden enqueue


async def _cli(db_url: str, *args: str) -> tuple[int, str]:
    env = {**os.environ, "DATABASE_URL": db_url}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "callwarden.cli", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_enqueue_creates_claimable_jobs_with_a_reservation(
        conn: Conn, db_url: str) -> None:
    code, out = await _cli(db_url, "enqueue", "--kind", "elevenlabs-sync", "--operation",
                           "tts", "--request", '{"voice_id": "v1", "text": "hi"}',
                           "--credits", "3", "--user", "u-9", "--count", "2")
    assert code == 0, out
    ids = [uuid.UUID(line) for line in out.split()]
    got = await claim(conn, owner="w:a", batch=10, visibility_s=30)
    assert sorted(c.job_id for c in got) == sorted(ids)
    assert [parse_job(c.input_data) for c in got] == [JobSpec(
        kind="elevenlabs-sync", request={"voice_id": "v1", "text": "hi"}, operation="tts")] * 2
    rows = await (await conn.execute(
        "SELECT user_id, status, credits_reserved FROM usage_logs WHERE job_id = ANY(%s)",
        (ids,))).fetchall()
    assert [(r["user_id"], r["status"], r["credits_reserved"]) for r in rows] == [
        ("u-9", "reserved", 3)] * 2


@pytest.mark.parametrize("args", [
    ["--kind", "midjourney", "--request", "{}"],
    ["--kind", "kie-standard", "--request", "not json"],
])
async def test_enqueue_refuses_what_no_worker_could_run(
        conn: Conn, db_url: str, args: list[str]) -> None:
    code, out = await _cli(db_url, "enqueue", *args)
    assert code == 2, out
    assert "error" in out
    assert await claim(conn, owner="w:a", batch=10, visibility_s=30) == []


async def test_a_rejected_job_whose_call_started_meanwhile_is_acked_not_cancelled(
        conn: Conn, db_url: str) -> None:
    """Issue 24.8, the reference worker's give-up and reject (``claims.reject``): another
    delivery records ``CallStarted`` in a transaction still open when the reject reads
    "never started" and sends its cancel (which waits for the row's lock); it then
    commits. The cancel's own decision must see the started call: the job is acked and
    its call left (``created``, reservation ``reserved``) for the reconciler."""
    job = await create_job(conn, input_data=KIE, credits=2)
    [claimed] = await claim(conn, owner="worker:a", batch=1, visibility_s=30)

    async def rejected() -> tuple[AppendResult, bool]:
        async with await connect(db_url) as own:
            return await reject(own, job, owner="worker:a", now=datetime.now(UTC))

    delivery = await connect(db_url)
    async with delivery:
        async with delivery.transaction():
            assert (await append(delivery, job, EMPTY, CallStarted(
                at=datetime.now(UTC), actor="worker:b", kind="kie-standard",
                sync=False))).ok
            rejecting = asyncio.create_task(rejected())
            await blocked_on_a_lock(conn, rejecting)
        result, acked = await rejecting
    assert claimed.job_id == job
    assert (result.ok, result.projection.state and result.projection.state.value) == (
        False, "created")
    assert acked
    row = await _queue_row(conn, job)
    assert (row["call_state"], row["credits"], row["acked"]) == ("created", "reserved", True)
    assert await verify_job(conn, job) == []
