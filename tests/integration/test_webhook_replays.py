"""A replayed KIE callback costs nothing (issue 24, item 6).

In token mode (no HMAC key: the default) a KIE callback URL carries no timestamp, so
whoever holds one can replay it at will. The receiver coalesces per job: one poll or
finalization in flight at a time, no webhook-triggered poll sooner than
``signal_interval_s`` after the last but one trailing poll for whatever was coalesced
away (so a real signal is never lost), and a webhook-triggered finalization that fails
counts towards the reconciler's attempt cap, as the reconciler's own do. Counted from
outside: the simulator's request journal (``recordInfo`` polls, media downloads) and
``call_events`` by SQL.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from callwarden.calls.callbacks import callback_url_for, ensure_callback_token
from callwarden.calls.finalize import Finalizer
from callwarden.database.db import Conn, Pool
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load
from callwarden.events.types import CallStarted, TaskCreated
from callwarden.providers.outcomes import PollOutcome
from callwarden.providers.registry import poll_task
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.reconciler.config import ReconcileConfig
from callwarden.replay.verify import verify_job
from callwarden.service.app import RECEIVER, ServiceConfig, build_webhook_app
from callwarden.service.webhooks import WebhookConfig
from tests.service import listening

AUTH = {"Authorization": "Bearer sim-key"}
KIND = "kie-standard"
INTERVAL = 10.0  # WebhookConfig's default signal_interval_s (checked below)


@dataclass
class Shifted:
    """Now, moved forward by the test (the receiver's and the finalizer's event clock)."""

    by: timedelta = field(default_factory=timedelta)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.by


@dataclass
class Service:
    url: str
    drain: Any


@asynccontextmanager
async def serving(pool: Pool, sim: RunningSimulator, http: aiohttp.ClientSession,
                  tmp_path: Path, now: Shifted) -> AsyncIterator[Service]:
    """The webhook app in token mode (no KIE HMAC key), with its defaults."""
    finalizer = Finalizer(pool, LocalFolderStore(tmp_path / "media"), sim.settings,
                          owner="webhook:replays", clock=now)

    async def poll(kind: str, task_id: str, created_at: float | None) -> PollOutcome:
        return await poll_task(kind, task_id, http, sim.settings, created_at=created_at)

    app = build_webhook_app(pool, finalizer, ServiceConfig(), clock=sim.sim.clock.now,
                            now=now, poll=poll)
    async with listening(app) as url:
        yield Service(url=url, drain=app[RECEIVER].drain)


async def kie_call(conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
                   base: str, script: dict[str, Any]) -> tuple[uuid.UUID, str, str]:
    """A job whose worker started a KIE task and recorded its id: (job, task, callback
    URL). The simulator's own callback is dropped: the test sends it."""
    job = await create_job(conn, credits=10)
    now = datetime.now(UTC)
    p = (await append(conn, job, await load(conn, job), CallStarted(
        at=now, actor="worker:test", kind=KIND))).projection
    token = await ensure_callback_token(conn, job)
    url = callback_url_for(base, job, KIND, token)
    assert url is not None
    async with http.post(sim.url("kie", "/api/v1/jobs/createTask"), headers=AUTH, json={
            "model": "nano-banana-pro", "callBackUrl": url,
            "input": {"prompt": "x", "_sim": {**script, "webhook": {"drop": True}}}}) as resp:
        task = str((await resp.json())["data"]["taskId"])
    await append(conn, job, p, TaskCreated(at=now, actor="worker:test", task_id=task))
    return job, task, url


def callback(task: str) -> bytes:
    """A KIE market callback body naming ``task`` (only a signal: the receiver polls)."""
    return msgspec.json.encode({"code": 200, "msg": "success",
                                "data": {"taskId": task, "state": "success"}})


async def replay(http: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, str]:
    async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        return r.status, (await r.json())["result"]


async def events(conn: Conn, job: uuid.UUID) -> list[str]:
    rows = await (await conn.execute(
        "SELECT type FROM callwarden.call_events WHERE job_id = %s ORDER BY "
        "seq", (job,))).fetchall()
    return [r["type"] for r in rows]


async def test_a_replayed_kie_callback_polls_the_task_once_per_interval(
        pool: Pool, conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
        tmp_path: Path) -> None:
    """200 concurrent replays, then 200 one after another, of one callback URL while its
    task runs: at most two ``recordInfo`` polls (one, and one trailing) per
    ``signal_interval_s`` (of simulated time, the receiver's clock), every replay
    acknowledged 2xx, nothing recorded. Once the interval has passed and the task is done,
    the next callback polls and completes."""
    async with serving(pool, sim, http, tmp_path, Shifted()) as service:
        job, task, url = await kie_call(conn, sim, http, service.url, {
            "steps": [{"phase": "running", "seconds": 3600}], "end": "succeeded"})
        body = callback(task)
        polls, started = sim.sim.journal.count("kie", "poll"), sim.sim.clock.now()
        answers = await asyncio.gather(*(replay(http, url, body) for _ in range(200)))
        answers += [await replay(http, url, body) for _ in range(200)]
        elapsed = sim.sim.clock.now() - started
        made = sim.sim.journal.count("kie", "poll") - polls
        assert made <= 2 * (1 + int(elapsed // INTERVAL)), (made, elapsed)
        assert {status for status, _ in answers} <= {200, 202}
        assert await events(conn, job) == ["CallStarted", "TaskCreated"]

        sim.sim.clock.advance(3600 + INTERVAL)  # done upstream, and the interval is over
        assert await replay(http, url, body) == (200, "applied")
        await service.drain()
    assert (await load(conn, job)).state == "completed"
    assert await verify_job(conn, job) == []
    assert WebhookConfig().signal_interval_s == INTERVAL


async def test_replays_of_a_call_whose_result_cannot_be_stored_end_at_the_attempt_cap(
        pool: Pool, conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
        tmp_path: Path) -> None:
    """The task succeeded but its media answers 503 (transient): the call sits in
    ``upstream_succeeded``. Each replay of its callback may try one finalization (one
    download) only when the last attempt's re-poll interval is over, each failure counts
    one attempt, and at the reconciler's cap the call ends exhausted and refunded, once.
    The test replays 2 x cap + 5 times, moving the clock one re-poll interval after each,
    with 50 concurrent replays before each move."""
    reconcile = ReconcileConfig()
    cap, repoll = reconcile.attempt_cap, timedelta(seconds=reconcile.repoll_interval_s)
    now = Shifted()
    async with serving(pool, sim, http, tmp_path, now) as service:
        job, task, url = await kie_call(conn, sim, http, service.url, {
            "steps": [], "end": "succeeded", "media_status": 503})
        body = callback(task)
        for _ in range(2 * cap + 5):
            answers = await asyncio.gather(*(replay(http, url, body) for _ in range(50)))
            assert {status for status, _ in answers} <= {200, 202}
            await service.drain()
            now.by += repoll
        downloads = [p for p in sim.sim.media.requests if p.startswith("/media/")]
        seen = await events(conn, job)
    assert seen.count("UpstreamSucceeded") == 1
    assert len(downloads) == seen.count("FinalizeClaimed") == cap, (len(downloads), seen)
    assert seen.count("FinalizeFailed") == seen.count("ReconcileAttempted") == cap
    assert seen[-1] == "Exhausted"
    assert (await load(conn, job)).state == "exhausted"
    rows = await (await conn.execute(
        "SELECT status FROM usage_logs WHERE job_id = %s", (job,))).fetchall()
    assert rows == [{"status": "refunded"}]
    assert await verify_job(conn, job) == []
