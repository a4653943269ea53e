"""Helpers of the lease and clock tests: a logical clock, a media store that holds its puts
until released (:class:`HeldMedia`), provider settings for a held media host, a call that
succeeded upstream and waits for its finalization."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from aiohttp import web

from callwarden.calls.config import CallConfig
from callwarden.database.db import Conn
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load
from callwarden.events.types import (
    CallStarted,
    TaskCreated,
    UpstreamResult,
    UpstreamSucceeded,
)
from callwarden.providers.base import Endpoint, ProviderSettings
from tests.support import serving_app

PNG = b"\x89PNG\r\n\x1a\n" + bytes(64)


CONFIG = CallConfig(finalize_lease_s=60, media_timeout_s=300, store_timeout_s=30,
                    lease_margin_s=5)


class LogicalClock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class HeldMedia:
    """Every GET waits until the test answers it with a status."""

    url: str
    pending: list[asyncio.Future[int]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait_for(self, count: int) -> None:
        while len(self.pending) < count:
            self.arrived.clear()
            await self.arrived.wait()


@asynccontextmanager
async def holding_media() -> AsyncIterator[HeldMedia]:
    """A media host on 127.0.0.1 that holds each GET until the test answers it
    (the ``held`` fixture)."""
    state = HeldMedia(url="")

    async def get(request: web.Request) -> web.Response:
        answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        state.pending.append(answer)
        state.arrived.set()
        status = await answer
        if status != 200:
            return web.Response(status=status, text="no")
        return web.Response(body=PNG, content_type="image/png")

    app = web.Application()
    app.router.add_get("/{tail:.*}", get)
    async with serving_app(app) as state.url:
        try:
            yield state
        finally:
            for f in state.pending:
                if not f.done():
                    f.set_result(503)


def settings_for(held: HeldMedia) -> ProviderSettings:
    return ProviderSettings(kie=Endpoint(base_url=f"{held.url}/kie", api_key="k"))


async def succeeded_call(conn: Conn, url: str, at: datetime) -> uuid.UUID:
    job = await create_job(conn, credits=10)
    p = await load(conn, job)
    for event in (CallStarted(at=at, actor="w", kind="kie-standard"),
                  TaskCreated(at=at, actor="w", task_id=f"t-{job}"),
                  UpstreamSucceeded(at=at, actor="w",
                                    result=UpstreamResult(media_urls=(url,)))):
        p = (await append(conn, job, p, event)).projection
    return job
