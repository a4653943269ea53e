"""``callwarden serve``'s application on 127.0.0.1 for a test: one place that builds it
over a pool (the finalizer, the config, an ``AppRunner`` on a free port) and yields its
base URL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

from aiohttp import web

from callwarden.calls.finalize import Finalizer
from callwarden.database.db import Pool
from callwarden.providers.base import ProviderSettings
from callwarden.providers.storage import LocalFolderStore
from callwarden.service.app import ServiceConfig, build_app

__all__ = ["running_service"]


@asynccontextmanager
async def running_service(pool: Pool, media: Path, config: ServiceConfig) -> AsyncIterator[str]:
    """The service over ``pool`` (media stored under ``media``), its URL while it runs."""
    finalizer = Finalizer(pool, LocalFolderStore(media), ProviderSettings(),
                          owner="webhook:test", clock=lambda: datetime.now(UTC))
    runner = web.AppRunner(build_app(pool, finalizer, config))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
