"""The webhook receiver's failure paths over HTTP (issue 14, item 6), against the
simulator's real signed deliveries and a real Postgres:

- a database error *after* the delivery was claimed (the connection is killed by its own
  backend in the middle of the append: a trigger calls ``pg_terminate_backend``) is
  answered 503 with ``Retry-After``, the claim is forgotten, and the provider's retry of
  the same delivery applies — Replicate (signed body) and KIE in HMAC mode (a signal,
  polled);
- KIE callbacks that concern nothing this job runs: a job of another kind, an unknown
  job, a malformed job id, a task not recorded yet, a task that is not the job's — each
  answered with its documented status, never polled, nothing written;
- a background finalization that fails (the media store refuses the bytes): the delivery
  is acknowledged, the call is left ``upstream_succeeded`` with its reservation untouched,
  a duplicate delivery changes nothing, and the reconciler completes it, settled once;
  one that fails for good (the result's host is refused by the media guard) fails the
  call and refunds it once.

Each answer's metric (``callwarden_webhook_deliveries_total{provider,outcome}``) moves by
exactly one.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from callwarden.calls.callbacks import ensure_callback_token
from callwarden.calls.finalize import Finalizer
from callwarden.database.clock import utcnow
from callwarden.database.db import Conn, Pool
from callwarden.database.write import load
from callwarden.observe.metrics import REGISTRY
from callwarden.providers.outcomes import PollOutcome
from callwarden.providers.registry import poll_task
from callwarden.providers.simulator.core import Delivery, RunningSimulator
from callwarden.providers.storage import LocalFolderStore, MediaStore
from callwarden.reconciler.loop import Reconciler
from callwarden.replay.verify import verify_job
from callwarden.service.app import ServiceConfig, build_webhook_app
from callwarden.service.webhooks import WebhookConfig
from tests.support import no_sleep
from tests.support.webhooks import (
    KIE_FAMILIES,
    Service,
    event_types,
    kie_task,
    replicate_task,
    start_call,
    state,
    task_created,
    terminal_delivery,
)

# Kills the appending backend once, in the middle of the statement appending the first
# UpstreamSucceeded (the sequence is not transactional: it stays used after the rollback).
KILL_ONCE = b"""
CREATE SEQUENCE kill_once;
CREATE FUNCTION kill_once() RETURNS trigger AS $$
BEGIN
    IF NEW.type = 'UpstreamSucceeded' AND nextval('kill_once') = 1 THEN
        PERFORM pg_terminate_backend(pg_backend_pid());
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER kill_once BEFORE INSERT ON callwarden.call_events
    FOR EACH ROW EXECUTE FUNCTION kill_once();
