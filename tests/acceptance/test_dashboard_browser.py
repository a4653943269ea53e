"""The operator dashboard in a real headless Chromium (Debian's ``chromium``), with calls
run through the worker's real path against the provider simulator and a few written
through the write path: the overview renders its charts and refreshes itself in place;
the call list's filters narrow it; a job page tells its story; the admin button
force-fails a call with the session's token and is refused without it (the call unchanged
in the database); no page scrolls sideways at 1,280 or 390 px. Screenshots go to
``docs/screenshots/`` (git-ignored; linked from docs/operations.md).

Chromium is required: if it is missing the test FAILS with how to install it (never a
silent skip). ``.ci/run`` installs it (``apt-get install -y chromium``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from callwarden.calls.config import CallConfig
from callwarden.calls.runner import CallRunner
from callwarden.database.db import Pool, connect, open_pool
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load
from callwarden.events.states import CallState
from callwarden.events.types import CallStarted, TaskCreated, UpstreamFailed
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.service.app import ServiceConfig
from tests.browser import Page, chromium, open_page
from tests.service import running_service
from tests.support import no_sleep

TOKEN = "browser-test-token"
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
KIE_REQ: dict[str, Any] = {"model": "nano-banana-pro", "input": {"prompt": "a cat"}}
NO_OVERFLOW = "document.documentElement.scrollWidth <= document.documentElement.clientWidth"


async def browse(url: str, tmp_path: Path, *extra: str) -> str:
    """Chromium's ``--dump-dom`` (or ``--screenshot``) of ``url``: its stdout."""
    proc = await asyncio.create_subprocess_exec(
        chromium(), "--headless", "--no-sandbox", "--disable-gpu",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--no-first-run", "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / uuid.uuid4().hex[:8]}", *extra, url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return out.decode()


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[Pool]:
    async with open_pool(db_url, max_size=4) as p:
        yield p


@pytest.fixture
async def dashboard(pool: Pool, tmp_path: Path) -> AsyncIterator[str]:
    async with running_service(pool, tmp_path / "media",
                               ServiceConfig(admin_token=TOKEN)) as urls:
        yield urls.operator


async def open_call(db_url: str, kind: str, task: str, *, age_s: float = 0) -> uuid.UUID:
    async with await connect(db_url) as conn:
        job = await create_job(conn, credits=4)
        at = datetime.now(UTC) - timedelta(seconds=age_s)
        p = (await append(conn, job, await load(conn, job), CallStarted(
            at=at, actor="worker:browser", kind=kind))).projection
        await append(conn, job, p, TaskCreated(at=at + timedelta(seconds=1.2),
                                               actor="worker:browser", task_id=task))
    return job


async def failed_call(db_url: str) -> uuid.UUID:
    job = await open_call(db_url, "kie-veo", "task-veo-7", age_s=200)
    async with await connect(db_url) as conn:
        await append(conn, job, await load(conn, job), UpstreamFailed(
            at=datetime.now(UTC), actor="reconciler:r1", error="quota exceeded (100%_used)"))
    return job


async def simulated_calls(pool: Pool, sim: RunningSimulator, tmp_path: Path, n: int) -> None:
    """``n`` kie-standard calls run by a worker's runner against the simulator."""
    async with aiohttp.ClientSession() as http:
        runner = CallRunner(pool, http, sim.settings, LocalFolderStore(tmp_path / "media"),
                            config=CallConfig(), sleep=no_sleep,
                            callback_url=lambda job, kind: "http://127.0.0.1:9/cb")
        for _ in range(n):
            async with pool.connection() as conn:
                job = await create_job(conn, credits=10)
            assert (await runner.run(job, "kie-standard", KIE_REQ)).result == "completed"


async def rows(page: Page) -> list[list[str]]:
    value = await page.js("[...document.querySelectorAll('main tbody tr')].map("
                          "r => [...r.cells].filter(c => !c.classList.contains('pick'))"
                          ".map(c => c.textContent))")
    return list(value)


async def no_overflow(page: Page, url: str) -> None:
    for width in (1280, 390):
        await page.viewport(width)
        await page.goto(url)
        assert await page.js(NO_OVERFLOW), (url, width, await page.js(
            "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"))


