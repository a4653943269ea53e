"""The operator dashboard in a real headless Chromium (Debian's ``chromium``): open it,
search a job by id, open its timeline, take a screenshot; assert on what the DOM shows.

Chromium is required: if it is missing the test FAILS with how to install it (never a
silent skip). ``.ci/run`` installs it (``apt-get install -y chromium``); run as root on a
Debian machine without it, the test installs it itself.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest

from engine.service.app import ServiceConfig
from engine.store.db import connect, open_pool
from engine.store.jobs import create_job
from engine.store.write import append, load
from events.types import CallStarted, TaskCreated
from tests.debian import binary
from tests.service import running_service

TOKEN = "browser-test-token"


def chromium() -> str:
    found = binary(("chromium", "chromium-browser"), "chromium")
    if found is None:
        pytest.fail("headless Chromium is required for the dashboard acceptance test: "
                    "install Debian's package with `apt-get update && apt-get install -y "
                    "chromium` (.ci/run does this)")
    return found


async def browse(url: str, tmp_path: Path, *extra: str) -> str:
    """Run Chromium headless on ``url`` with ``extra`` flags; its stdout (the DOM for
    ``--dump-dom``)."""
    profile = tmp_path / f"profile-{uuid.uuid4().hex[:8]}"
    proc = await asyncio.create_subprocess_exec(
        chromium(), "--headless", "--no-sandbox", "--disable-gpu",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--no-first-run", "--disable-dev-shm-usage", f"--user-data-dir={profile}", *extra,
        url, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return out.decode()


@pytest.fixture
async def dashboard(db_url: str, tmp_path: Path) -> AsyncIterator[str]:
    async with open_pool(db_url, max_size=4) as pool, running_service(
            pool, tmp_path / "media", ServiceConfig(admin_token=TOKEN)) as url:
        yield url


async def cancelled_call(db_url: str, base: str) -> uuid.UUID:
    """A kie-standard call with a task, force-failed by an operator through the API."""
    async with await connect(db_url) as conn:
        job = await create_job(conn, credits=4)
        now = datetime.now(UTC)
        p = (await append(conn, job, await load(conn, job), CallStarted(
            at=now, actor="worker:browser", kind="kie-standard"))).projection
        await append(conn, job, p, TaskCreated(at=now, actor="worker:browser",
                                               task_id="task-browser-42"))
    async with aiohttp.ClientSession() as http, http.post(
            f"{base}/admin/jobs/{job}/force-fail",
            headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
        assert resp.status == 200
    return job


async def test_operator_finds_a_job_and_reads_its_timeline_in_chromium(
        db_url: str, dashboard: str, tmp_path: Path) -> None:
    job = await cancelled_call(db_url, dashboard)

    home = await browse(f"{dashboard}/", tmp_path, "--dump-dom")
    assert "Recent outcomes" in home
    assert str(job) in home  # its cancellation is a recent outcome

    found = await browse(f"{dashboard}/jobs?q={job}", tmp_path, "--dump-dom")
    assert f"Job {job}" in found  # the search redirected to the job's page
    for event in ("CallStarted", "TaskCreated", "Cancelled"):
        assert f"<td>{event}</td>" in found
    assert "polling -&gt; cancelled" in found
    assert "task-browser-42" in found
    assert "cancelled by admin" in found
    assert "refunded" in found

    shot = tmp_path / "job.png"
    await browse(f"{dashboard}/jobs/{job}", tmp_path, f"--screenshot={shot}",
                 "--window-size=1280,900")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 5000
