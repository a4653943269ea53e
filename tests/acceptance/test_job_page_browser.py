"""The job page in a real headless Chromium (issue 41, item 2), at 1,400 and 800 px: what
went in (the prompt, escaped) and what came out (the stored image, previewed from the
host's media server, and the text) near the top; no two timeline markers overlap and no
lane label is clipped; the event table fits its container with the settlement column in
view; no callback token, API key or webhook secret anywhere in the document (raw events
included); the admin actions offered only on an open call and only when the service has
an admin token — and the server refusing them otherwise, the call unchanged.

The job is written through the real write path (``create_job``, ``append``: a KIE-like
raw answer that echoes the callback URL with its token, a completion that stores an
image's asset row). Screenshots: ``/tmp/cw-screens/job-1400.png`` and ``job-800.png``.
Chromium is required (the test fails with how to install it, never skips).
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from callwarden.database.db import Pool, connect, open_pool
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load
from callwarden.events.states import CallState
from callwarden.events.types import (
    CallStarted,
    Completed,
    FinalizeClaimed,
    ReconcileAttempted,
    StoredMedia,
    TaskCreated,
    UpstreamResult,
    UpstreamSucceeded,
)
from callwarden.service.app import ServiceConfig
from tests.browser import Page, open_page
from tests.service import listening, running_service

TOKEN = "job-page-admin-token"
SCREENS = Path("/tmp/cw-screens")
CALLBACK_TOKEN = "cbTok3nQ9x8w7v6u5"
API_KEY = "sk-live-0123456789abcdefXYZ"
WEBHOOK_SECRET = "whsec_9f8e7d6c5b4a3"
SECRETS = (CALLBACK_TOKEN, API_KEY, WEBHOOK_SECRET, TOKEN)
PROMPT = 'a cat <script>document.title="pwned"</script> on a mat'
LONG_ACTOR = "worker:acme-host-7f9c2b1d-eu-west-1-pool-42"

# Every marker's box, pairwise: none may intersect another.
MARKERS_OVERLAP = """(() => {
  const boxes = [...document.querySelectorAll('svg.lanes g.event')]
    .map(g => g.getBoundingClientRect());
  const hits = [];
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const a = boxes[i], b = boxes[j];
    if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom)
      hits.push([i + 1, j + 1]);
  }
  return {n: boxes.length, hits: hits};
})()"""
# A lane label is clipped when it leaves the picture or runs into its lane.
LABELS_CLIPPED = """(() => {
  const svg = document.querySelector('svg.lanes').getBoundingClientRect();
  const lane = document.querySelector('svg.lanes line.lane').getBoundingClientRect();
  return [...document.querySelectorAll('svg.lanes text.lane-name')].map(t => {
    const r = t.getBoundingClientRect();
    return {text: t.textContent, clipped: r.left < svg.left - 0.5 || r.right > lane.left + 0.5};
  }).filter(x => x.clipped);
})()"""
TABLE_FITS = """(() => {
  const box = [...document.querySelectorAll('.scroll')]
    .find(s => [...s.querySelectorAll('th')].some(th => th.textContent === 'settlement'));
  const th = [...box.querySelectorAll('th')].find(th => th.textContent === 'settlement');
  return {scroll: box.scrollWidth, client: box.clientWidth,
          right: th.getBoundingClientRect().right, window: window.innerWidth,
          page: document.documentElement.scrollWidth};
})()"""


def png(width: int = 160, height: int = 90) -> bytes:
    """A real (tiny, red) PNG."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8,
                                                               2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[Pool]:
    async with open_pool(db_url, max_size=4) as p:
        yield p


@pytest.fixture
async def media_host() -> AsyncIterator[str]:
    """The host's media server (another origin than the dashboard's)."""
    async def image(request: web.Request) -> web.Response:
        return web.Response(body=png(), content_type="image/png")
    app = web.Application()
    app.add_routes([web.get("/media/{name}", image)])
    async with listening(app) as url:
        yield url


async def completed_job(db_url: str, media: str) -> uuid.UUID:
    """A KIE-like call that completed: its raw answer echoes the callback URL with the
    job's token (and a webhook secret), its completion stored one image."""
    async with await connect(db_url) as conn:
        job = await create_job(conn, credits=4, input_data={
            "provider_kind": "kie-standard",
            "request": {"model": "nano-banana-pro", "input": {"prompt": PROMPT},
                        "api_key": API_KEY}})
        callback = f"https://hooks.example/webhooks/kie/{job}/{CALLBACK_TOKEN}"
        t0 = datetime.now(UTC) - timedelta(hours=2)
        raw: dict[str, Any] = {"code": 200, "data": {
            "taskId": "task-77", "state": "success",
            "param": f'{{"callBackUrl": "{callback}", "prompt": "a cat"}}',
            "callBackUrl": callback, "webhookSecret": WEBHOOK_SECRET,
            "resultJson": '{"resultUrls": ["https://tempfile.example/o.png"]}'}}
        for event in (
                CallStarted(at=t0, actor=LONG_ACTOR, kind="kie-standard"),
                TaskCreated(at=t0 + timedelta(seconds=1.2), actor=LONG_ACTOR,
                            task_id="task-77"),
                ReconcileAttempted(at=t0 + timedelta(hours=1), actor="reconciler:r1",
                                   outcome="still_running",
                                   error=f"callback {callback} not called yet"),
                UpstreamSucceeded(at=t0 + timedelta(hours=1, seconds=3), actor="webhook",
                                  result=UpstreamResult(
                                      media_urls=("https://tempfile.example/o.png",),
                                      text="A red square, as asked.", raw=raw)),
                FinalizeClaimed(at=t0 + timedelta(hours=1, seconds=3.001),
                                actor="webhook:test", owner="webhook:test",
                                lease_until=t0 + timedelta(hours=2))):
            await append(conn, job, await load(conn, job), event)
        stored = StoredMedia(key=f"{job}/0.png", url=f"{media}/media/{job}-0.png",
                             content_type="image/png", size=len(png()))
        done = await append(conn, job, await load(conn, job), Completed(
            at=t0 + timedelta(hours=1, seconds=3.002), actor="webhook:test",
            media=(stored,), text="A red square, as asked."), assets=[stored])
        assert done.ok
    return job


