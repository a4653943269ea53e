"""The service's doors while its database is down (issue 15): a server of the test's own,
halted in immediate mode under a running service. A provider's delivery gets 503 with
``Retry-After`` and is not remembered, so the provider's retry applies once the database
is back; ``/readyz`` says not ready until then."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from callwarden.database.databases import create_database
from callwarden.database.db import EmbeddedServer, Pool, connect, open_pool
from callwarden.database.migrate import migrate
from callwarden.database.write import load_events
from callwarden.providers.elevenlabs.webhook import elevenlabs_sign
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.reconciler.loop import Reconciler
from callwarden.service.app import ServiceConfig
from callwarden.service.webhooks import WebhookConfig
from tests.service import running_service
from tests.support import no_sleep
from tests.support.calls import NOW_SCRIPT, dead_worker_call, upstream_task
from tests.support.webhooks import post, replicate_task, serving, state, terminal_delivery


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


async def over_limit_within(http: aiohttp.ClientSession, url: str,
                            limit_s: float) -> dict[str, object]:
    """``/readyz``'s body once it says the outage is over its limit (polled, bounded)."""
    deadline = asyncio.get_running_loop().time() + limit_s
    body: dict[str, object] = {}
    while asyncio.get_running_loop().time() < deadline:
        async with http.get(url) as resp:
            assert resp.status == 503
            body = await resp.json()
        if body.get("over_limit"):
            break
        await asyncio.sleep(0.2)  # a polling period, not synchronisation
    return body


