"""The dashboard's routes (the I/O half): run the named queries, hand their rows to the
pure renderers, answer HTML. Read-only; the admin actions are ``callwarden.service.app``'s POST
endpoints, which the job page's buttons call. Pages carry a Content-Security-Policy that
allows only this origin's script and stylesheet, and no framing."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from html import escape
from importlib import resources
from typing import Any

from aiohttp import web

from callwarden.database.boundary import connection
from callwarden.database.db import Pool
from callwarden.database.write import execute
from callwarden.errors import JobNotFound
from callwarden.events.codec import EventDecodeError
from callwarden.replay.audit import audit_job
from callwarden.rules.stale import StaleRule
from callwarden.service.dashboard.calls import BadFilter, calls_page, parse_filters, sql_params
from callwarden.service.dashboard.html import page, table
from callwarden.service.dashboard.overview import ORIGIN, TERMINAL, WINDOWS, Overview, overview
from callwarden.service.dashboard.rollup import Rollup, latency_rows
from callwarden.service.dashboard.story import JobIO, job_page, media_origin
from callwarden.service.dashboard.waiting import PAGE as WAITING_PAGE
from callwarden.service.dashboard.waiting import waiting_page

__all__ = ["Dashboard"]

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
STATIC = {"callwarden.css": "text/css", "callwarden.js": "text/javascript"}


def _csp(media: Sequence[str] = ()) -> str:
    """:data:`CSP`, letting images, audio and video load from the ``media`` origins too
    (a job page's stored files, served by the host)."""
    if not media:
        return CSP
    extra = " ".join(sorted(set(media)))
    return CSP.replace("img-src 'self' data:;", f"img-src 'self' data: {extra}; "
                       f"media-src 'self' {extra};")


def _html(text: str, status: int = 200, *, media: Sequence[str] = ()) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8",
                        headers={"Content-Security-Policy": _csp(media),
                                 "X-Content-Type-Options": "nosniff",
                                 "Referrer-Policy": "same-origin"})


