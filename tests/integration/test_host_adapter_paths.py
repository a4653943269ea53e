"""A host's provider on every path of the engine (issue 25 item 1): the runner creates and
polls through the host's adapter and hands it the callback URL of the host's webhook scheme;
a call the host made itself (own calls) is recovered by the reconciler through the adapter;
a callback of the host's provider makes the receiver poll through it. The provider is Acme
Render (``docs/examples/acme_host/providers.py``), served over HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from callwarden.calls.callbacks import CallbackUrls, ensure_callback_token
from callwarden.calls.config import CallConfig
from callwarden.calls.finalize import Finalizer
from callwarden.calls.own import OwnCalls
from callwarden.calls.runner import CallRunner
from callwarden.config import provider_settings
from callwarden.database.db import Conn, Pool
from callwarden.providers.base import ProviderSettings
from callwarden.providers.outcomes import PollOutcome
from callwarden.providers.registry import ClientRequest, poll_task, register
from callwarden.providers.storage import LocalFolderStore
from callwarden.reconciler.loop import Reconciler
from callwarden.replay.verify import verify_job
from callwarden.service.app import ServiceConfig, build_webhook_app
from tests.support import serving_app
from tests.support.acme import KEY, Acme, load_example_adapter, registry_restored, running_acme
from tests.support.queues import until
from tests.support.rows import host_job, seen_by_host

KIND = "acme-render"


@pytest.fixture
def registered() -> Iterator[None]:
    with registry_restored():
        register(load_example_adapter().PROVIDER)
        yield


@pytest.fixture
async def acme(registered: None) -> AsyncIterator[Acme]:
    async with running_acme() as server:
        yield server


def settings_for(acme: Acme) -> ProviderSettings:
    return provider_settings({"CALLWARDEN_ACME_URL": acme.url, "ACME_API_KEY": KEY})


def host_renders(http: aiohttp.ClientSession, settings: ProviderSettings) -> Any:
    """The host's own Acme client, as its adapter (``RENDERS``, a ``Polled``) builds it."""
    return load_example_adapter().RENDERS(ClientRequest(
        kind=KIND, session=http, settings=settings, endpoint=settings.endpoints["acme"]))


async def own_render(pool: Pool, conn: Conn, http: aiohttp.ClientSession,
                     settings: ProviderSettings, prompt: str) -> tuple[uuid.UUID, str]:
    """A host job whose render the host's own code created (own calls): the job, the
    render id."""
    job = await host_job(conn)
    call = await OwnCalls(pool, settings=settings).start(job, KIND)
    assert call.action == "create"
    task = str(await host_renders(http, settings).create({"prompt": prompt}))
    await call.task_created(task)
    return job, task


async def completed_once(conn: Conn, job: uuid.UUID, acme: Acme) -> dict[str, Any]:
    seen = await seen_by_host(conn, job)
    assert seen["status"] == "completed", seen
    assert seen["credits"] == "committed"
    assert seen["assets"] == 1
    assert len(acme.renders) == 1
    assert await verify_job(conn, job) == []
    return seen


async def test_the_runner_creates_and_polls_through_the_adapter_with_its_callback_url(
        pool: Pool, conn: Conn, http: aiohttp.ClientSession, acme: Acme, tmp_path: Path
        ) -> None:
    acme.release()
    job = await host_job(conn)
    urls = CallbackUrls("https://hooks.host.example")
    await urls.prepare(conn, job)
    runner = CallRunner(pool, http, settings_for(acme), LocalFolderStore(tmp_path / "m"),
                        callback_url=urls)
    outcome = await runner.run(job, KIND, {"prompt": "a lighthouse"})
    assert outcome.result == "completed", outcome
    token = await ensure_callback_token(conn, job)
    assert acme.callbacks["r_0"] == f"https://hooks.host.example/webhooks/acme/{job}/{token}"
    await completed_once(conn, job, acme)


async def test_a_call_the_host_made_itself_is_recovered_through_its_adapter(
        pool: Pool, conn: Conn, http: aiohttp.ClientSession, acme: Acme, tmp_path: Path
        ) -> None:
    settings = settings_for(acme)
    job, _ = await own_render(pool, conn, http, settings, "a harbour")
    # the host's process dies here; the render finishes upstream
    acme.release()
    reconciler = Reconciler(pool, http, settings, LocalFolderStore(tmp_path / "m"))
    counts = await reconciler.reconcile_once(datetime.now(UTC) + timedelta(hours=1))
    assert counts.completed == 1
    assert acme.polls["r_0"] == 1  # one poll, by the reconciler, through the adapter
    await completed_once(conn, job, acme)


