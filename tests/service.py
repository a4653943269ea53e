"""``callwarden serve``'s two applications on 127.0.0.1 for a test: one place that builds
them over a pool (the finalizer, the config, an ``AppRunner`` per listener on a free
port) and yields their base URLs: ``webhooks`` (what providers reach: webhooks and
health) and ``operator`` (dashboard, job pages, ``/metrics``, admin)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from aiohttp import web

from callwarden.calls.finalize import Finalizer
from callwarden.database.db import Pool
from callwarden.providers.base import ProviderSettings
from callwarden.providers.storage import LocalFolderStore
from callwarden.service.app import ServiceConfig, build_apps, runner

__all__ = ["Listeners", "listening", "running_service"]


@dataclass(frozen=True)
class Listeners:
    webhooks: str
    operator: str


@asynccontextmanager
async def listening(app: web.Application) -> AsyncIterator[str]:
    """``app`` on 127.0.0.1 (the service's runner, a free port); its URL while it runs."""
    served = runner(app)
    await served.setup()
    await web.TCPSite(served, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{served.addresses[0][1]}"
    finally:
        await served.cleanup()


@asynccontextmanager
async def running_service(pool: Pool, media: Path, config: ServiceConfig
                          ) -> AsyncIterator[Listeners]:
    """The service over ``pool`` (media stored under ``media``), its URLs while it runs."""
    finalizer = Finalizer(pool, LocalFolderStore(media), ProviderSettings(),
                          owner="webhook:test", clock=lambda: datetime.now(UTC))
    apps = build_apps(pool, finalizer, config)
    async with AsyncExitStack() as stack:
        webhooks = await stack.enter_async_context(listening(apps.webhooks))
        operator = await stack.enter_async_context(listening(apps.operator))
        yield Listeners(webhooks=webhooks, operator=operator)