class Dashboard:
    """The pages over ``pool``; ``stale``: the reconciler's staleness rule; ``admin``:
    whether the service takes admin actions (an admin token is configured): without it no
    job page offers one."""

    def __init__(self, pool: Pool, stale: StaleRule, *,
                 now: Callable[[], datetime], recent_window_s: float = 86400.0,
                 admin: bool = False) -> None:
        self.pool, self.stale, self.now, self.admin = pool, stale, now, admin
        self.recent_window_s = recent_window_s
        self.rollup = Rollup()
        folder = resources.files("callwarden.service").joinpath("static")
        self.assets = {name: folder.joinpath(name).read_bytes() for name in STATIC}

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/", self.home), web.get("/overview/live", self.live),
                web.get("/jobs", self.calls), web.get("/jobs/{job_id}", self.job),
                web.get("/waiting", self.waiting),
                web.get("/static/{name}", self.static)]

    async def static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC:
            raise web.HTTPNotFound()
        return web.Response(body=self.assets[name], content_type=STATIC[name],
                            charset="utf-8", headers={"Cache-Control": "max-age=300"})

    async def _overview(self, request: web.Request) -> str:
        window = WINDOWS.get(request.query.get("window", ""), WINDOWS["hour"])
        now = self.now()
        starts = window.starts(now)
        recent = now - timedelta(seconds=self.recent_window_s)
        stale = self.stale.sql_params(now)
        async with connection(self.pool) as conn:
            def over(name: str) -> Awaitable[list[Mapping[str, Any]]]:
                return self.rollup.rows(conn, name, starts, window.bucket, ORIGIN, now)
            o = Overview(
                now=now, window=window, stale_rule=self.stale,
                open_calls=await execute(conn, "metrics_open_calls", {}),
                stale_counts=await execute(conn, "metrics_stale_calls", stale),
                terminal=await over("dashboard_terminal_buckets"),
                latency=latency_rows(await over("dashboard_finished_durations")),
                settled=await over("dashboard_credit_buckets"),
                stale=await execute(conn, "dashboard_stale_calls", {**stale, "limit": 50}),
                exhausted=await execute(conn, "dashboard_recent_outcomes", {
                    "since": recent, "types": ["Exhausted"], "limit": 20}),
                recent=await execute(conn, "dashboard_recent_outcomes", {
                    "since": recent, "types": list(TERMINAL), "limit": 30}),
                waiting=await execute(conn, "metrics_waiting", {}),
                limits=await execute(conn, "limits_show", {"now": now}))
        return overview(o)

    async def home(self, request: web.Request) -> web.Response:
        return _html(page("Overview", await self._overview(request), current="/"))

    async def live(self, request: web.Request) -> web.Response:
        """The overview's live part alone (the page's script swaps it in)."""
        return _html(await self._overview(request))

    async def calls(self, request: web.Request) -> web.Response:
        q = request.query.get("q", "").strip()
        if q:
            return await self._search(q)
        try:
            filters = parse_filters(request.query)
        except BadFilter as exc:
            return _html(page("Calls", f'<p class="error">{escape(str(exc))}</p>',
                              current="/jobs"), status=400)
        async with connection(self.pool) as conn:
            rows = await execute(conn, "dashboard_list_calls", sql_params(filters))
        return _html(page("Calls", calls_page(filters, rows, admin=self.admin),
                          current="/jobs"))

    async def waiting(self, request: web.Request) -> web.Response:
        """The jobs waiting for a provider account's slot, longest waiting first."""
        now = self.now()
        async with connection(self.pool) as conn:
            rows = await execute(conn, "dashboard_waiting", {
                "user_id": None, "kind": None, "from": None, "to": None,
                "limit": WAITING_PAGE + 1})
        return _html(page("Waiting", waiting_page(rows, now), current="/waiting"))

    async def _search(self, q: str) -> web.Response:
        try:
            job_id: uuid.UUID | None = uuid.UUID(q)
        except ValueError:
            job_id = None
        async with connection(self.pool) as conn:
            rows = await execute(conn, "dashboard_search", {"job_id": job_id, "task_id": q})
        if len(rows) == 1:
            raise web.HTTPFound(f"/jobs/{rows[0]['id']}")
        body = table(["job", "kind", "task", "status", "call state"], (
            [r["id"], r["provider_kind"], r["provider_task_id"], r["status"], r["call_state"]]
            for r in rows), link_first=True, empty=f"no job matches {q!r}")
        return _html(page(f"Search: {q}", body, current="/jobs"),
                     status=200 if rows else 404)

    async def job(self, request: web.Request) -> web.Response:
        try:
            job_id = uuid.UUID(request.match_info["job_id"])
        except ValueError:
            return _html(page("Not a job id", "<p>Not a job id.</p>"), status=404)
        try:
            async with connection(self.pool) as conn:
                report = await audit_job(conn, job_id)
                ledger = await execute(conn, "dashboard_ledger", {"job_id": job_id})
                events = await execute(conn, "dashboard_job_events", {"job_id": job_id})
                row = await execute(conn, "dashboard_job_io", {"job_id": job_id})
                assets = await execute(conn, "dashboard_job_assets", {"job_id": job_id})
        except JobNotFound:
            return _html(page("No such job", f"<p>No job {escape(str(job_id))}.</p>"), 404)
        except EventDecodeError as exc:
            return _html(page("Cannot replay", f"<p>{escape(str(exc))}</p>"), status=500)
        io = JobIO(input_data=row[0]["input_data"], output_data=row[0]["output_data"],
                   error_message=row[0]["error_message"], assets=assets) if row else JobIO()
        origins = [o for a in assets if (o := media_origin(str(a["url"]))) is not None]
        return _html(page(f"Job {report.job_id}", job_page(report, ledger, events, io=io,
                                                           admin=self.admin)),
                     media=origins)
