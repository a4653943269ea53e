"""Provider keys go only to the provider (issue 24, item 7), end to end: a worker's real
``CallRunner`` against the simulator, whose route answers a redirect (a simulator fault,
armed over its control API) to a server on another port of 127.0.0.1 — another origin —
that records every request it gets. Every provider's credential header is covered:
``Authorization`` (KIE, Replicate), ``xi-api-key`` (ElevenLabs), ``x-api-key``
(Anthropic), on polls and on sync calls.

- No request that carries a credential follows a redirect: the other origin receives
  nothing, and the caller gets a typed error naming the refused redirect (a poll is
  retried on the next tick, so the call still completes; a sync call fails and refunds).
- Media downloads send the ElevenLabs key only to its configured API endpoint, never to
  another host media may be fetched from (a media endpoint, an allow-listed CDN).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from callwarden.calls.finalize import Finalizer
from callwarden.database.db import Conn, Pool
from callwarden.database.write import append, load
from callwarden.events.types import CallStarted, UpstreamResult, UpstreamSucceeded
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from tests.integration.conftest import MakeRunner
from tests.support.rows import host_job, seen_by_host

AUDIO = b"ID3\x04\x00" + bytes(range(200))
CREDENTIAL = {"kie": "authorization", "replicate": "authorization",
              "elevenlabs": "xi-api-key", "anthropic": "x-api-key"}
LLM = {"model": "claude-sonnet-4-6", "max_tokens": 16,
       "messages": [{"role": "user", "content": "hi"}]}
ASYNC = {"steps": [{"phase": "running", "polls": 1}], "end": "succeeded"}


@dataclass
class Elsewhere:
    """A server on another origin than the provider: what reached it, headers lower-cased."""

    url: str
    seen: list[dict[str, str]]


@pytest.fixture
async def elsewhere() -> AsyncIterator[Elsewhere]:
    seen: list[dict[str, str]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append({k.lower(): v for k, v in request.headers.items()})
        if request.path.endswith(".mp3"):
            return web.Response(body=AUDIO, content_type="audio/mpeg")
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield Elsewhere(url=f"http://127.0.0.1:{runner.addresses[0][1]}", seen=seen)
    finally:
        await runner.cleanup()


async def arm_redirect(http: aiohttp.ClientSession, sim: RunningSimulator, provider: str,
                       route: str, location: str) -> None:
    fault = {"kind": "redirect", "status": 307, "location": location}
    async with http.post(f"{sim.base_url}/_sim/faults", json={
            "provider": provider, "route": route, "fault": fault}) as resp:
        assert resp.status == 200, await resp.text()


@pytest.mark.parametrize(("kind", "provider", "route", "request_", "operation", "ends"), [
    ("kie-standard", "kie", "poll",
     {"model": "nano-banana-pro", "input": {"prompt": "x", "_sim": ASYNC}}, None,
     "completed"),
    ("replicate-prediction", "replicate", "poll",
     {"version": "owner/model", "input": {"prompt": "x", "_sim": ASYNC}}, None, "completed"),
    ("elevenlabs-async", "elevenlabs", "poll",
     {"file": b"\x00\x00\x00\x18ftypmp42video", "target_lang": "es", "name": "clip",
      "_sim": ASYNC}, None, "completed"),
    ("elevenlabs-sync", "elevenlabs", "tts",
     {"operation": "tts", "voice_id": "v1", "text": "hello"}, "tts", "failed"),
    ("anthropic-sync", "anthropic", "call", LLM, None, "failed"),
    ("kie-llm", "kie", "call", LLM, None, "failed"),
], ids=["kie-poll", "replicate-poll", "elevenlabs-poll", "elevenlabs-tts", "anthropic",
        "kie-llm"])
async def test_no_request_carrying_a_key_follows_a_redirect_to_another_origin(
        conn: Conn, make_runner: MakeRunner, sim: RunningSimulator,
        http: aiohttp.ClientSession, elsewhere: Elsewhere, kind: str, provider: str,
        route: str, request_: dict[str, Any], operation: str | None, ends: str) -> None:
    await arm_redirect(http, sim, provider, route, f"{elsewhere.url}/stolen")
    job = await host_job(conn)
    out = await make_runner().run(job, kind, request_, operation=operation)
    redirected = [e for e in sim.sim.journal.entries(provider, route) if e.fault]
    assert [e.headers.get(CREDENTIAL[provider]) for e in redirected] == [
        "sim-key" if provider in ("elevenlabs", "anthropic") else "Bearer sim-key"]
    assert elsewhere.seen == []  # not followed: nothing, and no key, reached the other origin
    assert out.result == ends, out
    row = await seen_by_host(conn, job)
    if ends == "failed":  # a sync call has nothing to recover: failed, refunded, said why
        assert row["credits"] == "refunded"
        assert "redirect" in (row["error_message"] or "")
    else:  # the next poll answered: nothing was lost
        assert row["credits"] == "committed"


async def test_the_elevenlabs_key_goes_to_its_api_endpoint_only_never_to_a_media_host(
        conn: Conn, pool: Pool, sim: RunningSimulator, elsewhere: Elsewhere,
        tmp_path: Path) -> None:
    """A host media may come from (here a configured media endpoint; equally an
    allow-listed CDN) is not where the API key belongs: the file is fetched without it."""
    settings = msgspec.structs.replace(sim.settings, elevenlabs=msgspec.structs.replace(
        sim.settings.elevenlabs, media_base_url=elsewhere.url))
    job = await host_job(conn)
    p = (await append(conn, job, await load(conn, job), CallStarted(
        at=datetime.now(UTC), actor="worker:test", kind="elevenlabs-async"))).projection
    result = UpstreamResult(media_urls=(f"{elsewhere.url}/v1/dubbing/d1/audio/es.mp3",))
    await append(conn, job, p, UpstreamSucceeded(at=datetime.now(UTC), actor="worker:test",
                                                 result=result))
    done = await Finalizer(pool, LocalFolderStore(tmp_path), settings,
                           owner="worker:test").finalize(job)
    assert done.outcome == "completed", done
    assert len(elsewhere.seen) == 1
    assert "xi-api-key" not in elsewhere.seen[0]
    assert (await seen_by_host(conn, job))["assets"] == 1
