"""Bulk admin actions in a real headless Chromium (issue 41, item 3): on the call list an
operator selects two rows (1,400 px) or every call matching a filter (800 px), is offered
only the actions legal for the selection, reads a confirmation that states how many calls
and how many credits the action moves (the server's preview), confirms, and sees the rows'
states change — each call cancelled by admin through the log and refunded once, the calls
outside the selection untouched. Without the token nothing is previewed or changed, and
the page never scrolls sideways.

The calls are written through the real write path (``create_job``, ``append``).
Screenshots of each confirmation go where the dashboard's browser test puts its own,
``docs/screenshots/`` (git-ignored; docs/operations.md shows them): ``bulk-1400.png`` and
``bulk-800.png``, copied to ``/tmp/cw-screens/``.
Chromium is required (the test fails with how to install it, never skips).
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from callwarden.database.db import Pool, connect, open_pool
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load
from callwarden.events.states import CallState
from callwarden.events.types import CallStarted, TaskCreated, UpstreamFailed
from callwarden.service.app import ServiceConfig
from tests.browser import Page, open_page
from tests.service import running_service

TOKEN = "bulk-browser-token"
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
SCREENS = Path("/tmp/cw-screens")
NO_OVERFLOW = "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
OFFERED = ("[...document.querySelectorAll('button[data-bulk]')].filter(b => !b.hidden)"
           ".map(b => b.dataset.bulk)")
DIALOG_OPEN = "document.getElementById('bulk-confirm').open"
QUESTION = "document.getElementById('bulk-question').textContent"
WATCH_CSP = ("window.__csp = []; document.addEventListener('securitypolicyviolation', "
             "e => window.__csp.push(e.violatedDirective))")


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[Pool]:
    async with open_pool(db_url, max_size=4) as p:
        yield p


async def call(db_url: str, kind: str, credits: int, *, age_s: float,
               failed: bool = False) -> uuid.UUID:
    """A call started ``age_s`` ago and polling (or failed), ``credits`` reserved."""
    async with await connect(db_url) as conn:
        job = await create_job(conn, credits=credits)
        at = datetime.now(UTC) - timedelta(seconds=age_s)
        p = (await append(conn, job, await load(conn, job), CallStarted(
            at=at, actor="worker:w1", kind=kind))).projection
        p = (await append(conn, job, p, TaskCreated(at=at + timedelta(seconds=1),
                                                    actor="worker:w1",
                                                    task_id=f"t-{job}"))).projection
        if failed:
            await append(conn, job, p, UpstreamFailed(at=at + timedelta(seconds=5),
                                                      actor="worker:w1", error="boom"))
    return job


def state_of(job: uuid.UUID) -> str:
    """The state cell of ``job``'s row (cells: checkbox, job, kind, state, ...)."""
    return (f"document.querySelector('input.pick-row[value=\"{job}\"]')"
            ".closest('tr').cells[3].textContent")


async def pick(page: Page, *jobs: uuid.UUID) -> None:
    for job in jobs:
        await page.js(f"document.querySelector('input.pick-row[value=\"{job}\"]').click()")


def _copy(name: str) -> None:
    SCREENS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SHOTS / name, SCREENS / name)


async def shot(page: Page, name: str) -> None:
    """A screenshot in ``docs/screenshots/``, and its copy in ``/tmp/cw-screens/``."""
    await page.screenshot(SHOTS / name)
    await asyncio.to_thread(_copy, name)


async def confirm_shows(page: Page, action: str) -> str:
    """Click the bulk button of ``action``; the confirmation's sentence once it opens."""
    await page.js(f"document.querySelector('button[data-bulk={action}]').click()")
    await page.wait_for(DIALOG_OPEN)
    return str(await page.js(QUESTION))


