"""A guard that is not a timer (issue 26.4): what one happy async call, one sync call, one
webhook settlement and one reconciler recovery send to Postgres, counted on the client
(``bench/counting.py``: transactions = autocommit statements + outermost transaction
blocks; round trips = sends; statements by query name). Each count may fall, never rise
above the recorded ceiling (``CEILINGS``; docs/benchmarks.md has the history)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from counting import CountingConnection, configure_counted
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from callwarden.calls.runner import CallRunner
from callwarden.database.citus import on_citus
from callwarden.database.db import Conn, Pool
from callwarden.database.jobs import create_job
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.reconciler.loop import Reconciler
from tests.support import no_sleep
from tests.support.calls import NOW_SCRIPT, dead_worker_call, upstream_task
from tests.support.webhooks import replicate_task, serving, terminal_delivery

#: (transactions, round trips) at most, per operation; lower them when a change saves one.
CEILINGS: dict[str, tuple[int, int]] = {
    "happy async call": (3, 3),  # CallStarted; TaskCreated; the success, claim, Completed
    "sync call": (4, 4),
    "webhook settlement": (8, 8),
    "reconciler recovery": (7, 11),
}
KIE = {"model": "nano-banana-pro",
       "input": {"prompt": "a cat", "_sim": {"steps": [{"phase": "running", "polls": 1}],
                                             "end": "succeeded"}}}
CLAUDE = {"model": "claude-sonnet-4-6", "max_tokens": 16,
          "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def counted_pool(db_url: str) -> AsyncIterator[Pool]:
    pool: Pool = AsyncConnectionPool(
        db_url, min_size=2, max_size=2, open=False,
        kwargs={"autocommit": True, "row_factory": dict_row},
        connection_class=CountingConnection, configure=configure_counted)
    async with pool:
        await pool.wait(timeout=30)
        async with pool.connection() as conn:  # asked once per process and database, so
            await on_citus(conn)               # not a per-call cost: before the counting
        yield pool


async def counts(what: Callable[[], Awaitable[Any]]) -> tuple[int, int, Counter[str]]:
    """(transactions, round trips, statements) that ``what`` sends through counted pools."""
    CountingConnection.reset()
    await what()
    return (CountingConnection.transactions, CountingConnection.round_trips,
            Counter(CountingConnection.statements))


def within(name: str, got: tuple[int, int, Counter[str]]) -> None:
    xacts, trips, statements = got
    ceiling = CEILINGS[name]
    said = (f"{name}: {xacts} transactions, {trips} round trips (ceiling {ceiling}): "
            f"{dict(statements)}")
    assert xacts <= ceiling[0], said
    assert trips <= ceiling[1], said


async def test_a_happy_async_call(counted_pool: Pool, conn: Conn, http: aiohttp.ClientSession,
                                  sim: RunningSimulator, tmp_path: Path) -> None:
    runner = CallRunner(counted_pool, http, sim.settings, LocalFolderStore(tmp_path),
                        sleep=no_sleep, clock=lambda: datetime.now(UTC))
    warm = await create_job(conn, credits=5)  # psycopg prepares on a statement's use
    assert (await runner.run(warm, "kie-standard", KIE)).result == "completed"
    job = await create_job(conn, credits=5)
    got = await counts(lambda: runner.run(job, "kie-standard", KIE))
    assert [got[2][n] for n in ("append_start", "append_move", "append_event",
                                "append_completion")] == [1, 1, 0, 1]
    within("happy async call", got)


async def test_a_sync_call(counted_pool: Pool, conn: Conn, http: aiohttp.ClientSession,
                           sim: RunningSimulator, tmp_path: Path) -> None:
    runner = CallRunner(counted_pool, http, sim.settings, LocalFolderStore(tmp_path),
                        sleep=no_sleep, clock=lambda: datetime.now(UTC))
    warm = await create_job(conn, credits=5)
    assert (await runner.run(warm, "anthropic-sync", CLAUDE)).result == "completed"
    job = await create_job(conn, credits=5)
    within("sync call", await counts(lambda: runner.run(job, "anthropic-sync", CLAUDE)))


async def test_a_webhook_settlement(counted_pool: Pool, conn: Conn, pool: Pool,
                                    http: aiohttp.ClientSession, sim: RunningSimulator,
                                    tmp_path: Path) -> None:
    async with serving(counted_pool, sim, http, tmp_path) as service:
        async def settle(job: uuid.UUID, deliveries: int) -> None:
            await terminal_delivery(sim, count=deliveries)
            await service.drain()

        await settle(await replicate_task(conn, sim, http, service), 1)  # warm
        job = await replicate_task(conn, sim, http, service)
        within("webhook settlement", await counts(lambda: settle(job, 2)))


async def test_a_reconciler_recovery(counted_pool: Pool, conn: Conn,
                                     http: aiohttp.ClientSession, sim: RunningSimulator,
                                     tmp_path: Path) -> None:
    reconciler = Reconciler(counted_pool, http, sim.settings, LocalFolderStore(tmp_path))
    later = datetime.now(UTC) + timedelta(hours=1)

    async def recover() -> None:
        counted = await reconciler.reconcile_once(later)
        assert counted.completed == 1

    await dead_worker_call(conn, "kie-standard",
                           await upstream_task(http, sim, "kie-standard", NOW_SCRIPT))
    await recover()  # warm
    await dead_worker_call(conn, "kie-standard",
                           await upstream_task(http, sim, "kie-standard", NOW_SCRIPT))
    within("reconciler recovery", await counts(recover))
