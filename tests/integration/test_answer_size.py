"""A provider's answer is read within a size limit (issue 24, review of items 4 and 5).

Every provider request asks for ``Accept-Encoding: identity`` and reads the answer in
chunks, up to ``RetryPolicy.max_answer_bytes`` (16 MiB) once inflated: a 256 MiB answer
gzipped to 256 KiB (a decompression bomb; the simulator's ``gzip_bomb`` fault, or a local
server in KIE's shape) is refused as :class:`MalformedResponse` naming the limit, with the
client's memory far below the inflated size. Nothing is lost: a poll answered so is polled
again on the next tick (the call completes and is charged once); a sync call, which has
nothing to poll, fails and is refunded. An answer that is itself the file (ElevenLabs'
text-to-speech audio) may be as large as a media download.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tracemalloc
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp import web

from callwarden.config import provider_settings
from callwarden.database.clock import utcnow
from callwarden.database.db import Conn
from callwarden.errors import ConfigError
from callwarden.providers.base import Endpoint, RetryPolicy
from callwarden.providers.elevenlabs.client import ElevenLabsSyncClient
from callwarden.providers.errors import MalformedResponse
from callwarden.providers.outcomes import Succeeded
from callwarden.providers.simulator.core import Fault, RunningSimulator
from callwarden.providers.transport import send
from callwarden.replay.verify import verify_job
from tests.integration.conftest import MakeReconciler, MakeRunner
from tests.support.calls import NOW_SCRIPT, dead_worker_call, row, upstream_task

MiB = 2**20
LIMIT = 16 * MiB  # RetryPolicy's default max_answer_bytes
BOMB = 256 * MiB  # what the bombs below inflate to
LLM = {"model": "claude-sonnet-4-6", "max_tokens": 16,
       "messages": [{"role": "user", "content": "hi"}]}
KIE_ANSWER = (b'{"code": 200, "msg": "success", "data": {"taskId": "t1", "state": "waiting"}}')
T = TypeVar("T")


def padded_gzip(body: bytes, inflated: int) -> bytes:
    """``body`` behind ``inflated`` bytes of spaces (still JSON), gzipped."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b" " * MiB
    parts = [z.compress(chunk) for _ in range(inflated // MiB)]
    return b"".join([*parts, z.compress(body), z.flush()])


async def peak_memory(work: Callable[[], Awaitable[T]]) -> tuple[T, int]:
    """``work``'s result and the most memory Python held while it ran (tracemalloc)."""
    tracemalloc.start()
    try:
        return await work(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


async def host_job(conn: Conn) -> uuid.UUID:
    job = uuid.uuid4()
    await conn.execute("INSERT INTO jobs (id, user_id, status) VALUES (%s, 'u1', 'pending')",
                       (job,))
    await conn.execute("INSERT INTO usage_logs (job_id, user_id, status, credits_reserved) "
                       "VALUES (%s, 'u1', 'reserved', 10)", (job,))
    return job


async def test_a_gzip_bomb_poll_answer_is_refused_within_the_limit_and_polled_again(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler) -> None:
    """The reconciler polls a KIE task whose answer is 256 MiB once inflated: the poll is
    an error naming the limit (an attempt, the reservation untouched), the reconciler's
    memory stays far below the inflated size, and the next pass completes the call."""
    kind = "kie-standard"
    job = await dead_worker_call(conn, kind, await upstream_task(http, sim, kind, NOW_SCRIPT),
                                 age=timedelta(minutes=11))
    sim.sim.faults.arm("kie", "poll", Fault(kind="gzip_bomb", inflated_bytes=BOMB))
    reconciler = make_reconciler()
    t = utcnow()
    first, peak = await peak_memory(lambda: reconciler.reconcile_once(t))
    assert (first.errors, first.completed) == (1, 0)
    r = await row(conn, job)
    assert (r["call_state"], r["credits"], r["reconcile_attempts"]) == (
        "polling", "reserved", 1)
    assert f"more than {LIMIT} bytes" in r["reconcile_last_error"]
    assert peak < 64 * MiB, f"peak {peak / MiB:.0f} MiB while polling"
    later = t + timedelta(seconds=reconciler.config.repoll_interval_s + 1)
    assert (await reconciler.reconcile_once(later)).completed == 1
    r = await row(conn, job)
    assert (r["status"], r["credits"], r["credits_charged"]) == ("completed", "committed", 10)
    assert await verify_job(conn, job) == []
    polls = sim.sim.journal.entries("kie", "poll")
    assert [e.fault for e in polls] == ["gzip_bomb", None]
    assert [e.headers.get("accept-encoding") for e in polls] == ["identity", "identity"]


async def test_a_gzip_bomb_sync_answer_fails_and_refunds_naming_the_limit(
        conn: Conn, sim: RunningSimulator, make_runner: MakeRunner) -> None:
    """An Anthropic answer (valid JSON behind 256 MiB of spaces, gzipped): a sync call has
    nothing to poll again, so it fails and is refunded, saying why; never charged."""
    sim.sim.faults.arm("anthropic", "call", Fault(kind="gzip_bomb", inflated_bytes=BOMB))
    job = await host_job(conn)
    out, peak = await peak_memory(lambda: make_runner().run(job, "anthropic-sync", LLM))
    assert out.result == "failed", out
    got = await (await conn.execute(
        "SELECT j.status, j.error_message, u.status AS credits, u.credits_charged "
        "FROM jobs j JOIN usage_logs u ON u.job_id = j.id WHERE j.id = %s",
        (job,))).fetchone()
    assert got is not None
    assert (got["status"], got["credits"], got["credits_charged"]) == ("failed", "refunded", 0)
    assert f"more than {LIMIT} bytes" in got["error_message"]
    assert peak < 64 * MiB, f"peak {peak / MiB:.0f} MiB during the call"
    [call] = sim.sim.journal.entries("anthropic", "call")
    assert (call.fault, call.headers.get("accept-encoding")) == ("gzip_bomb", "identity")
    assert await verify_job(conn, job) == []


Route = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def provider(route: Route) -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """A local server answering every request with ``route``: its URL and the headers
    (lower-cased) of what it received."""
    seen: list[dict[str, str]] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append({k.lower(): v for k, v in request.headers.items()})
        return await route(request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", seen
    finally:
        await runner.cleanup()


def accept(_raw: Any) -> None:
    return None


async def test_the_transport_reads_a_gzip_bomb_only_up_to_the_limit(
        http: aiohttp.ClientSession) -> None:
    """KIE's poll answer behind 256 MiB of spaces, gzipped to ~256 KiB, sent whatever the
    request accepts: one request, refused once 16 MiB are inflated, memory bounded."""
    bomb = padded_gzip(KIE_ANSWER, BOMB)

    async def answer(_: web.Request) -> web.Response:
        return web.Response(body=bomb, headers={"Content-Encoding": "gzip",
                                                "Content-Type": "application/json"})

    async with provider(answer) as (url, seen):
        async def poll() -> BaseException | None:
            try:
                await send(http, "GET", f"{url}/api/v1/jobs/recordInfo?taskId=t1",
                           provider="kie", classify=accept, headers={"accept": "*/*"})
            except MalformedResponse as exc:
                return exc
            return None

        err, peak = await peak_memory(poll)
    assert isinstance(err, MalformedResponse)
    assert f"more than {LIMIT} bytes" in str(err)
    assert "taskId" not in str(err)  # the URL is shown without its query
    assert peak < 64 * MiB, f"peak {peak / MiB:.0f} MiB"
    assert len(seen) == 1  # a malformed answer is not retried at once
    assert seen[0]["accept-encoding"] == "identity"


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_the_limit_is_the_policys_and_an_answer_at_it_is_read(
        http: aiohttp.ClientSession, chunked: bool) -> None:
    """``RetryPolicy(max_answer_bytes=N)``: N bytes are read, N + 1 refused (a declared
    ``Content-Length`` before any byte is read), with or without a length."""
    async def answer(request: web.Request) -> web.StreamResponse:
        size = int(request.query["size"])
        if not chunked:
            return web.Response(body=b" " * size, content_type="application/json")
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for _ in range(size // 100):
            await resp.write(b" " * 100)
        await resp.write(b" " * (size % 100))
        await resp.write_eof()
        return resp

    policy = RetryPolicy(max_answer_bytes=1000)
    async with provider(answer) as (url, _):
        raw = await send(http, "GET", f"{url}/x?size=1000", provider="kie", classify=accept,
                         policy=policy)
        assert len(raw.body) == 1000
        with pytest.raises(MalformedResponse, match="more than 1000 bytes") as caught:
            await send(http, "GET", f"{url}/x?size=1001", provider="kie", classify=accept,
                       policy=policy)
        assert ("Content-Length 1001" in str(caught.value)) is not chunked


async def test_a_text_to_speech_answer_is_a_file_and_may_exceed_the_json_limit(
        http: aiohttp.ClientSession) -> None:
    """ElevenLabs' TTS answer is the audio itself: 20 MiB (over the 16 MiB limit of an
    answer to parse) is read whole; the media limit is the one that applies to it."""
    audio = b"ID3\x04\x00" + bytes(20 * MiB)

    async def tts(_: web.Request) -> web.Response:
        return web.Response(body=audio, content_type="audio/mpeg",
                            headers={"character-cost": "5", "request-id": "r1"})

    async with provider(tts) as (url, seen):
        client = ElevenLabsSyncClient(http, Endpoint(base_url=url, api_key="k"),
                                      "elevenlabs-sync")
        out = await client.call({"operation": "tts", "voice_id": "v1", "text": "hello"})
    assert isinstance(out, Succeeded)
    assert [len(b.data) for b in out.blobs] == [len(audio)]
    assert seen[0]["accept-encoding"] == "identity"



async def test_the_limit_is_read_from_the_environment(db_url: str) -> None:
    """``CALLWARDEN_PROVIDER_MAX_ANSWER_BYTES`` sets it for the actors; a bad value stops
    a ``callwarden worker`` before it starts, naming the variable."""
    var = "CALLWARDEN_PROVIDER_MAX_ANSWER_BYTES"
    assert provider_settings({}).retry.max_answer_bytes == LIMIT
    assert provider_settings({var: "1000"}).retry.max_answer_bytes == 1000
    for bad in ("0", "-1", "16MiB"):
        with pytest.raises(ConfigError, match=var):
            provider_settings({var: bad})
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLWARDEN_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "callwarden.cli", "worker", env={
            **env, "DATABASE_URL": db_url, var: "16MiB"}, cwd=Path(__file__).parents[2],
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 2, err
    assert f"{var}: a number of bytes >= 1, got '16MiB'" in err.decode(), err
