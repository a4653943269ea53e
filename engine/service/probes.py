"""The probes both listeners answer (``/healthz``, ``/readyz``) and the operator
listener's ``/metrics``: one :class:`Probes` over the service's pool and outage tracker."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from aiohttp import web

from callwarden.database.boundary import connection
from callwarden.database.db import Pool
from callwarden.database.migrate import pending
from callwarden.database.outage import Outage
from callwarden.database.write import execute
from callwarden.errors import DatabaseError, DatabaseUnavailable
from callwarden.rules.stale import StaleRule
from callwarden.service.metrics import CallGauges, exposition

__all__ = ["METRICS_TYPE", "Probes", "healthz"]

METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "up"})


class Probes:
    """``readyz`` says why the service is not ready; ``detail`` (the operator listener's)
    adds the database's own error text, which the internet-facing listener never shows
    (it can name hosts and ports)."""

    def __init__(self, pool: Pool, stale: StaleRule, legacy_cutoff: datetime | None,
                 now: Callable[[], datetime], outage: Outage, *, timeout_s: float,
                 host_left_after_s: float = 300.0) -> None:
        self.pool, self.now, self.outage, self.timeout_s = pool, now, outage, timeout_s
        self.gauges = CallGauges(stale, legacy_cutoff=legacy_cutoff,
                                 host_left_after_s=host_left_after_s)

    def routes(self, *, detail: bool) -> list[web.RouteDef]:
        async def readyz(request: web.Request) -> web.Response:
            return await self.readyz(detail=detail)
        return [web.get("/healthz", healthz), web.get("/readyz", readyz)]

    async def readyz(self, *, detail: bool) -> web.Response:
        try:
            async with connection(self.pool, wait_s=self.timeout_s) as conn:
                await execute(conn, "service_ping", {})
                todo = await pending(conn)
        except Exception as exc:  # any failure to reach the database: not ready
            if isinstance(exc, DatabaseUnavailable):
                self.outage.down(exc)
            body: dict[str, Any] = {"status": "database unreachable",
                                    **(self.outage.report() if self.outage.is_down else {})}
            if detail:
                body["detail"] = str(exc)[:300]
            return web.json_response(body, status=503)
        self.outage.up()
        if todo:
            names = [f"{m.version:04d}_{m.name}" for m in todo]
            return web.json_response({"status": "migrations pending", "pending": names},
                                     status=503)
        return web.json_response({"status": "ready"})

    async def metrics(self, request: web.Request) -> web.Response:
        try:
            async with connection(self.pool, wait_s=self.timeout_s) as conn:
                families = await self.gauges.families(conn, self.now())
        except DatabaseError:  # unavailable (a pool timeout too) or failing
            families = []  # the process counters are still worth scraping
        return web.Response(body=exposition(families), headers={"Content-Type": METRICS_TYPE})
