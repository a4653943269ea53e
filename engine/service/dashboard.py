"""The operator dashboard: server-rendered HTML, no JavaScript, no assets (works offline).

``/`` in-flight calls by kind and state, stale calls, exhausted calls, recent outcomes;
``/jobs?q=`` search by job id or upstream task id; ``/jobs/{id}`` the job's event timeline
(the same data as ``callwarden audit``: :func:`engine.replay.audit.audit_job`, folded step by step
by :mod:`projections.timeline`). Read-only: admin actions are separate POST endpoints that
need the admin token. Every value shown passes through :func:`html.escape`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from html import escape
from typing import Any
from urllib.parse import quote

from aiohttp import web

from engine.errors import JobNotFound
from engine.reconciler.stale import StaleRule
from engine.replay.audit import AuditReport, audit_job
from engine.store.boundary import connection
from engine.store.db import Pool
from engine.store.write import execute
from events.codec import EventDecodeError

__all__ = ["Dashboard", "page"]

_CSS = """body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222}
table{border-collapse:collapse;margin:.5rem 0 1.5rem}td,th{border:1px solid #ccc;
padding:.25rem .5rem;text-align:left;font-size:.9rem}th{background:#f0f0f0}
.muted{color:#777}form{margin:1rem 0}code{background:#f6f6f6;padding:0 .2rem}"""
_ENDED = ["Completed", "UpstreamFailed", "Swept", "Exhausted", "Cancelled"]


def _cell(value: object) -> str:
    if value is None:
        return '<td class="muted">-</td>'
    if isinstance(value, datetime):
        value = value.isoformat(timespec="seconds")
    return f"<td>{escape(str(value))}</td>"


def _job_link(job_id: object) -> str:
    text = escape(str(job_id))
    return f'<td><a href="/jobs/{quote(str(job_id))}">{text}</a></td>'


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], *, link_first: bool = False,
          empty: str = "none") -> str:
    """An HTML table; with ``link_first`` the first column is a job id linking to its page."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = [_job_link(row[0]) if link_first else _cell(row[0])]
        cells += [_cell(v) for v in row[1:]]
        body.append(f"<tr>{''.join(cells)}</tr>")
    if not body:
        return f'<p class="muted">{escape(empty)}</p>'
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def page(title: str, body: str) -> str:
    search = ('<form action="/jobs" method="get"><label>Job id or task id '
              '<input name="q" size="40"></label> <button>Search</button></form>')
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{escape(title)} - callwarden</title><style>{_CSS}</style></head>"
            f'<body><p><a href="/">callwarden</a></p>{search}<h1>{escape(title)}</h1>'
            f"{body}</body></html>")


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")


def render_job(report: AuditReport) -> str:
    summary = table(["job", "status", "call state", "kind", "version"], [[
        report.job_id, report.status, report.call_state, report.provider_kind,
        report.call_version]])
    credits = table(["reservation", "reserved", "charged", "settled at"], (
        [r.status, r.credits_reserved, r.credits_charged, r.settled_at]
        for r in report.reservations), empty="no reservation")
    rows = ([r.seq, r.type, r.at, r.since_previous_s, r.actor,
             f"{r.state_before or '-'} -> {r.state_after}", r.task_id, r.attempts, r.error,
             r.detail, r.settlement] for r in report.timeline)
    timeline = table(["seq", "event", "at", "+s", "actor", "state", "task", "attempts",
                      "error", "detail", "settlement"], rows, empty="no call events")
    admin = (f"<p class=\"muted\">Admin (needs the token): <code>curl -X POST -H "
             f"'Authorization: Bearer $TOKEN' /admin/jobs/{escape(report.job_id)}"
             f"/force-fail</code> or <code>.../requeue-reconcile</code></p>")
    return page(f"Job {report.job_id}", summary + credits + "<h2>Timeline</h2>" + timeline
                + admin)


class Dashboard:
    """The read-only pages over ``pool``; ``stale``: the reconciler's staleness rule."""

    def __init__(self, pool: Pool, stale: StaleRule, *,
                 now: Callable[[], datetime], recent_window_s: float = 86400.0) -> None:
        self.pool, self.stale, self.now = pool, stale, now
        self.recent_window_s = recent_window_s

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/", self.home), web.get("/jobs", self.search),
                web.get("/jobs/{job_id}", self.job)]

    async def home(self, request: web.Request) -> web.Response:
        now = self.now()
        since = now - timedelta(seconds=self.recent_window_s)
        stale_args = {**self.stale.sql_params(now), "limit": 50}
        async with connection(self.pool) as conn:
            inflight = await execute(conn, "metrics_open_calls", {})
            stale = await execute(conn, "dashboard_stale_calls", stale_args)
            exhausted = await execute(conn, "dashboard_recent_outcomes", {
                "since": since, "types": ["Exhausted"], "limit": 20})
            recent = await execute(conn, "dashboard_recent_outcomes", {
                "since": since, "types": _ENDED, "limit": 30})
        return _html(page("In-flight calls", _home_body(inflight, stale, exhausted, recent)))

    async def search(self, request: web.Request) -> web.Response:
        q = request.query.get("q", "").strip()
        try:
            job_id: uuid.UUID | None = uuid.UUID(q)
        except ValueError:
            job_id = None
        rows = []
        if q:
            async with connection(self.pool) as conn:
                rows = await execute(conn, "dashboard_search", {"job_id": job_id, "task_id": q})
        if len(rows) == 1:
            raise web.HTTPFound(f"/jobs/{rows[0]['id']}")
        body = table(["job", "kind", "task", "status", "call state"], (
            [r["id"], r["provider_kind"], r["provider_task_id"], r["status"], r["call_state"]]
            for r in rows), link_first=True, empty=f"no job matches {q!r}")
        return _html(page(f"Search: {q}", body), status=200 if rows else 404)

    async def job(self, request: web.Request) -> web.Response:
        try:
            job_id = uuid.UUID(request.match_info["job_id"])
        except ValueError:
            return _html(page("Not a job id", "<p>Not a job id.</p>"), status=404)
        try:
            async with connection(self.pool) as conn:
                report = await audit_job(conn, job_id)
        except JobNotFound:
            return _html(page("No such job", f"<p>No job {escape(str(job_id))}.</p>"), 404)
        except EventDecodeError as exc:
            return _html(page("Cannot replay", f"<p>{escape(str(exc))}</p>"), status=500)
        return _html(render_job(report))