"""


@asynccontextmanager
async def serving(pool: Pool, sim: RunningSimulator, http: aiohttp.ClientSession,
                  store: MediaStore, *, kie_hmac: bool = False) -> AsyncIterator[Service]:
    """The service (the receiver with a poller) with its finalizer storing into ``store``."""
    secrets = {p: sim.sim.webhook_secrets[p] for p in ("replicate", "elevenlabs")}
    if kie_hmac:
        secrets["kie"] = sim.sim.webhook_secrets["kie"]
    finalizer = Finalizer(pool, store, sim.settings, owner="webhook:test",
                          clock=lambda: datetime.now(UTC))

    async def poll(kind: str, task_id: str, created_at: float | None) -> PollOutcome:
        return await poll_task(kind, task_id, http, sim.settings, created_at=created_at)

    app = build_webhook_app(pool, finalizer,
                            ServiceConfig(webhooks=WebhookConfig(secrets=secrets)),
                            clock=sim.sim.clock.now, poll=poll)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield Service(url=f"http://127.0.0.1:{runner.addresses[0][1]}", app=app)
    finally:
        await runner.cleanup()


def delivered(provider: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("callwarden_webhook_deliveries_total",
                                     {"provider": provider, "outcome": outcome}) or 0.0


async def answer(http: aiohttp.ClientSession, d: Delivery, url: str | None = None
                 ) -> tuple[int, str, str | None]:
    """(status, the receiver's result label, Retry-After)."""
    async with http.post(url or d.url, data=d.body, headers=d.headers) as resp:
        return resp.status, (await resp.json())["result"], resp.headers.get("Retry-After")


async def remembered(conn: Conn) -> int:
    row = await (await conn.execute("SELECT count(*) AS n FROM "
                                    "callwarden.webhook_deliveries")).fetchone()
    assert row is not None
    return int(row["n"])


# -- a database error after the claim: 503, forgotten, the retry applies ----------------------

@pytest.mark.parametrize("provider", ["replicate", "kie"])
async def test_a_database_error_mid_delivery_is_503_and_the_retry_applies(
        conn: Conn, pool: Pool, sim: RunningSimulator, http: aiohttp.ClientSession,
        tmp_path: Path, provider: str) -> None:
    await conn.execute(KILL_ONCE)
    async with serving(pool, sim, http, LocalFolderStore(tmp_path / "media"),
                       kie_hmac=True) as service:
        if provider == "replicate":
            job = await replicate_task(conn, sim, http, service, webhook={"drop": True})
        else:
            job = await kie_task(conn, sim, http, service, *KIE_FAMILIES[0],
                                 webhook={"drop": True})
        [d] = await terminal_delivery(sim, outcome="dropped")
        errors, applied = delivered(provider, "error"), delivered(provider, "applied")
        status, result, retry_after = await answer(http, d)
        assert (status, result, retry_after) == (503, "error", "30")
        assert delivered(provider, "error") == errors + 1
        killed = await (await conn.execute("SELECT last_value, is_called FROM kill_once")
                        ).fetchone()
        assert killed == {"last_value": 1, "is_called": True}  # it died inside the append
        assert await remembered(conn) == 0  # the claim was forgotten
        assert await state(conn, job) == ("polling", "reserved")
        assert await event_types(conn, job) == ["CallStarted", "TaskCreated"]
        assert await answer(http, d) == (200, "applied", None)  # the retry: not a replay
        assert delivered(provider, "applied") == applied + 1
        await service.drain()
        assert await answer(http, d) == (200, "duplicate", None)
    assert await state(conn, job) == ("completed", "committed")
    types = await event_types(conn, job)
    assert (types.count("UpstreamSucceeded"), types.count("Completed")) == (1, 1)
    assert await remembered(conn) == 1
    assert await verify_job(conn, job) == []


# -- KIE signals about nothing this job runs --------------------------------------------------

async def test_kie_signals_about_nothing_the_job_runs_are_answered_and_change_nothing(
        conn: Conn, pool: Pool, sim: RunningSimulator, http: aiohttp.ClientSession,
        tmp_path: Path) -> None:
    """Token mode (no HMAC key): the URL's job and token authenticate. A job of another
    kind (200 ignored), a task that is not the job's (200 ignored), a task id not recorded
    yet (202), an unknown job (401: nothing authenticates it) and a job id that is not
    one (404); none is polled, none writes an event or a delivery."""
    async with serving(pool, sim, http, LocalFolderStore(tmp_path / "media")) as service:
        kind, path, body = KIE_FAMILIES[0]
        job = await kie_task(conn, sim, http, service, kind, path, body,
                             webhook={"drop": True})
        [d] = await terminal_delivery(sim, outcome="dropped")
        base = d.url.rsplit("/", 2)[0]  # .../webhooks/kie
        other = await start_call(conn, "replicate-prediction")
        await task_created(conn, other, "a-replicate-prediction")
        other_token = await ensure_callback_token(conn, other)
        pending = await start_call(conn, kind)
        pending_token = await ensure_callback_token(conn, pending)
        moved = await start_call(conn, kind)
        await task_created(conn, moved, "another-kie-task")
        moved_token = await ensure_callback_token(conn, moved)
        cases = [  # (url, status, result)
            (f"{base}/{other}/{other_token}", 200, "ignored"),
            (f"{base}/{moved}/{moved_token}", 200, "ignored"),
            (f"{base}/{pending}/{pending_token}", 202, "not_yet_known"),
            (f"{base}/{uuid.uuid4()}/{other_token}", 401, "unknown_task"),
            (f"{base}/not-a-job-id/{other_token}", 404, "unknown_task"),
        ]
        polls = sim.sim.journal.count("kie", "poll")
        for url, status, result in cases:
            before = delivered("kie", result)
            assert (await answer(http, d, url))[:2] == (status, result), url
            assert delivered("kie", result) == before + 1
        assert sim.sim.journal.count("kie", "poll") == polls  # none was polled
        for j, types in ((job, ["CallStarted", "TaskCreated"]),
                         (other, ["CallStarted", "TaskCreated"]),
                         (pending, ["CallStarted"]),
                         (moved, ["CallStarted", "TaskCreated"])):
            assert await event_types(conn, j) == types
        assert await remembered(conn) == 0
        assert (await answer(http, d))[:2] == (200, "applied")  # the job's own signal
        await service.drain()
    assert await state(conn, job) == ("completed", "committed")


# -- a background finalization that fails ----------------------------------------------------

@pytest.mark.parametrize("provider", ["replicate", "kie"])
async def test_a_failing_background_finalize_is_left_for_the_reconciler_settled_once(
        conn: Conn, pool: Pool, sim: RunningSimulator, http: aiohttp.ClientSession,
        tmp_path: Path, provider: str) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the media root should be")
    async with serving(pool, sim, http, LocalFolderStore(blocked), kie_hmac=True) as service:
        if provider == "replicate":
            job = await replicate_task(conn, sim, http, service, webhook={"drop": True})
        else:
            job = await kie_task(conn, sim, http, service, *KIE_FAMILIES[0],
                                 webhook={"drop": True})
        [d] = await terminal_delivery(sim, outcome="dropped")
        assert (await answer(http, d))[:2] == (200, "applied")
        await service.drain()  # the background finalize ran, and failed: one attempt
        assert await state(conn, job) == ("upstream_succeeded", "reserved")
        assert (await event_types(conn, job))[-4:] == [
            "UpstreamSucceeded", "FinalizeClaimed", "FinalizeFailed", "ReconcileAttempted"]
        assert (await answer(http, d))[:2] == (200, "duplicate")
        await service.drain()
        assert (await event_types(conn, job)).count("FinalizeClaimed") == 1
    reconciler = Reconciler(pool, http, sim.settings, LocalFolderStore(tmp_path / "ok"),
                            sleep=no_sleep)
    counts = await reconciler.reconcile_once(utcnow() + timedelta(hours=1))
    assert counts.completed == 1
    assert await state(conn, job) == ("completed", "committed")
    types = await event_types(conn, job)
    assert (types.count("UpstreamSucceeded"), types.count("Completed")) == (1, 1)
    charged = await (await conn.execute(
        "SELECT credits_charged, settled_by_seq FROM usage_logs WHERE job_id = %s",
        (job,))).fetchall()
    assert [(r["credits_charged"], r["settled_by_seq"]) for r in charged] == [
        (10, (await load(conn, job)).version)]
    assert await verify_job(conn, job) == []


async def test_a_background_finalize_refused_by_the_media_guard_fails_and_refunds_once(
        conn: Conn, pool: Pool, sim: RunningSimulator, http: aiohttp.ClientSession,
        tmp_path: Path) -> None:
    """The delivered result is a file on a media host the guard refuses (not a valid
    name; a URL on any other host would be text): the background finalize fails the call
    at once (a permanent error) and refunds; the provider's retry of the delivery and a
    later reconcile pass change nothing."""
    async with serving(pool, sim, http, LocalFolderStore(tmp_path / "media")) as service:
        job = await start_call(conn, "replicate-prediction")
        script = {"steps": [{"phase": "queued", "seconds": 30}], "end": "succeeded",
                  "webhook": {"drop": True},
                  "result_urls": ["https://a..replicate.delivery/x.png"]}
        async with http.post(sim.url("replicate", "/v1/predictions"), json={
                "version": "owner/model", "input": {"prompt": "x", "_sim": script},
                "webhook": f"{service.url}/webhooks/replicate",
                "webhook_events_filter": ["completed"]},
                headers={"Authorization": "Bearer sim-key"}) as resp:
            assert resp.status == 201
            await task_created(conn, job, (await resp.json())["id"])
        [d] = await terminal_delivery(sim, outcome="dropped")
        assert (await answer(http, d))[:2] == (200, "applied")
        await service.drain()
        assert await state(conn, job) == ("failed", "refunded")
        assert (await answer(http, d))[:2] == (200, "duplicate")
        await service.drain()
    reconciler = Reconciler(pool, http, sim.settings, LocalFolderStore(tmp_path / "ok"),
                            sleep=no_sleep)
    assert (await reconciler.reconcile_once(utcnow() + timedelta(hours=1))).claimed == 0
    types = await event_types(conn, job)
    assert types == ["CallStarted", "TaskCreated", "UpstreamSucceeded", "FinalizeClaimed",
                     "UpstreamFailed"]
    charged = await (await conn.execute(
        "SELECT status, credits_charged, settled_by_seq FROM usage_logs WHERE job_id = %s",
        (job,))).fetchall()
    assert [(r["status"], r["credits_charged"], r["settled_by_seq"]) for r in charged] == [
        ("refunded", 0, (await load(conn, job)).version)]
    assert await verify_job(conn, job) == []