async def test_an_operator_force_fails_a_selection_and_a_filter_in_chromium(
        db_url: str, pool: Pool, tmp_path: Path) -> None:
    a = await call(db_url, "kie-standard", 4, age_s=50)
    b = await call(db_url, "kie-standard", 6, age_s=40)
    c = await call(db_url, "replicate-prediction", 3, age_s=30)
    d = await call(db_url, "replicate-prediction", 5, age_s=20)
    failed = await call(db_url, "kie-veo", 2, age_s=60, failed=True)
    async with running_service(pool, tmp_path / "media",
                               ServiceConfig(admin_token=TOKEN)) as urls, \
            open_page(tmp_path / "profile") as page:
        jobs = f"{urls.operator}/jobs"
        await page.viewport(1400)
        await page.goto(jobs)
        await page.js(WATCH_CSP)
        assert await page.js("document.getElementById('bulk').hidden") is False
        assert await page.js("document.querySelectorAll('script').length") == 1
        assert await page.js(OFFERED) == []  # nothing selected, nothing offered
        await pick(page, failed)
        assert await page.js(OFFERED) == []  # a call that ended: no action is legal
        await pick(page, failed)
        # without the token: the preview is refused, nothing changes
        await pick(page, a)
        await page.js("document.querySelector('button[data-bulk=force-fail]').click()")
        await page.wait_for("document.getElementById('bulk-status').textContent"
                            ".includes('HTTP 403')")
        assert await page.js(DIALOG_OPEN) is False
        await page.js(f"document.getElementById('admin-token').value = {TOKEN!r};"
                      "document.getElementById('token-form').requestSubmit()")

        # 1,400 px: two rows selected
        await pick(page, b)
        assert await page.js("document.getElementById('bulk-count').textContent") \
            == "2 selected"
        assert await page.js(OFFERED) == ["force-fail", "requeue-reconcile"]
        assert await confirm_shows(page, "force-fail") == (
            "2 calls, 10 credits: cancel them (by admin) and refund the 10 credits still "
            "reserved.")
        assert await page.js(NO_OVERFLOW)
        await shot(page, "bulk-1400.png")
        assert await page.js("window.__csp") == []  # the script, the dialog: no violation
        await page.js("document.getElementById('bulk-go').click()")
        await page.wait_for(f"{state_of(a)} === 'cancelled' && {state_of(b)} === 'cancelled'")
        assert await page.js(state_of(c)) == "polling"

        # 800 px: every call matching a filter (the two Replicate calls)
        await page.viewport(800)
        await page.goto(f"{jobs}?kind=replicate-prediction&state=polling")
        await page.js(WATCH_CSP)
        await page.js("document.getElementById('pick-all').click()")
        await page.wait_for(f"{OFFERED}.length === 2")
        assert "Force-fail (cancel, refund): 2" in await page.js(
            "document.getElementById('bulk-status').textContent")
        assert await confirm_shows(page, "force-fail") == (
            "2 calls, 8 credits: cancel them (by admin) and refund the 8 credits still "
            "reserved.")
        assert await page.js(NO_OVERFLOW)
        await shot(page, "bulk-800.png")
        assert await page.js("window.__csp") == []
        await page.js("document.getElementById('bulk-go').click()")
        await page.wait_for("document.getElementById('bulk-status').dataset.done === '2'")
        assert "2 applied, 0 skipped, 8 credits refunded" in await page.js(
            "document.getElementById('bulk-status').textContent")
        await page.goto(jobs)  # the filtered list (state=polling) no longer shows them
        assert await page.js(f"{state_of(c)} + {state_of(d)}") == "cancelledcancelled"
        assert await page.js(state_of(a)) == "cancelled"
        assert await page.js(NO_OVERFLOW)

    async with pool.connection() as conn:
        for job in (a, b, c, d):
            after = await load(conn, job)
            assert (after.state, after.settlement) == (CallState.CANCELLED, "refunded")
            rows = await (await conn.execute(
                "SELECT status, settled_by_seq FROM usage_logs WHERE job_id = %s",
                (job,))).fetchall()
            assert [(r["status"], r["settled_by_seq"]) for r in rows] == [("refunded", 3)]
        assert (await load(conn, failed)).state == CallState.FAILED
