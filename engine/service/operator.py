"""The operator listener: the dashboard, the job pages, ``/metrics``, the admin actions
and the probes — everything that shows what the calls hold (model output, raw provider
answers) or changes them. It never serves a webhook, and ``callwarden serve`` binds it to
127.0.0.1 on its own port unless told otherwise (docs/service.md, "Deployment").

Reading: with a read token configured, every route but ``/healthz`` and ``/readyz``
wants it, as ``Authorization: Bearer <token>`` (Prometheus' ``authorization``) or as the
password of HTTP Basic (a browser's own prompt; any user name); the admin token reads too.
Without one, whoever reaches the listener reads it: keep it on loopback or a private
network. A bad ``Authorization`` header (bytes that are not UTF-8, a Basic value that is not
base64) is a 401 (reading) or 403 (acting), never an error.

Admin actions need ``Authorization: Bearer <admin token>``; with no token configured they
are refused (403) — the service is then read-only. A request a browser marks as coming
from another site (``Sec-Fetch-Site``, ``Origin``) is refused even with the token; the
dashboard's buttons send the token from the page's script (kept in ``sessionStorage``).

An admin action on a job this database does not have is a 404.

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

import base64
import hmac
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Middleware

from callwarden.database.boundary import connection
from callwarden.database.db import Pool
from callwarden.database.write import AppendResult, cancel, transition
from callwarden.errors import JobNotFound
from callwarden.events.types import Event, ReconcileAttempted
from callwarden.projections.fold import CallProjection
from callwarden.service.dashboard import Dashboard
from callwarden.service.probes import Probes

__all__ = ["build_operator_routes", "read_guard"]

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _cross_site(request: web.Request) -> bool:
    """Whether a browser says the request comes from another site: ``Sec-Fetch-Site``
    other than same-origin / none (typed by the user), or an ``Origin`` for another host
    (or one that cannot be read). ``curl`` sends neither, so the API keeps working from a
    shell."""
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        return True
    origin = request.headers.get("Origin")
    if origin is None:
        return False
    try:
        return urlsplit(origin).netloc != request.host
    except ValueError:  # e.g. "http://[": no origin this host ever sends
        return True


def _same(given: str, token: str | None) -> bool:
    """Whether ``given`` is ``token``, in constant time. Header bytes that are not UTF-8
    reach here as surrogates (aiohttp decodes with ``surrogateescape``): compared as the
    bytes they were, never an error."""
    if not token:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"),
                               token.encode("utf-8", "surrogateescape"))


def _authorized(request: web.Request, token: str | None) -> bool:
    """The admin token, sent as ``Authorization: Bearer`` — a header a cross-site form
    cannot send and a cross-site script cannot add without a CORS preflight this service
    never grants; never a cookie. Refused from another site even with the token."""
    if _cross_site(request):
        return False
    given = request.headers.get("Authorization", "")
    return given.startswith("Bearer ") and _same(given[7:], token)


def _presented(request: web.Request) -> str | None:
    """The secret an ``Authorization`` header carries: a bearer token, or the password of
    HTTP Basic (``user:password``, any user)."""
    given = request.headers.get("Authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode()
        except ValueError:  # not base64 (non-ASCII included), or not UTF-8
            return None
        return decoded.partition(":")[2]
    return None


def read_guard(read_token: str, admin_token: str | None) -> Middleware:
    """A middleware: every route but the probes wants the read (or the admin) token."""
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        given = _presented(request)
        if given is not None and (_same(given, read_token) or _same(given, admin_token)):
            return await handler(request)
        raise web.HTTPUnauthorized(
            text="read token required",
            headers={"WWW-Authenticate": 'Basic realm="callwarden", charset="UTF-8"'})
    return guard


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
        try:
            async with connection(self.pool) as conn:
                result = await cancel(conn, job_id, by="admin", now=self.now())
        except JobNotFound:
            raise web.HTTPNotFound(text=f"no job {job_id}") from None
        return _answer(job_id, result)

    async def requeue(self, request: web.Request) -> web.Response:
        job_id = self._job(request)
        now = self.now()

        def decide(p: CallProjection) -> Event | None:
            if p.state is None or p.terminal:
                return None
            return ReconcileAttempted(at=now, actor="admin", outcome="requeued",
                                      next_attempt_at=None)

        try:
            async with connection(self.pool) as conn:
                result = await transition(conn, job_id, decide)
        except JobNotFound:
            raise web.HTTPNotFound(text=f"no job {job_id}") from None
        return _answer(job_id, result)


def _answer(job_id: uuid.UUID, result: AppendResult) -> web.Response:
    p = result.projection
    body = {"job_id": str(job_id), "ok": result.ok,
            "call_state": p.state.value if p.state else None,
            "settlement": result.settlement}
    return web.json_response(body, status=200 if result.ok else 409)


def build_operator_routes(pool: Pool, probes: Probes, dashboard: Dashboard,
                          admin_token: str | None, now: Callable[[], datetime]
                          ) -> list[web.RouteDef]:
    """The operator listener's routes: probes (with detail), ``/metrics``, the dashboard
    and the admin actions."""
    return [*probes.routes(detail=True), web.get("/metrics", probes.metrics),
            *dashboard.routes(), *_Admin(pool, admin_token, now).routes()]
