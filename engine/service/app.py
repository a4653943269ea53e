"""The service application: webhooks, ``/metrics``, ``/healthz``, ``/readyz``, the
dashboard and the admin actions, over one connection pool.

``build_app(pool, finalizer, config)`` returns an ``aiohttp`` application; the caller owns
the pool (opened) and runs the app (``callwarden serve`` or an ``AppRunner`` in tests).
Admin actions need ``Authorization: Bearer <admin token>``; with no token configured they
are refused (403) — the service is then read-only. A request a browser marks as coming
from another site (``Sec-Fetch-Site``, ``Origin``) is refused even with the token; the
dashboard's buttons send the token from the page's script (kept in ``sessionStorage``).

- ``POST /admin/jobs/{id}/force-fail``: ``Cancelled(by="admin")`` through the write path
  (refunds the reservation in the same statement). Cancelled rather than Exhausted:
  Exhausted means "the reconciler hit its attempt cap" and feeds the reconcile statistics;
  an operator stopping a call is a cancellation, and ``by="admin"`` says who.
- ``POST /admin/jobs/{id}/requeue-reconcile``: ``ReconcileAttempted(outcome="requeued",
  next_attempt_at=None)`` with actor ``admin``: a fenced append that clears
  ``reconcile_next_at`` so the next scan takes the call. An event rather than a bare
  ``UPDATE``: ``reconcile_next_at`` is a folded column, and writing it outside the log
  would make ``verify`` report the job (it counts one reconcile attempt).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from urllib.parse import urlsplit

import msgspec
from aiohttp import web
from aiohttp.web_log import AccessLogger

from callwarden.calls.finalize import Finalizer
from callwarden.database.boundary import connection
from callwarden.database.clock import Clock, DatabaseClock
from callwarden.database.db import Pool
from callwarden.database.migrate import pending
from callwarden.database.outage import Outage
from callwarden.database.write import AppendResult, cancel, execute, transition
from callwarden.errors import DatabaseError, DatabaseUnavailable
from callwarden.events.types import Event, ReconcileAttempted
from callwarden.projections.fold import CallProjection
from callwarden.providers.registry import WEBHOOKS
from callwarden.reconciler.config import ReconcileConfig
from callwarden.rules.stale import StaleRule
from callwarden.service.dashboard import Dashboard
from callwarden.service.metrics import CallGauges, exposition
from callwarden.service.webhooks import Receiver, TaskPoll, WebhookConfig

__all__ = ["RECEIVER", "RedactingAccessLogger", "ServiceConfig", "build_app",
           "redact_path"]

RECEIVER = web.AppKey("receiver", Receiver)
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServiceConfig(msgspec.Struct, frozen=True, kw_only=True):
    webhooks: WebhookConfig = msgspec.field(default_factory=WebhookConfig)
    admin_token: str | None = None
    stale: StaleRule = msgspec.field(default_factory=lambda: ReconcileConfig().stale)
    legacy_cutoff: datetime | None = None
    prune_every_s: float = 60.0
    ready_timeout_s: float = 2.0


def _cross_site(request: web.Request) -> bool:
    """Whether a browser says the request comes from another site: ``Sec-Fetch-Site``
    other than same-origin / none (typed by the user), or an ``Origin`` for another host.
    ``curl`` sends neither, so the API keeps working from a shell."""
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        return True
    origin = request.headers.get("Origin")
    return origin is not None and urlsplit(origin).netloc != request.host


def _authorized(request: web.Request, token: str | None) -> bool:
    """The admin token, sent as ``Authorization: Bearer`` — a header a cross-site form
    cannot send and a cross-site script cannot add without a CORS preflight this service
    never grants; never a cookie. Refused from another site even with the token."""
    if _cross_site(request):
        return False
    given = request.headers.get("Authorization", "")
    if not token or not given.startswith("Bearer "):
        return False
    return hmac.compare_digest(given[7:].encode(), token.encode())


class _Admin:
    def __init__(self, pool: Pool, token: str | None, now: Callable[[], datetime]) -> None:
        self.pool, self.token, self.now = pool, token, now

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/admin/jobs/{job_id}/force-fail", self.force_fail),
                web.post("/admin/jobs/{job_id}/requeue-reconcile", self.requeue)]

    def _job(self, request: web.Request) -> uuid.UUID:
        if not _authorized(request, self.token):
            raise web.HTTPForbidden(text="admin token required")
        try:
            return uuid.UUID(request.match_info["job_id"])
        except ValueError:
            raise web.HTTPNotFound(text="not a job id") from None

    async def force_fail(self, request: web.Request) -> web.Response:
        job_id = self._job(request)
        async with connection(self.pool) as conn:
            result = await cancel(conn, job_id, by="admin", now=self.now())
        return _answer(job_id, result)

    async def requeue(self, request: web.Request) -> web.Response:
        job_id = self._job(request)
        now = self.now()

        def decide(p: CallProjection) -> Event | None:
            if p.state is None or p.terminal:
                return None
            return ReconcileAttempted(at=now, actor="admin", outcome="requeued",
                                      next_attempt_at=None)

        async with connection(self.pool) as conn:
            result = await transition(conn, job_id, decide)
        return _answer(job_id, result)


def _answer(job_id: uuid.UUID, result: AppendResult) -> web.Response:
    p = result.projection
    body = {"job_id": str(job_id), "ok": result.ok,
            "call_state": p.state.value if p.state else None,
            "settlement": result.settlement}
    return web.json_response(body, status=200 if result.ok else 409)


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "up"})


class _Probes:
    def __init__(self, pool: Pool, config: ServiceConfig, now: Callable[[], datetime],
                 outage: Outage) -> None:
        self.pool, self.config, self.now, self.outage = pool, config, now, outage
        self.gauges = CallGauges(config.stale, legacy_cutoff=config.legacy_cutoff)

    async def readyz(self, request: web.Request) -> web.Response:
        try:
            async with connection(self.pool, wait_s=self.config.ready_timeout_s) as conn:
                await execute(conn, "service_ping", {})
                todo = await pending(conn)
        except Exception as exc:  # any failure to reach the database: not ready
            if isinstance(exc, DatabaseUnavailable):
                self.outage.down(exc)
            return web.json_response({"status": "database unreachable",
                                      **(self.outage.report() if self.outage.is_down else {}),
                                      "detail": str(exc)[:300]}, status=503)
        self.outage.up()
        if todo:
            names = [f"{m.version:04d}_{m.name}" for m in todo]
            return web.json_response({"status": "migrations pending", "pending": names},
                                     status=503)
        return web.json_response({"status": "ready"})

    async def metrics(self, request: web.Request) -> web.Response:
        try:
            async with connection(self.pool, wait_s=self.config.ready_timeout_s) as conn:
                families = await self.gauges.families(conn, self.now())
        except DatabaseError:  # unavailable (a pool timeout too) or failing
            families = []  # the process counters are still worth scraping
        return web.Response(body=exposition(families), headers={"Content-Type": METRICS_TYPE})


async def _prune_loop(pool: Pool, config: ServiceConfig, now: Callable[[], datetime]) -> None:
    keep = timedelta(seconds=2 * config.webhooks.longest_tolerance_s)
    while True:
        with contextlib.suppress(DatabaseUnavailable, DatabaseError):
            async with connection(pool) as conn:
                await execute(conn, "webhook_prune_deliveries", {"before": now() - keep})
        await asyncio.sleep(config.prune_every_s)


# Signal schemes carry a per-job secret token in their callback path
# (/webhooks/<provider>/<job>/<token>, see callwarden.service.webhooks.Receiver.routes).
_SIGNALS = "|".join(re.escape(n) for n, s in sorted(WEBHOOKS.items()) if not s.trusts_body)
_SECRET_PATH = re.compile(rf"^(/webhooks/(?:{_SIGNALS})/[^/?]+/)[^/?]+" if _SIGNALS
                          else r"(?!)")


def redact_path(path: str) -> str:
    """``path`` with the secret callback token of a signal scheme's callback URL (KIE's)
    blanked out."""
    return _SECRET_PATH.sub(r"\1redacted", path)


class RedactingAccessLogger(AccessLogger):
    """aiohttp's access log, without the secrets that travel in URL paths."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse,
            time: float) -> None:
        redacted = redact_path(request.rel_url.raw_path)
        if redacted != request.rel_url.raw_path:
            request = request.clone(rel_url=redacted)
        super().log(request, response, time)


