"""The service's doors while its database is down (issue 15): a server of the test's own,
halted in immediate mode under a running service. A provider's delivery gets 503 with
``Retry-After`` and is not remembered, so the provider's retry applies once the database
is back; ``/readyz`` says not ready until then."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from engine.store.databases import create_database
from engine.store.db import EmbeddedServer, Pool, connect, open_pool
from engine.store.migrate import migrate
from providers.simulator.core import RunningSimulator
from tests.integration.test_webhooks import (
    post,
    replicate_task,
    serving,
    state,
    terminal_delivery,
)


async def ready_within(http: aiohttp.ClientSession, url: str, limit_s: float) -> bool:
    """Whether ``url`` answers 200 within ``limit_s`` (the pool reconnects with its own
    backoff once the server is back): the condition polled, bounded."""
    deadline = asyncio.get_running_loop().time() + limit_s
    while asyncio.get_running_loop().time() < deadline:
        async with http.get(url) as resp:
            if resp.status == 200:
                return True
        await asyncio.sleep(0.2)  # a polling period, not synchronisation
    return False


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    s = EmbeddedServer(tmp_path / "pg", cleanup="delete")
    try:
        yield s
    finally:
        s.stop()


async def test_a_delivery_during_an_outage_is_503_and_its_retry_applies(
        server: EmbeddedServer, sim: RunningSimulator, http: aiohttp.ClientSession,
        tmp_path: Path) -> None:
    url = create_database(server.url(), "svc")
    async with await connect(url) as conn:
        await migrate(conn)
    pool: Pool = open_pool(url, max_size=4, check=True, wait_s=1.0)
    async with pool, serving(pool, sim, http, tmp_path) as service:
        async with await connect(url) as conn:
            job = await replicate_task(conn, sim, http, service, webhook={"drop": True})
        [delivery] = await terminal_delivery(sim, outcome="dropped")
        server.halt()
        try:
            async with http.post(delivery.url, data=delivery.body,
                                 headers=delivery.headers) as resp:
                assert resp.status == 503
                assert resp.headers["Retry-After"] == "30"
            async with http.get(f"{service.url}/readyz") as resp:
                assert resp.status == 503
        finally:
            server.start()
        assert await ready_within(http, f"{service.url}/readyz", 30.0)
        assert await post(http, delivery) == 200  # the provider's retry: not a replay
        await service.drain()
        async with await connect(url) as conn:
            assert await state(conn, job) == ("completed", "committed")