async def test_a_callback_of_the_hosts_provider_is_polled_through_its_adapter(
        pool: Pool, conn: Conn, http: aiohttp.ClientSession, acme: Acme, tmp_path: Path
        ) -> None:
    settings = settings_for(acme)
    job, task = await own_render(pool, conn, http, settings, "a dune")
    token = await ensure_callback_token(conn, job)
    finalizer = Finalizer(pool, LocalFolderStore(tmp_path / "m"), settings, owner="webhook:t")

    async def poll(kind: str, task_id: str, created_at: float | None) -> PollOutcome:
        return await poll_task(kind, task_id, http, settings, created_at=created_at)

    app = build_webhook_app(pool, finalizer, ServiceConfig(), poll=poll)
    async with serving_app(app) as base:
        acme.release()
        async with http.post(f"{base}/webhooks/acme/{job}/{token}",
                             json={"render": {"id": task}}) as resp:
            assert resp.status == 200, await resp.text()
        async with http.post(f"{base}/webhooks/acme/{job}/not-the-token",
                             json={"render": {"id": task}}) as resp:
            assert resp.status == 401
    assert acme.polls[task] == 1
    await completed_once(conn, job, acme)


async def test_a_slow_create_in_a_host_adapter_heartbeats_and_is_not_swept(
        pool: Pool, conn: Conn, http: aiohttp.ClientSession, acme: Acme, tmp_path: Path
        ) -> None:
    """A host adapter's create that runs past its kind's threshold (the call's start
    moved back by SQL while the request waits upstream) heartbeats while it runs: the
    reconciler's pass leaves the call alone, and once the create answers the call
    completes, created once and committed once (issue 40, item 1: it was swept and
    refunded while the create ran, and its task then belonged to no job)."""
    acme.release()
    acme.create_gate = asyncio.Event()
    job = await host_job(conn)
    runner = CallRunner(pool, http, settings_for(acme), LocalFolderStore(tmp_path / "m"),
                        config=CallConfig(heartbeat_every_s=0.05))
    running = asyncio.create_task(runner.run(job, KIND, {"prompt": "a slow lighthouse"}))
    try:
        await asyncio.wait_for(acme.creating.wait(), 10)

        async def beating() -> bool:
            row = await (await conn.execute(
                "SELECT heartbeat_at IS NOT NULL AS beat FROM jobs WHERE id = %s",
                (job,))).fetchone()
            return bool(row and row["beat"])
        await until("a heartbeat while the create runs", beating, deadline_s=10)
        await conn.execute("UPDATE jobs SET provider_call_started_at = now() - "
                           "interval '3 hours' WHERE id = %s", (job,))
        reconciler = Reconciler(pool, http, settings_for(acme),
                                LocalFolderStore(tmp_path / "rec"))
        try:
            counts = await reconciler.reconcile_once(datetime.now(UTC))
        finally:
            await reconciler.aclose()
        assert (counts.swept, counts.exhausted, counts.failed) == (0, 0, 0), counts
    finally:
        acme.create_gate.set()
    outcome = await asyncio.wait_for(running, 30)
    assert outcome.result == "completed", outcome
    await completed_once(conn, job, acme)


async def test_a_create_past_its_time_limit_is_left_for_the_reconciler(
        pool: Pool, conn: Conn, http: aiohttp.ClientSession, acme: Acme, tmp_path: Path
        ) -> None:
    """A host adapter's create that never answers is given up after
    ``provider_call_timeout_s``: the call stays ``created`` (the task may exist upstream:
    ambiguous, the reconciler's), nothing refunded by the runner (issue 40, item 1)."""
    acme.create_gate = asyncio.Event()
    job = await host_job(conn)
    runner = CallRunner(pool, http, settings_for(acme), LocalFolderStore(tmp_path / "m"),
                        config=CallConfig(provider_call_timeout_s=0.3))
    try:
        outcome = await asyncio.wait_for(runner.run(job, KIND, {"prompt": "hung"}), 30)
    finally:
        acme.create_gate.set()
    assert outcome.result == "left_for_reconciler", outcome
    assert outcome.projection.state is not None
    assert outcome.projection.state.value == "created", outcome
    assert "provider_call_timeout_s (0.3 s)" in (outcome.detail or ""), outcome
    seen = await seen_by_host(conn, job)
    assert seen["credits"] == "reserved", seen


async def test_a_transient_poll_answer_of_an_adapter_is_retried_at_once(
        pool: Pool, conn: Conn, http: aiohttp.ClientSession, acme: Acme, tmp_path: Path
        ) -> None:
    """One 502 to the reconciler's recovery poll through a host's adapter is retried with
    backoff within the pass, as the built-in clients' transport retries: the call
    completes in that pass (issue 40, item 2: it waited repoll_interval_s, 300 s)."""
    settings = settings_for(acme)
    job, _ = await own_render(pool, conn, http, settings, "a windmill")
    acme.release()
    acme.poll_failures = 1
    reconciler = Reconciler(pool, http, settings, LocalFolderStore(tmp_path / "m"))
    try:
        counts = await reconciler.reconcile_once(datetime.now(UTC) + timedelta(hours=1))
    finally:
        await reconciler.aclose()
    assert counts.completed == 1, counts
    assert acme.polls["r_0"] == 2  # the 502, then the answer
    await completed_once(conn, job, acme)
