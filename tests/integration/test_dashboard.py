"""The dashboard over HTTP on a real database: the overview and its live fragment, the
call list's filters and keyset pages, the static files (served from the package), the
pages' security headers, the overview's rollup of closed buckets, and the admin actions
refused from another site even with the token (a cross-site form post can never reach
them)."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest

from callwarden.database.db import Conn, open_pool
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load
from callwarden.events.types import CallStarted, Cancelled, TaskCreated, UpstreamFailed
from callwarden.service.app import ServiceConfig
from callwarden.service.dashboard.overview import ORIGIN, WINDOWS
from callwarden.service.dashboard.rollup import Rollup
from tests.service import running_service

TOKEN = "dash-admin"


@pytest.fixture
async def base(db_url: str, tmp_path: Path) -> AsyncIterator[str]:
    async with open_pool(db_url, max_size=4) as pool, running_service(
            pool, tmp_path, ServiceConfig(admin_token=TOKEN)) as urls:
        yield urls.operator


async def call(conn: Conn, kind: str, *, at: datetime, end: str | None = None,
               error: str = "boom") -> uuid.UUID:
    job = await create_job(conn, credits=3)
    p = (await append(conn, job, await load(conn, job), CallStarted(
        at=at, actor="worker:t", kind=kind))).projection
    p = (await append(conn, job, p, TaskCreated(at=at, actor="worker:t",
                                                task_id=f"t-{job}"))).projection
    if end == "failed":
        await append(conn, job, p, UpstreamFailed(at=at + timedelta(seconds=3),
                                                  actor="reconciler:r", error=error))
    elif end == "cancelled":
        await append(conn, job, p, Cancelled(at=at + timedelta(seconds=3), actor="admin",
                                             by="admin"))
    return job


def listed(html: str) -> list[str]:
    """The job ids of the call list's rows (after a row's checkbox, when admin is on)."""
    return re.findall(r'<tr>(?:<td class="pick"[^>]*>[^<]*<input [^>]*></td>)?'
                      r'<td><a href="/jobs/([0-9a-f-]{36})"', html)


async def test_the_list_filters_and_pages_by_key(
        conn: Conn, http: aiohttp.ClientSession, base: str) -> None:
    now = datetime.now(UTC)
    jobs = [await call(conn, "kie-standard", at=now - timedelta(minutes=i)) for i in range(55)]
    failed = await call(conn, "kie-veo", at=now - timedelta(hours=2), end="failed",
                        error="quota 100%_used")
    cancelled = await call(conn, "kie-veo", at=now - timedelta(hours=3), end="cancelled")
    async with http.get(f"{base}/jobs") as resp:
        first = await resp.text()
    assert listed(first) == [str(j) for j in jobs[:50]]  # newest call start first
    nxt = re.search(r'href="(/jobs\?cursor=[^"]+)">Next page', first)
    assert nxt is not None
    async with http.get(base + nxt[1].replace("&amp;", "&")) as resp:
        second = await resp.text()
    assert listed(second) == [str(j) for j in jobs[50:]] + [str(failed), str(cancelled)]
    assert "Next page" not in second
    for query, expect in (({"kind": "kie-veo"}, [failed, cancelled]),
                          ({"state": "cancelled"}, [cancelled]),
                          ({"actor": "reconciler"}, [failed]),
                          ({"error": "100%_used"}, [failed]),
                          ({"error": "100%xused"}, []),
                          ({"to": (now - timedelta(minutes=150)).strftime("%Y-%m-%dT%H:%M")},
                           [cancelled])):
        async with http.get(f"{base}/jobs", params=query) as resp:
            assert (query, listed(await resp.text())) == (query, [str(j) for j in expect])
    async with http.get(f"{base}/jobs", params={"state": "<bogus>"}) as resp:
        assert resp.status == 400
        assert "&lt;bogus&gt;" in await resp.text()


async def test_the_overview_its_fragment_and_assets_are_served_offline(
        conn: Conn, http: aiohttp.ClientSession, base: str) -> None:
    await call(conn, "kie-veo", at=datetime.now(UTC) - timedelta(minutes=1), end="failed")
    for window in ("hour", "day"):
        async with http.get(f"{base}/", params={"window": window}) as resp:
            page = await resp.text()
            csp = resp.headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in csp
        assert "script-src 'self'" in csp
        assert page.count('role="img"') >= 3
        assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing from elsewhere
    async with http.get(f"{base}/overview/live", params={"window": "day"}) as resp:
        live = await resp.text()
    assert live.startswith('<div id="live" data-window="day">')
    for name, kind in (("callwarden.css", "text/css"), ("callwarden.js", "text/javascript")):
        async with http.get(f"{base}/static/{name}") as resp:
            assert (resp.status, resp.content_type) == (200, kind)
            assert len(await resp.read()) > 500
    async with http.get(f"{base}/static/..%2Fservice.sql") as resp:
        assert resp.status == 404


async def test_admin_actions_refuse_cross_site_requests_even_with_the_token(
        conn: Conn, http: aiohttp.ClientSession, base: str) -> None:
    job = await call(conn, "kie-standard", at=datetime.now(UTC))
    url = f"{base}/admin/jobs/{job}/force-fail"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for headers in (
            {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site",
             "Content-Type": "application/x-www-form-urlencoded"},  # a cross-site form
            {**auth, "Origin": "https://evil.example"},
            {**auth, "Sec-Fetch-Site": "cross-site"},
            {**auth, "Sec-Fetch-Site": "same-site"}):
        async with http.post(url, headers=headers, data="x=1") as resp:
            assert resp.status == 403, headers
    assert (await load(conn, job)).version == 2  # nothing appended
    same = {**auth, "Origin": base, "Sec-Fetch-Site": "same-origin"}
    async with http.post(url, headers=same) as resp:
        assert resp.status == 200  # the dashboard's own button
    assert (await load(conn, job)).terminal


async def test_the_rollup_reads_a_closed_bucket_once_and_the_open_one_every_time(
        conn: Conn) -> None:
    job = await create_job(conn, credits=1)
    now = datetime.now(UTC)
    w = WINDOWS["day"]
    starts = w.starts(now)

    async def event(seq: int, at: datetime) -> None:
        await conn.execute(
            "INSERT INTO callwarden.call_events (job_id, seq, type, payload, actor, recorded_at) "
            "VALUES (%s, %s, 'Completed', '{}', 'worker:x', %s)", (job, seq, at))

    async def counts(rollup: Rollup) -> dict[datetime, int]:
        rows = await rollup.rows(conn, "dashboard_terminal_buckets", starts, w.bucket,
                                 ORIGIN, now)
        return {r["bucket"]: r["calls"] for r in rows}

    await event(1, starts[-3] + timedelta(minutes=1))
    rollup = Rollup()
    assert await counts(rollup) == {starts[-3]: 1}
    await event(2, starts[-3] + timedelta(minutes=2))  # a closed bucket: not read again
    await event(3, now)  # the open bucket: read on every request
    assert await counts(rollup) == {starts[-3]: 1, starts[-1]: 1}
    assert await counts(Rollup()) == {starts[-3]: 2, starts[-1]: 1}  # a new process