def build_app(pool: Pool, finalizer: Finalizer, config: ServiceConfig, *,
              clock: Callable[[], float] = time.time, now: Clock | None = None,
              poll: TaskPoll | None = None) -> web.Application:
    """The service over an opened ``pool``; ``clock`` (unix seconds) checks webhook
    signature timestamps, ``now`` stamps events and windows (default: the database's
    clock), ``poll`` checks a KIE task a callback signals. Run it with
    ``web.AppRunner(app, access_log_class=RedactingAccessLogger)``."""
    now = now if now is not None else DatabaseClock()
    app = web.Application()
    outage = Outage(logging.getLogger("callwarden.service"), "service")
    receiver = Receiver(pool, finalizer, config.webhooks, clock=clock, now=now, poll=poll,
                        outage=outage)
    probes = _Probes(pool, config, now, outage)
    app.add_routes(receiver.routes())
    app.add_routes([web.get("/healthz", _healthz), web.get("/readyz", probes.readyz),
                    web.get("/metrics", probes.metrics)])
    app.add_routes(Dashboard(pool, config.stale, now=now).routes())
    app.add_routes(_Admin(pool, config.admin_token, now).routes())

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        pruner = asyncio.get_running_loop().create_task(_prune_loop(pool, config, now))
        yield
        pruner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pruner
        await receiver.drain()

    app.cleanup_ctx.append(lifecycle)
    app[RECEIVER] = receiver
    return app

