"""``credits_charged`` end to end (issue 14, item 6): completed calls through the real
actors that commit — the worker's ``CallRunner.run`` and the ``Reconciler`` recovering a
dead worker's call — with a charge below the reservation, above it, none at all (the
default: the reservation), and a job holding TWO reservation rows (the host inserted the
second with plain SQL).

The rule (DESIGN §6, §10; docs/pricing.md): a completed call commits every reservation of
its job and charges ``min(charge, total reserved)`` in total, split over the rows in
``id`` order (each row at most its own ``credits_reserved``); no charge means the
reservations as made; every other end refunds every row, charging 0. Settled once: a
redelivered job or a later reconcile pass changes no row. The issue's "a job with two
reservation rows is charged twice" did not reproduce when callwarden settles both rows;
it did when the host had committed one of them itself (the cost was split over the rows
left reserved only, charging it again on top of the host's charge): the last test here.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from callwarden.calls.runner import CallRunner
from callwarden.database.clock import utcnow
from callwarden.database.db import Conn, Pool, connect
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load
from callwarden.events.types import CallStarted, TaskCreated
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.reconciler.loop import Reconciler
from callwarden.replay.verify import verify_job
from tests.support import no_sleep
from tests.support.calls import NOW_SCRIPT, upstream_task

KIND = "kie-standard"


def request(script: dict[str, Any]) -> dict[str, Any]:
    return {"model": "nano-banana-pro", "input": {"prompt": "a cat", "_sim": script}}


class FixedCharge:
    """A host's pricing function: every completed call costs ``credits``."""

    def __init__(self, credits: float | None) -> None:
        self.credits = credits

    def charge(self, kind: str, usage: dict[str, float | str],
               reported_cost: float | None) -> float | None:
        return self.credits


async def job_with_reservations(conn: Conn, reserved: list[int]) -> uuid.UUID:
    """A job reserving ``reserved[0]``; each further amount a row the host inserted."""
    job = await create_job(conn, credits=reserved[0])
    for credits in reserved[1:]:
        await conn.execute("INSERT INTO usage_logs (job_id, user_id, status, credits_reserved)"
                           " VALUES (%s, 'user-1', 'reserved', %s)", (job, credits))
    return job


async def reservations(conn: Conn, job: uuid.UUID) -> list[tuple[str, Decimal, int | None]]:
    """Each row's (status, credits_charged, settled_by_seq), in ``id`` order."""
    rows = await (await conn.execute(
        "SELECT status, credits_charged, settled_by_seq FROM usage_logs WHERE job_id = %s "
        "ORDER BY id", (job,))).fetchall()
    return [(r["status"], r["credits_charged"], r["settled_by_seq"]) for r in rows]


async def completed_seq(conn: Conn, job: uuid.UUID) -> int:
    row = await (await conn.execute(
        "SELECT seq FROM callwarden.call_events WHERE job_id = %s AND type = 'Completed'",
        (job,))).fetchone()
    assert row is not None
    return int(row["seq"])


CASES = [  # (reservations, the pricing hook's charge, credits_charged per row)
    ([10], 4.0, [4]),
    ([10], 25.0, [10]),
    ([10], None, [10]),
    ([10, 6], 12.0, [10, 2]),
    ([10, 6], 4.0, [4, 0]),
    ([10, 6], 30.0, [10, 6]),
    ([10, 6], None, [10, 6]),
    ([10, 6], 0.0, [0, 0]),
]
IDS = [f"reserved{'+'.join(map(str, r))}-charge{c}" for r, c, _ in CASES]


def runner(pool: Pool, http: aiohttp.ClientSession, sim: RunningSimulator, tmp_path: Path,
           charge: float | None) -> CallRunner:
    return CallRunner(pool, http, sim.settings, LocalFolderStore(tmp_path / "media"),
                      sleep=no_sleep, pricing=FixedCharge(charge))


def reconciler(pool: Pool, http: aiohttp.ClientSession, sim: RunningSimulator,
               tmp_path: Path, charge: float | None) -> Reconciler:
    return Reconciler(pool, http, sim.settings, LocalFolderStore(tmp_path / "media"),
                      sleep=no_sleep, pricing=FixedCharge(charge))


async def assert_committed(conn: Conn, job: uuid.UUID, reserved: list[int],
                           charge: float | None, expected: list[int]) -> None:
    rows = await reservations(conn, job)
    seq = await completed_seq(conn, job)
    assert rows == [("committed", Decimal(c), seq) for c in expected]
    total = sum(reserved) if charge is None else min(charge, sum(reserved))
    assert sum(c for _, c, _ in rows) == Decimal(str(total))
    assert await verify_job(conn, job) == []


