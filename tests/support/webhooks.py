"""Helpers of the webhook tests: the service on 127.0.0.1 (:func:`serving`,
:class:`Service`), a call started and given a task, signed bodies in each provider's
shape, and the events and state read back."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from callwarden.calls.callbacks import callback_url_for, ensure_callback_token
from callwarden.calls.finalize import Finalizer
from callwarden.database.db import Conn, Pool
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load, load_events
from callwarden.events.types import CallStarted, TaskCreated
from callwarden.providers.outcomes import PollOutcome
from callwarden.providers.registry import poll_task
from callwarden.providers.simulator.core import Delivery, RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.service.app import RECEIVER, ServiceConfig, build_webhook_app
from callwarden.service.webhooks import WebhookConfig
from tests.recorded import load as load_fixture

AUTH = {"Authorization": "Bearer sim-key"}


QUEUED = [{"phase": "queued", "seconds": 30}, {"phase": "running", "seconds": 30}]


@dataclass
class Service:
    url: str
    app: web.Application
    offset: list[float] = field(default_factory=lambda: [0.0])

    async def drain(self) -> None:
        assert await self.app[RECEIVER].drain() == 0


@asynccontextmanager
async def serving(pool: Pool, sim: RunningSimulator, http: aiohttp.ClientSession,
                  tmp_path: Path, kie_hmac_key: str | None = None) -> AsyncIterator[Service]:
    secrets = {p: sim.sim.webhook_secrets[p] for p in ("replicate", "elevenlabs")}
    if kie_hmac_key is not None:
        secrets["kie"] = kie_hmac_key
    config = ServiceConfig(admin_token="tok", webhooks=WebhookConfig(secrets=secrets))
    finalizer = Finalizer(pool, LocalFolderStore(tmp_path / "media"), sim.settings,
                          owner="webhook:test", clock=lambda: datetime.now(UTC))
    offset = [0.0]

    async def poll(kind: str, task_id: str, created_at: float | None) -> PollOutcome:
        return await poll_task(kind, task_id, http, sim.settings, created_at=created_at)

    app = build_webhook_app(pool, finalizer, config,
                            clock=lambda: sim.sim.clock.now() + offset[0], poll=poll)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield Service(url=f"http://127.0.0.1:{runner.addresses[0][1]}", app=app, offset=offset)
    finally:
        await runner.cleanup()


async def start_call(conn: Conn, kind: str) -> uuid.UUID:
    job = await create_job(conn, credits=10)
    await append(conn, job, await load(conn, job), CallStarted(
        at=datetime.now(UTC), actor="worker:test", kind=kind))
    return job


async def task_created(conn: Conn, job: uuid.UUID, task_id: str) -> None:
    await append(conn, job, await load(conn, job), TaskCreated(
        at=datetime.now(UTC), actor="worker:test", task_id=task_id))


async def replicate_task(conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
                         service: Service, *, events: list[str] | None = None,
                         webhook: dict[str, Any] | None = None,
                         end: str = "succeeded") -> uuid.UUID:
    """A prediction whose worker recorded its task id; it finishes once the test advances
    the simulated clock by 60 s."""
    job = await start_call(conn, "replicate-prediction")
    script = {"steps": QUEUED, "end": end, "webhook": webhook or {}}
    async with http.post(sim.url("replicate", "/v1/predictions"), headers=AUTH, json={
            "version": "owner/model", "input": {"prompt": "x", "_sim": script},
            "webhook": f"{service.url}/webhooks/replicate",
            "webhook_events_filter": events or ["completed"]}) as resp:
        assert resp.status == 201
        await task_created(conn, job, (await resp.json())["id"])
    return job


async def terminal_delivery(sim: RunningSimulator, outcome: str = "delivered",
                            count: int = 1) -> list[Delivery]:
    sim.sim.clock.advance(60)
    return await sim.sim.webhooks.wait_for(count, outcome=outcome)  # type: ignore[arg-type]


async def post(http: aiohttp.ClientSession, d: Delivery, *, url: str | None = None,
               body: bytes | None = None) -> int:
    async with http.post(url or d.url, data=d.body if body is None else body,
                         headers=d.headers) as resp:
        return resp.status


async def state(conn: Conn, job: uuid.UUID) -> tuple[str | None, str | None]:
    row = await (await conn.execute(
        "SELECT j.call_state, u.status FROM jobs j LEFT JOIN usage_logs u ON u.job_id = j.id "
        "WHERE j.id = %s", (job,))).fetchone()
    assert row is not None
    return row["call_state"], row["status"]


async def event_types(conn: Conn, job: uuid.UUID) -> list[str]:
    return [type(e).__name__ for e in await load_events(conn, job)]


KIE_FAMILIES: list[tuple[str, str, dict[str, Any]]] = [
    ("kie-standard", "/api/v1/jobs/createTask", {"model": "nano-banana-pro",
                                                 "input": {"prompt": "a cat"}}),
    ("kie-veo", "/api/v1/veo/generate", {"prompt": "a dog"}),
    ("kie-suno", "/api/v1/generate", {"prompt": "a song", "customMode": False,
                                      "instrumental": True, "model": "V4_5"}),
    ("kie-kontext", "/api/v1/flux/kontext/generate", {"prompt": "edit"}),
    ("kie-luma", "/api/v1/modify/generate", {"prompt": "x", "videoUrl": "https://v/x.mp4"}),
    ("kie-runway", "/api/v1/runway/generate", {"prompt": "x", "duration": 5,
                                               "quality": "720p"}),
]


async def kie_task(conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
                   service: Service, kind: str, path: str, request: dict[str, Any], *,
                   end: str = "succeeded", webhook: dict[str, Any] | None = None
                   ) -> uuid.UUID:
    job = await start_call(conn, kind)
    token = await ensure_callback_token(conn, job)
    script = {"steps": QUEUED, "end": end, "webhook": webhook or {}}
    body = {**request, "callBackUrl": callback_url_for(service.url, job, kind, token),
            "_sim": script}
    async with http.post(sim.url("kie", path), headers=AUTH, json=body) as resp:
        await task_created(conn, job, (await resp.json())["data"]["taskId"])
    return job


def stt_body(request_id: str) -> bytes:
    """A speech-to-text transcription delivery in the recorded shape, for ``request_id``."""
    body = load_fixture("elevenlabs", "webhook_speech_to_text").body
    body["data"]["request_id"] = request_id
    return msgspec.json.encode(body)
