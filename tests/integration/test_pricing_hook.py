"""A host's own pricing hook never holds the event loop (issue 24.11): it runs in a thread,
bounded by ``CallConfig.pricing_timeout_s``; past it the call is charged its reservation.

The hook blocks on an event that only the test sets, and the test sets it only after a
request to a route served by the same event loop has been answered: with the hook on the
loop, that request cannot be served until the hook gives up waiting (``released`` is then
False)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web

from callwarden.calls.config import CallConfig
from callwarden.calls.finalize import Finalizer
from callwarden.calls.pricing import Usage
from callwarden.database.db import Conn, Pool
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load
from callwarden.events.types import CallStarted, TaskCreated, UpstreamResult, UpstreamSucceeded
from callwarden.providers.base import ProviderSettings
from callwarden.providers.storage import LocalFolderStore
from tests.support import serving_app

KIND = "replicate-prediction"


class BlockingHook:
    """A host's pricing that waits for a price service (here: the test's event)."""

    def __init__(self, wait_s: float) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.wait_s = wait_s
        self.released: bool | None = None

    def charge(self, kind: str, usage: Usage, reported_cost: float | None) -> float | None:
        self.entered.set()
        self.released = self.release.wait(timeout=self.wait_s)
        return 3.0


async def succeeded_call(conn: Conn) -> uuid.UUID:
    job = await create_job(conn, credits=10)
    now = datetime.now(UTC)
    p = await load(conn, job)
    for event in (CallStarted(at=now, actor="w", kind=KIND),
                  TaskCreated(at=now, actor="w", task_id=f"t-{job}"),
                  UpstreamSucceeded(at=now, actor="w",
                                    result=UpstreamResult(text="a caption"))):
        r = await append(conn, job, p, event)
        assert r.ok
        p = r.projection
    return job


@pytest.fixture
async def ping() -> AsyncIterator[str]:
    """A route on this event loop, as the service's /healthz is."""
    async def pong(_: web.Request) -> web.Response:
        return web.Response(text="pong")

    app = web.Application()
    app.router.add_get("/ping", pong)
    async with serving_app(app) as url:
        yield f"{url}/ping"


async def charged(conn: Conn, job: uuid.UUID) -> Decimal:
    row = await (await conn.execute(
        "SELECT credits_charged FROM usage_logs WHERE job_id = %s AND status = 'committed'",
        (job,))).fetchone()
    assert row is not None
    return Decimal(row["credits_charged"])


async def test_a_slow_hook_leaves_the_event_loop_free(
        pool: Pool, conn: Conn, ping: str, http: aiohttp.ClientSession, tmp_path: Path) -> None:
    job = await succeeded_call(conn)
    hook = BlockingHook(wait_s=5.0)
    finalizer = Finalizer(pool, LocalFolderStore(tmp_path), ProviderSettings(), owner="w",
                          pricing=hook, config=CallConfig(pricing_timeout_s=30.0))
    task = asyncio.create_task(finalizer.finalize(job))
    await asyncio.to_thread(hook.entered.wait, 10.0)
    async with http.get(ping) as resp:  # served while the hook is still waiting
        assert await resp.text() == "pong"
    hook.release.set()
    result = await task
    assert hook.released is True
    assert result.outcome == "completed"
    assert await charged(conn, job) == 3


async def test_a_hook_past_its_timeout_charges_the_reservation(
        pool: Pool, conn: Conn, tmp_path: Path) -> None:
    job = await succeeded_call(conn)
    hook = BlockingHook(wait_s=10.0)
    finalizer = Finalizer(pool, LocalFolderStore(tmp_path), ProviderSettings(), owner="w",
                          pricing=hook, config=CallConfig(pricing_timeout_s=0.2))
    try:
        result = await finalizer.finalize(job)
    finally:
        hook.release.set()
    assert result.outcome == "completed"
    assert await charged(conn, job) == 10  # the reservation


async def test_hung_hooks_never_take_the_threads_the_process_needs(
        pool: Pool, conn: Conn, tmp_path: Path) -> None:
    """Review of issue 24.11: hooks that never answer used the loop's default executor, so
    after six of them (on two cores) nothing else in the process could use a thread (media
    storage, DNS) and every later call stalled. Ten hung calls now all complete at the
    reservation, and the default executor still answers at once."""
    hook = BlockingHook(wait_s=30.0)
    finalizer = Finalizer(pool, LocalFolderStore(tmp_path), ProviderSettings(), owner="w",
                          pricing=hook, config=CallConfig(pricing_timeout_s=0.2))
    jobs = [await succeeded_call(conn) for _ in range(10)]
    try:
        results = [await finalizer.finalize(job) for job in jobs]
        assert [r.outcome for r in results] == ["completed"] * 10
        await asyncio.wait_for(asyncio.to_thread(lambda: None), 5.0)
    finally:
        hook.release.set()
    for job in jobs:
        assert await charged(conn, job) == 10  # the reservation


class Answers:
    """A host's hook answering what its price service or a numeric column gave back."""

    def __init__(self, value: object) -> None:
        self.value = value

    def charge(self, kind: str, usage: Usage, reported_cost: float | None) -> object:
        return self.value


@pytest.mark.parametrize(("answer", "credits"), [(Decimal("0.003"), Decimal("0.003")),
                                                  (10**400, Decimal(10))])
async def test_a_decimal_is_charged_and_a_huge_int_charges_the_reservation(
        pool: Pool, conn: Conn, tmp_path: Path, answer: object, credits: Decimal) -> None:
    """A price from a ``numeric`` row (a ``Decimal``) is what the call is charged; an
    int too large for a float charges the reservation; both complete the call, committed
    once (issue 40, item 5: the Decimal charged the whole reservation, the int raised out
    and left the call finalizing)."""
    job = await succeeded_call(conn)
    finalizer = Finalizer(pool, LocalFolderStore(tmp_path), ProviderSettings(), owner="w",
                          pricing=cast(Any, Answers(answer)))
    result = await finalizer.finalize(job)
    assert result.outcome == "completed"
    assert await charged(conn, job) == credits