async def test_a_delivery_during_an_outage_is_503_and_its_retry_applies(
        server: EmbeddedServer, sim: RunningSimulator, http: aiohttp.ClientSession,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Also: ``/readyz`` gives the outage's length and limit
    (``CALLWARDEN_DB_OUTAGE_LIMIT_S``) as its reason, and the service logs the outage
    once however many requests fail."""
    monkeypatch.setenv("CALLWARDEN_DB_OUTAGE_LIMIT_S", "0.5")
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
            with caplog.at_level(logging.WARNING, logger="callwarden.service"):
                body = await over_limit_within(http, f"{service.url}/readyz", 30.0)
            assert body["status"] == "database unreachable"
            assert body["limit_s"] == 0.5
            assert body["over_limit"] is True
            assert isinstance(body["down_s"], float)
            assert body["down_s"] > 0.5
            said = [r.getMessage() for r in caplog.records if r.name == "callwarden.service"]
            assert len([m for m in said if "retrying with backoff" in m]) <= 1
            assert len([m for m in said if "longer than the outage limit" in m]) == 1
        finally:
            server.start()
        assert await ready_within(http, f"{service.url}/readyz", 30.0)
        assert await post(http, delivery) == 200  # the provider's retry: not a replay
        await service.drain()
        async with await connect(url) as conn:
            assert await state(conn, job) == ("completed", "committed")



def _reconcile_once(url: str, limit_s: float, media: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "DATABASE_URL": url, "CALLWARDEN_DB_OUTAGE_LIMIT_S": str(limit_s)}
    return subprocess.Popen([sys.executable, "-m", "callwarden.cli", "reconcile", "--once",
                             "--json", "--media-dir", str(media)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _migrated(server: EmbeddedServer) -> str:
    url = create_database(server.url(), "once")

    async def go() -> None:
        async with await connect(url) as conn:
            await migrate(conn)
    asyncio.run(go())
    return url


def test_reconcile_once_rides_through_an_outage_shorter_than_its_limit(
        server: EmbeddedServer, tmp_path: Path) -> None:
    """``reconcile --once`` started while the database is down waits it out (with
    backoff) and runs its pass once the server is back: exit 0, one outage logged."""
    url = _migrated(server)
    server.halt()
    proc = _reconcile_once(url, 120, tmp_path / "media")
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # the process says the outage started ...
        assert "database unavailable, retrying with backoff" in first
        server.start()  # ... and only then is the database brought back
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, first + err
    assert json.loads(out)["pass_failed"] is False
    assert "database back after" in err
    assert "longer than the outage limit" not in err


def test_reconcile_once_exits_1_when_the_outage_outlasts_its_limit(
        server: EmbeddedServer, tmp_path: Path) -> None:
    url = _migrated(server)
    server.halt()
    try:
        proc = _reconcile_once(url, 1, tmp_path / "media")
        out, err = proc.communicate(timeout=120)
    finally:
        server.start()
    assert proc.returncode == 1, err
    assert json.loads(out)["pass_failed"] is True
    assert err.count("database unavailable, retrying with backoff") == 1
    assert "longer than the outage limit (CALLWARDEN_DB_OUTAGE_LIMIT_S=1)" in err


async def test_a_delivery_answered_without_the_database_does_not_end_the_outage(
        http: aiohttp.ClientSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An authentic delivery about no call (an ElevenLabs notice) is answered 200 without
    the database; while the database is still down it must not end the service's outage
    (found in review: it reset ``/readyz``'s over-limit report and logged a false "back")."""
    monkeypatch.setenv("CALLWARDEN_DB_OUTAGE_LIMIT_S", "0.5")
    pool = open_pool("host=127.0.0.1 port=1 dbname=x user=x connect_timeout=1", wait_s=0.3)
    config = ServiceConfig(webhooks=WebhookConfig(secrets={"elevenlabs": "sek"}))
    async with pool, running_service(pool, tmp_path / "media", config) as urls:
        base = urls.webhooks
        assert (await over_limit_within(http, f"{base}/readyz", 30.0))["over_limit"]
        body = json.dumps({"type": "voice_removal_notice", "data": {}}).encode()
        headers = {"ElevenLabs-Signature": elevenlabs_sign("sek", int(time.time()), body)}
        async with http.post(f"{base}/webhooks/elevenlabs", data=body,
                             headers=headers) as resp:
            assert resp.status == 200
        async with http.get(f"{base}/readyz") as resp:
            still = await resp.json()
        assert still["over_limit"] is True
        assert still["down_s"] > 0.5


async def test_an_outage_that_begins_during_a_pass_is_an_outage_of_the_pass(
        server: EmbeddedServer, sim: RunningSimulator, http: aiohttp.ClientSession,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The database goes away after the claim, while the pass handles its row: the pass
    is ``interrupted``, the outage is the reconciler's (one log line, its backoff), and
    ``--once``'s retry gives up past the limit instead of reporting a clean pass (found
    in review: it exited 0). Nothing is written; the call is still open afterwards."""
    monkeypatch.setenv("CALLWARDEN_DB_OUTAGE_LIMIT_S", "1")
    url = create_database(server.url(), "midpass")
    async with await connect(url) as conn:
        await migrate(conn)
        job = await dead_worker_call(conn, "kie-standard", await upstream_task(
            http, sim, "kie-standard", NOW_SCRIPT))

    async def halt_once_decided(point: str, _: uuid.UUID) -> None:
        if point == "decided" and not halted:
            halted.append(True)
            await asyncio.to_thread(server.halt)

    halted: list[bool] = []
    pool = open_pool(url, max_size=4, check=True, wait_s=0.5)
    async with pool:
        reconciler = Reconciler(pool, http, sim.settings, LocalFolderStore(tmp_path / "m"),
                                signal=halt_once_decided, sleep=no_sleep)
        try:
            counts = await reconciler.reconcile_once_through_outage()
        finally:
            server.start()
    assert counts.pass_failed or counts.interrupted  # the last try: the claim failed
    assert reconciler.outage.outages == 1
    assert reconciler.outage.over_limit
    async with await connect(url) as conn:
        assert [e.__class__.__name__ for e in await load_events(conn, job)] == [
            "CallStarted", "TaskCreated"]