@pytest.mark.parametrize(("reserved", "charge", "expected"), CASES, ids=IDS)
async def test_the_worker_commits_min_of_charge_and_total_reserved_once(
        conn: Conn, pool: Pool, http: aiohttp.ClientSession, sim: RunningSimulator,
        tmp_path: Path, reserved: list[int], charge: float | None,
        expected: list[int]) -> None:
    job = await job_with_reservations(conn, reserved)
    worker = runner(pool, http, sim, tmp_path, charge)
    assert (await worker.run(job, KIND, request(NOW_SCRIPT))).result == "completed"
    await assert_committed(conn, job, reserved, charge, expected)
    before = await reservations(conn, job)
    again = runner(pool, http, sim, tmp_path, 1000.0)  # a redelivery, another price
    assert (await again.run(job, KIND, request(NOW_SCRIPT))).result == "completed"
    assert await reservations(conn, job) == before
    assert sim.sim.journal.count("kie", "create") == 1


@pytest.mark.parametrize(("reserved", "charge", "expected"), CASES, ids=IDS)
async def test_the_reconciler_commits_min_of_charge_and_total_reserved_once(
        conn: Conn, pool: Pool, http: aiohttp.ClientSession, sim: RunningSimulator,
        tmp_path: Path, reserved: list[int], charge: float | None,
        expected: list[int]) -> None:
    """A dead worker's call whose task succeeded upstream; the host added the second
    reservation while the call was in flight."""
    job = await create_job(conn, credits=reserved[0])
    at = utcnow() - timedelta(minutes=40)
    p = (await append(conn, job, await load(conn, job),
                      CallStarted(at=at, actor="worker:dead", kind=KIND))).projection
    task = await upstream_task(http, sim, KIND, NOW_SCRIPT)
    await append(conn, job, p, TaskCreated(at=at, actor="worker:dead", task_id=task))
    for credits in reserved[1:]:
        await conn.execute("INSERT INTO usage_logs (job_id, user_id, status, credits_reserved)"
                           " VALUES (%s, 'user-1', 'reserved', %s)", (job, credits))
    counts = await reconciler(pool, http, sim, tmp_path, charge).reconcile_once(utcnow())
    assert (counts.claimed, counts.completed) == (1, 1)
    await assert_committed(conn, job, reserved, charge, expected)
    before = await reservations(conn, job)
    later = reconciler(pool, http, sim, tmp_path, 1000.0)
    assert (await later.reconcile_once(utcnow() + timedelta(hours=2))).claimed == 0
    assert await reservations(conn, job) == before


async def test_a_failed_call_refunds_every_reservation_row_charging_nothing(
        conn: Conn, pool: Pool, http: aiohttp.ClientSession, sim: RunningSimulator,
        tmp_path: Path) -> None:
    job = await job_with_reservations(conn, [10, 6])
    failing = request({"steps": [], "end": "failed", "error": "upstream said no"})
    assert (await runner(pool, http, sim, tmp_path, 4.0).run(job, KIND, failing)).result == (
        "failed")
    seq = (await load(conn, job)).version
    assert await reservations(conn, job) == [("refunded", Decimal(0), seq)] * 2
    assert await verify_job(conn, job) == []


# -- a reservation the host committed itself ---------------------------------------------------

HOST_COMMITS_FIRST = ("UPDATE usage_logs SET status = 'committed', credits_charged = "
                      "credits_reserved, settled_at = now() WHERE id = (SELECT min(id) FROM "
                      "usage_logs WHERE job_id = %s)")
@pytest.mark.parametrize("when", ["before_the_call", "during_the_upload"])
@pytest.mark.parametrize(("charge", "expected"), [
    (None, [10, 6]),
    (12.0, [10, 2]),
    (4.0, [10, 0]),
], ids=["charge_none", "charge12", "charge4"])
async def test_a_reservation_the_host_committed_counts_towards_the_total(
        db_url: str, conn: Conn, pool: Pool, http: aiohttp.ClientSession,
        sim: RunningSimulator, tmp_path: Path, when: str, charge: float | None,
        expected: list[int]) -> None:
    """The host commits the first of two reservations (10 + 6) with plain SQL, before
    the call or while its media is stored; the call's commit then charges the rest so
    that the job's total is ``min(charge, 16)`` — never less than the host took."""
    job = await job_with_reservations(conn, [10, 6])
    store: LocalFolderStore
    if when == "before_the_call":
        await conn.execute(HOST_COMMITS_FIRST, (job,))
        store = LocalFolderStore(tmp_path / "media")
    else:
        class HostCommitsMidUpload(LocalFolderStore):
            async def put(self, key: str, data: bytes, content_type: str) -> Any:
                async with await connect(db_url) as c:
                    await c.execute(HOST_COMMITS_FIRST, (job,))
                return await super().put(key, data, content_type)
        store = HostCommitsMidUpload(tmp_path / "media")
    worker = CallRunner(pool, http, sim.settings, store, sleep=no_sleep,
                        pricing=FixedCharge(charge))
    assert (await worker.run(job, KIND, request(NOW_SCRIPT))).result == "completed"
    rows = await reservations(conn, job)
    assert [(s, c) for s, c, _ in rows] == [("committed", Decimal(c)) for c in expected]
    assert rows[0][2] is None  # the host's settlement, not the log's
