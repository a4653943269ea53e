"""The operator listener: the dashboard, the job pages, ``/metrics``, the admin actions
and the probes — everything that shows what the calls hold (model output, raw provider
answers) or changes them. It never serves a webhook, and ``callwarden serve`` binds it to
127.0.0.1 on its own port unless told otherwise (docs/service.md, "Deployment").

Reading: with a read token configured, every route but ``/healthz`` and ``/readyz``
wants it, as ``Authorization: Bearer <token>`` (Prometheus' ``authorization``) or as the
password of HTTP Basic (a browser's own prompt; any user name); the admin token reads too.
Without one, whoever reaches the listener reads it: keep it on loopback or a private
network. Then every route but the probes also wants a ``Host`` that names this listener —
a loopback name or address (``localhost``, 127.0.0.0/8, ``::1``, any port), or one of the
``allowed_hosts`` (``callwarden serve`` adds its ``operator_host``) — and answers 421
otherwise: a DNS-rebinding page (``attacker.example``, its name re-pointed at 127.0.0.1)
in an operator's browser reaches the listener with its own name as the ``Host`` and reads
nothing. A bad ``Authorization`` header (bytes that are not UTF-8, a Basic value that is not
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
- ``POST /admin/bulk/{action}`` (``force-fail`` or ``requeue-reconcile``): the same action
  on many jobs, each its own transition through the log, in two phases — a preview of a
  selection or of the call list's filter (how many calls the action is legal for and the
  credits they hold reserved; nothing written), then the run of what was previewed,
  skipping any job whose call state changed since. At most 500 jobs
  (:mod:`callwarden.service.dashboard.bulk`).
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import re
import uuid
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from urllib.parse import urlsplit

from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware

from callwarden.database.boundary import connection
from callwarden.database.db import Pool
from callwarden.database.write import AppendResult
from callwarden.errors import ConfigError, JobNotFound
from callwarden.service.dashboard import Dashboard
from callwarden.service.dashboard.bulk import BadBulk, act, bulk
from callwarden.service.probes import Probes

__all__ = ["allowed_host", "build_operator_routes", "host_guard", "host_name", "is_loopback",
           "read_guard"]

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# A Host header: a bracketed IPv6 address or a name/IPv4 address, then an optional port.
_HOST = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[^\s\[\]:@/\\?#%]+))"
                   r"(?::[0-9]{0,5})?")
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?"
_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")


def _canonical(name: str) -> str:
    """``name`` as compared: lower case, no final dot, an address in its shortest form."""
    name = name.lower().rstrip(".")
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name


def host_name(header: str) -> str | None:
    """The host a ``Host`` header names (without its port, as compared), or ``None`` when
    it is not one (user info, a path, an empty name)."""
    match = _HOST.fullmatch(header.strip())
    if match is None:
        return None
    return _canonical(match["v6"] or match["name"]) or None


def allowed_host(entry: str) -> str:
    """An ``allowed_hosts`` entry as compared: a host name or an address (IPv6 with or
    without brackets), no port, no scheme, no wildcard; :class:`ConfigError` otherwise."""
    name = entry.strip()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    name = _canonical(name)
    if ":" in name or not _NAME.fullmatch(name):
        try:
            ipaddress.ip_address(name)
        except ValueError:
            raise ConfigError(f"allowed_hosts: {entry!r} is not a host name or address "
                              f"(no port, scheme or wildcard)") from None
    return name


def host_guard(allowed: Iterable[str]) -> Middleware:
    """A middleware: every route but the probes wants a ``Host`` that is a loopback name
    or address, or one of ``allowed`` (:func:`allowed_host` entries); 421 otherwise (a
    DNS-rebinding page names its own host). For a listener with no read token."""
    names = frozenset(allowed_host(entry) for entry in allowed)

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        given = request.headers.getall(hdrs.HOST, [])
        name = host_name(given[0]) if len(given) == 1 else None
        if name is not None and (is_loopback(name) or name in names):
            return await handler(request)
        raise web.HTTPMisdirectedRequest(
            text="this listener answers to its own names only: localhost, 127.0.0.1, "
                 "[::1], its operator host and allowed_hosts (or set a read token)")
    return guard


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
        return [web.post("/admin/bulk/{action}", self.bulk),
                web.post("/admin/jobs/{job_id}/force-fail", self.force_fail),
                web.post("/admin/jobs/{job_id}/requeue-reconcile", self.requeue)]

    def _check(self, request: web.Request) -> None:
        if not _authorized(request, self.token):
            raise web.HTTPForbidden(text="admin token required")

    def _job(self, request: web.Request) -> uuid.UUID:
        self._check(request)
        try:
            return uuid.UUID(request.match_info["job_id"])
        except ValueError:
            raise web.HTTPNotFound(text="not a job id") from None

    async def _one(self, request: web.Request, action: str) -> web.Response:
        job_id = self._job(request)
        try:
            async with connection(self.pool) as conn:
                result = await act(conn, job_id, action, self.now())
        except JobNotFound:
            raise web.HTTPNotFound(text=f"no job {job_id}") from None
        return _answer(job_id, result)

    async def force_fail(self, request: web.Request) -> web.Response:
        return await self._one(request, "force-fail")

    async def requeue(self, request: web.Request) -> web.Response:
        return await self._one(request, "requeue-reconcile")

    async def bulk(self, request: web.Request) -> web.Response:
        self._check(request)
        try:
            answer = await bulk(self.pool, request.match_info["action"],
                                await request.read(), self.now)
        except BadBulk as exc:
            return web.Response(text=str(exc), status=exc.status)
        return web.json_response(answer)


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