async def test_an_operator_watches_filters_and_acts_in_chromium(
        db_url: str, pool: Pool, dashboard: str, sim: RunningSimulator,
        tmp_path: Path) -> None:
    await simulated_calls(pool, sim, tmp_path, 3)
    failed = await failed_call(db_url)
    target = await open_call(db_url, "replicate-prediction", "pred-abc123", age_s=30)
    async with open_page(tmp_path / "profile") as page:
        await page.viewport(1280)
        await page.goto(f"{dashboard}/")
        assert await page.js("document.querySelector('h1').textContent") == "Overview"
        charts = await page.js("document.querySelectorAll('svg.chart[role=img]').length")
        assert charts >= 3
        label = await page.js("document.querySelector('svg.chart').getAttribute('aria-label')")
        assert "by terminal state" in label
        # the overview refreshes in place: a new stamp, the same document
        await page.js("window.__same_document = 1")
        stamp = await page.js("document.getElementById('stamp').textContent")
        await page.wait_for(f"document.getElementById('stamp').textContent !== {stamp!r}")
        assert await page.js("window.__same_document") == 1
        await page.screenshot(SHOTS / "overview.png")

        await page.goto(f"{dashboard}/jobs")
        everything = await rows(page)
        assert len(everything) == 5
        await page.js("document.querySelector('select[name=state]').value = 'failed';"
                      "document.querySelector('form.filters').requestSubmit()")
        await page.wait_for("location.search.includes('state=failed')")
        await page.wait_for("document.readyState === 'complete'")
        only = await rows(page)
        assert [r[0] for r in only] == [str(failed)]
        await page.goto(f"{dashboard}/jobs?error=100%25_used")
        assert [r[0] for r in await rows(page)] == [str(failed)]
        await page.goto(f"{dashboard}/jobs?error=100%25xused")  # _ is not a wildcard
        assert await rows(page) == []

        await page.goto(f"{dashboard}/jobs/{target}")
        assert await page.js("document.querySelectorAll('svg.lanes[role=img]').length") == 1
        link = await page.js("document.querySelector('.facts a').href")
        assert link == "https://replicate.com/p/pred-abc123"
        # without the token: refused, the call unchanged
        await page.js("document.querySelector('button[data-action=force-fail]').click()")
        await page.wait_for("document.getElementById('admin-status').dataset.status")
        assert await page.js("document.getElementById('admin-status').dataset.status") \
            == "403"
        async with pool.connection() as conn:
            before = await load(conn, target)
        assert (before.state, before.version) == (CallState.POLLING, 2)
        # the token, entered once for the session, then the button
        await page.js(f"document.getElementById('admin-token').value = {TOKEN!r};"
                      "document.getElementById('token-form').requestSubmit()")
        await page.js("document.querySelector('button[data-action=force-fail]').click()")
        await page.wait_for("document.getElementById('admin-status').dataset.status === '200'")
        await page.wait_for("document.querySelector('.facts dd:nth-of-type(2)')?"
                            ".textContent === 'cancelled'")
        async with pool.connection() as conn:
            after = await load(conn, target)
        assert (after.terminal, after.settlement) == (True, "refunded")

        for url in (f"{dashboard}/", f"{dashboard}/jobs", f"{dashboard}/jobs/{target}",
                    f"{dashboard}/jobs/{failed}"):
            await no_overflow(page, url)
        await page.viewport(1280)
        await page.goto(f"{dashboard}/jobs/{failed}")  # two actors, a long gap
        assert await page.js("document.querySelectorAll('svg.lanes .lane').length") == 2
        await page.screenshot(SHOTS / "job.png")
        await page.viewport(390)
        await page.goto(f"{dashboard}/")
        await page.screenshot(SHOTS / "overview-phone.png")


async def test_operator_finds_a_job_and_reads_its_timeline_in_chromium(
        db_url: str, dashboard: str, tmp_path: Path) -> None:
    """Without JavaScript (``--dump-dom`` of the server's HTML as rendered): the search
    redirects to the job, whose story and ledger are all there."""
    job = await open_call(db_url, "kie-standard", "task-browser-42")
    async with aiohttp.ClientSession() as http, http.post(
            f"{dashboard}/admin/jobs/{job}/force-fail",
            headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
        assert resp.status == 200

    home = await browse(f"{dashboard}/", tmp_path, "--dump-dom")
    assert "Recent outcomes" in home
    assert str(job) in home  # its cancellation is a recent outcome

    found = await browse(f"{dashboard}/jobs?q={job}", tmp_path, "--dump-dom")
    assert f"Job {job}" in found  # the search redirected to the job's page
    for event in ("CallStarted", "TaskCreated", "Cancelled"):
        assert f"<td>{event}</td>" in found.replace("<wbr>", "")  # wraps between words
    assert "polling -&gt; cancelled" in found
    assert "task-browser-42" in found
    assert "cancelled by admin" in found
    assert "refunded" in found
    assert "<td>1.2 s</td>" in found  # CallStarted to TaskCreated, human-formatted