def _home_body(inflight: Sequence[Mapping[str, Any]], stale: Sequence[Mapping[str, Any]],
               exhausted: Sequence[Mapping[str, Any]],
               recent: Sequence[Mapping[str, Any]]) -> str:
    parts = [table(["kind", "state", "calls"], (
        [r["kind"], r["state"], r["calls"]] for r in inflight), empty="no call in flight")]
    parts.append("<h2>Stale calls</h2>" + table(
        ["job", "kind", "state", "task", "call started", "attempts", "last error", "heartbeat"],
        ([r["id"], r["provider_kind"], r["call_state"], r["provider_task_id"],
          r["provider_call_started_at"], r["reconcile_attempts"], r["reconcile_last_error"],
          r["heartbeat_at"]] for r in stale), link_first=True, empty="no stale call"))
    parts.append("<h2>Exhausted calls</h2>" + _outcomes(exhausted, "no exhausted call"))
    parts.append("<h2>Recent outcomes</h2>" + _outcomes(recent, "no call ended recently"))
    return "".join(parts)


def _outcomes(rows: Sequence[Mapping[str, Any]], empty: str) -> str:
    return table(["job", "event", "kind", "state", "actor", "at", "error", "settlement"], (
        [r["job_id"], r["type"], r["provider_kind"], r["call_state"], r["actor"],
         r["recorded_at"], r["error_message"], r["call_settlement"]] for r in rows),
        link_first=True, empty=empty)
