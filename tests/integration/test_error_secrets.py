"""Errors keep no secrets (issue 24.10): a host's own HTTP client fails inside a sync call
with its full URL (signature and key in the query string, a user and password in the
authority) and the call's error is recorded redacted and bounded, in ``call_events``, in
``jobs.error_message`` and on the dashboard's job page, read back by SQL and over HTTP."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from callwarden.calls.own import OwnCalls
from callwarden.database.db import Conn, Pool
from callwarden.database.jobs import create_job
from callwarden.providers.storage import LocalFolderStore
from callwarden.rules.redact import MAX_ERROR
from tests.support import serving_app

SECRET = "s3cr3t-KEY-9f8e7d"


@pytest.fixture
async def failing_host_api() -> AsyncIterator[str]:
    """The host's own upstream on 127.0.0.1: every request is a 502."""
    async def fail(_: web.Request) -> web.Response:
        return web.Response(status=502, text="bad gateway")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fail)
    async with serving_app(app) as url:
        yield url


async def recorded_errors(conn: Conn, job: uuid.UUID) -> list[str]:
    row = await (await conn.execute(
        "SELECT j.error_message, (SELECT string_agg(e.payload::text, ' ') FROM "
        "callwarden.call_events e"
        " WHERE e.job_id = j.id) AS events FROM jobs j WHERE j.id = %s", (job,))).fetchone()
    assert row is not None
    return [row["error_message"] or "", row["events"] or ""]


async def test_a_host_http_error_is_recorded_without_its_secrets(
        pool: Pool, conn: Conn, http: aiohttp.ClientSession, failing_host_api: str,
        tmp_path: Path) -> None:
    calls = OwnCalls(pool, media=LocalFolderStore(tmp_path))
    job = await create_job(conn, credits=5)
    base = failing_host_api.replace("http://", f"http://admin:{SECRET}@")
    url = f"{base}/v1/generate?signature={SECRET}&api_key={SECRET}"

    async def the_hosts_call() -> None:
        async with (calls.sync_call(job, "anthropic-sync"),
                    http.post(url, headers={"x-api-key": SECRET}) as resp):
            resp.raise_for_status()

    with pytest.raises(aiohttp.ClientResponseError):
        await the_hosts_call()
    message, events = await recorded_errors(conn, job)
    assert "502" in message
    assert "/v1/generate" in message  # the path stays: it says what failed
    for text in (message, events):
        assert SECRET not in text


async def test_a_huge_exception_message_is_bounded(pool: Pool, conn: Conn,
                                                   tmp_path: Path) -> None:
    calls = OwnCalls(pool, media=LocalFolderStore(tmp_path))
    job = await create_job(conn, credits=5)

    async def the_hosts_call() -> None:
        async with calls.sync_call(job, "anthropic-sync"):
            raise RuntimeError("x" * 200_000)

    with pytest.raises(RuntimeError):
        await the_hosts_call()
    message, events = await recorded_errors(conn, job)
    assert 0 < len(message) <= MAX_ERROR + 100
    assert len(events) < 5_000
    assert "characters cut" in message


@pytest.mark.parametrize("raised", [
    f'provider said {{\\"api_key\\": \\"{SECRET}\\"}}',
    f"request failed, headers=[('xi-api-key', '{SECRET}'), ('accept', '*/*')]",
    "ElevenLabs refused sk_3f9a0c1e2b4d6f8a0c1e2b4d6f8a0c1e2b4d6f8a0c1e2b4d",
])
async def test_secrets_in_escaped_json_tuples_and_elevenlabs_keys_are_not_recorded(
        pool: Pool, conn: Conn, tmp_path: Path, raised: str) -> None:
    """A host's exception whose text carries a key as escaped JSON, as a printed header
    tuple, or as an ElevenLabs ``sk_`` key (issue 40, item 3): neither ``call_events``
    nor ``jobs.error_message`` keeps it."""
    calls = OwnCalls(pool, media=LocalFolderStore(tmp_path))
    job = await create_job(conn, credits=5)

    async def the_hosts_call() -> None:
        async with calls.sync_call(job, "anthropic-sync"):
            raise RuntimeError(raised)

    with pytest.raises(RuntimeError):
        await the_hosts_call()
    message, events = await recorded_errors(conn, job)
    for text in (message, events):
        assert SECRET not in text, text
        assert "3f9a0c1e2b4d6f8a0c1e2b4d" not in text, text
        assert "[redacted]" in text, text