async def open_job(db_url: str) -> uuid.UUID:
    async with await connect(db_url) as conn:
        job = await create_job(conn, credits=4)
        at = datetime.now(UTC) - timedelta(seconds=30)
        await append(conn, job, await load(conn, job), CallStarted(
            at=at, actor="worker:w1", kind="kie-standard"))
        await append(conn, job, await load(conn, job), TaskCreated(
            at=at + timedelta(seconds=1), actor="worker:w1", task_id="task-88"))
    return job


async def actions(page: Page) -> list[str]:
    return list(await page.js("[...document.querySelectorAll('button[data-action]')]"
                              ".map(b => b.dataset.action)"))


async def post(url: str, token: str | None = TOKEN) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http, http.post(url, headers=headers) as resp:
        return resp.status


async def test_the_job_page_shows_in_and_out_fits_and_hides_secrets_in_chromium(
        db_url: str, pool: Pool, media_host: str, tmp_path: Path) -> None:
    job = await completed_job(db_url, media_host)
    running = await open_job(db_url)
    async with running_service(pool, tmp_path / "media",
                               ServiceConfig(admin_token=TOKEN)) as urls, \
            open_page(tmp_path / "profile") as page:
        for width in (1400, 800):
            await page.viewport(width)
            await page.goto(f"{urls.operator}/jobs/{job}")
            # what went in, escaped: the prompt is text, no script of it ran
            assert await page.js("document.querySelector('.io .prompt').textContent") \
                == PROMPT
            assert (await page.js("document.title")).startswith("Job ")
            assert await page.js("document.querySelectorAll('script').length") == 1
            # what came out: the stored image, loaded from the host's media server
            src = await page.js("document.querySelector('.io img.preview').src")
            assert src == f"{media_host}/media/{job}-0.png"
            await page.wait_for("document.querySelector('.io img.preview').complete && "
                                "document.querySelector('.io img.preview').naturalWidth > 0")
            assert await page.js("document.querySelector('.io a[href$=\"-0.png\"]') "
                                 "!== null")
            assert "A red square, as asked." in await page.js(
                "document.querySelector('.io').textContent")
            # near the top: above the timeline
            assert await page.js(
                "document.querySelector('.io').getBoundingClientRect().bottom <= "
                "document.querySelector('figure.story').getBoundingClientRect().top")
            # the timeline: no overlap, no clipped lane label
            markers = await page.js(MARKERS_OVERLAP)
            assert markers["n"] == 6, (width, markers)
            assert markers["hits"] == [], (width, markers)
            assert await page.js(LABELS_CLIPPED) == [], width
            # the event table fits, the settlement column in view
            fits = await page.js(TABLE_FITS)
            assert fits["scroll"] <= fits["client"], (width, fits)
            assert fits["right"] <= fits["window"], (width, fits)
            assert fits["page"] <= fits["window"], (width, fits)
            # no secret anywhere in the document, raw events included
            await page.js("document.querySelectorAll('details').forEach(d => d.open = true)")
            html = await page.js("document.documentElement.outerHTML")
            for secret in SECRETS:
                assert secret not in html, (width, secret)
            assert f"/webhooks/kie/{job}/[redacted]" in html
            # a completed call: no action to offer
            assert await actions(page) == []
            await page.screenshot(SCREENS / f"job-{width}.png")
        await page.viewport(1400)
        await page.goto(f"{urls.operator}/jobs/{running}")
        assert await actions(page) == ["force-fail", "requeue-reconcile"]
        # the server refuses the illegal action too: the completed call is unchanged
        assert await post(f"{urls.operator}/admin/jobs/{job}/force-fail") == 409
        assert await post(f"{urls.operator}/admin/jobs/{job}/requeue-reconcile") == 409
    async with pool.connection() as conn:
        after = await load(conn, job)
    assert (after.state, after.settlement) == (CallState.COMPLETED, "committed")


async def test_no_action_is_offered_or_taken_when_admin_is_disabled(
        db_url: str, pool: Pool, tmp_path: Path) -> None:
    running = await open_job(db_url)
    async with running_service(pool, tmp_path / "media", ServiceConfig()) as urls, \
            open_page(tmp_path / "profile") as page:
        await page.viewport(800)
        await page.goto(f"{urls.operator}/jobs/{running}")
        assert await page.js("document.querySelectorAll('.admin button').length") == 0
        assert await page.js("document.getElementById('admin-token')") is None
        assert "Disabled" in await page.js("document.querySelector('.admin').textContent")
        assert await post(f"{urls.operator}/admin/jobs/{running}/force-fail") == 403
        assert await post(f"{urls.operator}/admin/jobs/{running}/force-fail", None) == 403
    async with pool.connection() as conn:
        after = await load(conn, running)
    assert (after.state, after.version) == (CallState.POLLING, 2)
