"""Issue 16 item 5: docs/examples/ai_writer_app.py run as a real process against the test's
database and the provider simulator over HTTP — its sync and streaming routes complete and
commit by usage; a server SIGKILLed mid-stream leaves the call to one reconcile pass, which
sweeps it and refunds it exactly once; a client that leaves mid-stream is failed and
refunded (``stream_closed``) while the server carries on.

The simulator writes a whole SSE answer at once (a script can only delay it as a whole,
``hang_s``), so "mid-stream" is made by :class:`HeldStream`: a relay between the app and the
simulator's KIE Claude route that forwards the simulator's answer event by event and holds
after the first until the test releases it. Every row is checked with SQL; every
reservation move is counted by a trigger."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from callwarden.database.clock import utcnow
from callwarden.database.db import Conn, open_pool
from callwarden.providers.simulator.core import RunningSimulator, Script
from callwarden.providers.storage import LocalFolderStore
from callwarden.reconciler.config import ReconcileConfig
from callwarden.reconciler.loop import Reconciler
from callwarden.replay.verify import verify_job
from tests.acceptance.conftest import KEY_VARS, ROOT
from tests.support import no_sleep

EXAMPLE = ROOT / "docs" / "examples" / "ai_writer_app.py"
RESERVE = Decimal(10)  # the example's RESERVE
PER_TOKEN = {"input_tokens": 0.01, "output_tokens": 0.02}  # its anthropic-sync rates
PER_KIE_CREDIT = 100  # its kie-llm rate
DEADLINE_S = 30.0

AUDIT_SQL = """
CREATE TABLE usage_audit (job_id uuid, old_status text, new_status text);
CREATE FUNCTION usage_audit_fn() RETURNS trigger AS $$
BEGIN
    INSERT INTO usage_audit VALUES (NEW.job_id, OLD.status, NEW.status);
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER usage_audit_trg AFTER UPDATE ON usage_logs
    FOR EACH ROW EXECUTE FUNCTION usage_audit_fn();
"""


class App:
    """One ``python docs/examples/ai_writer_app.py --port 0`` process."""

    def __init__(self, proc: asyncio.subprocess.Process, url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    def logs(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


class Apps:
    def __init__(self, db_url: str, sim: RunningSimulator, tmp_path: Path) -> None:
        self.db_url, self.sim, self.tmp_path = db_url, sim, tmp_path
        self.started: list[App] = []

    async def start(self, kie_url: str | None = None) -> App:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CALLWARDEN_", "AWS_")) and k not in KEY_VARS}
        env.update({"DATABASE_URL": self.db_url,
                    "CALLWARDEN_ANTHROPIC_URL": self.sim.url("anthropic"),
                    "CALLWARDEN_KIE_URL": kie_url or self.sim.url("kie"),
                    "ANTHROPIC_API_KEY": self.sim.sim.api_key,
                    "KIE_API_KEY": self.sim.sim.api_key})
        log = self.tmp_path / f"app-{len(self.started) + 1}.log"
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(EXAMPLE), "--port", "0", env=env, cwd=ROOT,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=err)
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), DEADLINE_S)
        except TimeoutError:
            line = b""
        assert line.startswith(b"listening on http://"), log.read_text()
        app = App(proc, line.decode().split()[-1], log)
        self.started.append(app)
        return app

    async def kill_leftovers(self) -> None:
        for app in self.started:
            if app.proc.returncode is None:
                app.proc.kill()
                await app.proc.wait()


@pytest.fixture
async def apps(db_url: str, conn: Conn, sim: RunningSimulator,
               tmp_path: Path) -> AsyncIterator[Apps]:
    await conn.execute(AUDIT_SQL)
    started = Apps(db_url, sim, tmp_path)
    try:
        yield started
    finally:
        await started.kill_leftovers()


class HeldStream:
    """The simulator's KIE ``/claude/v1/messages`` behind a relay that forwards its SSE
    answer line by line and, after the first event, waits for :attr:`release`."""

    def __init__(self, sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
        self.sim, self.http = sim, http
        self.first_sent, self.release = asyncio.Event(), asyncio.Event()
        self.url = ""

    async def relay(self, request: web.Request) -> web.StreamResponse:
        async with self.http.post(self.sim.url("kie", request.path), data=await request.read(),
                                  headers={"Authorization": request.headers["Authorization"],
                                           "Content-Type": "application/json"}) as up:
            resp = web.StreamResponse(status=up.status,
                                      headers={"Content-Type": up.headers["Content-Type"]})
            await resp.prepare(request)
            try:
                async for line in up.content:
                    await resp.write(line)
                    if line.strip() == b"" and not self.first_sent.is_set():
                        self.first_sent.set()  # one whole event is out
                        await self.release.wait()
                await resp.write_eof()
            except ConnectionResetError:  # the app died or left
                pass
        return resp


@pytest.fixture
async def held(sim: RunningSimulator) -> AsyncIterator[HeldStream]:
    async with aiohttp.ClientSession() as http:
        h = HeldStream(sim, http)
        app = web.Application()
        app.router.add_post("/claude/v1/messages", h.relay)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        h.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            yield h
        finally:
            h.release.set()
            await runner.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=DEADLINE_S)) as s:
        yield s


async def events(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, Any]]:
    """The app's SSE events, as the browser's EventSource would see them."""
    event = ""
    async for raw in resp.content:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            yield event, json.loads(line[6:])


async def facts(conn: Conn, job: uuid.UUID) -> dict[str, Any]:
    row = await (await conn.execute(
        "SELECT j.status, j.call_state, j.call_sync, j.provider_kind, j.error_message, "
        "j.output_data->>'text' AS text, "
        "(SELECT array_agg(e.type ORDER BY e.seq) FROM callwarden.call_events e WHERE e.job_id "
        "= j.id)"
        " AS types, "
        "(SELECT count(*) FROM usage_logs u WHERE u.job_id = j.id) AS reservations, "
        "(SELECT string_agg(u.status, ',') FROM usage_logs u WHERE u.job_id = j.id)"
        " AS credits, "
        "(SELECT sum(u.credits_charged) FROM usage_logs u WHERE u.job_id = j.id) AS charged, "
        "(SELECT array_agg(a.old_status || '>' || a.new_status) FROM usage_audit a "
        " WHERE a.job_id = j.id) AS moves "
        "FROM jobs j WHERE j.id = %s", (job,))).fetchone()
    assert row is not None
    return dict(row)


async def until(what: str, check: Callable[[], Awaitable[bool]]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def replayed_usage(http: aiohttp.ClientSession, sim: RunningSimulator) -> dict[str, int]:
    """The usage the simulator gives the app's own request, asked again by the test."""
    [entry] = sim.sim.journal.entries("anthropic", "call")
    async with http.post(sim.url("anthropic", "/v1/messages"), data=entry.body, headers={
            "x-api-key": sim.sim.api_key, "anthropic-version": "2023-06-01",
            "content-type": "application/json"}) as resp:
        usage = (await resp.json())["usage"]
    return {k: int(usage[k]) for k in PER_TOKEN}


async def post_sync(http: aiohttp.ClientSession, app: App, prompt: str) -> dict[str, Any]:
    async with http.post(f"{app.url}/ai-writer",
                         json={"user_id": "u-1", "prompt": prompt}) as resp:
        assert resp.status == 200, app.logs()
        return dict(await resp.json())


async def test_the_sync_route_completes_and_commits_by_usage(
        apps: Apps, conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator) -> None:
    app = await apps.start()
    body = await post_sync(http, app, "a haiku about retries")
    assert body["result"] == "completed"
    job = uuid.UUID(body["job_id"])
    usage = await replayed_usage(http, sim)
    charged = Decimal(str(round(sum(usage[k] * rate for k, rate in PER_TOKEN.items()), 6)))
    assert 0 < charged < RESERVE  # charged by usage, below the reservation
    f = await facts(conn, job)
    assert (f["status"], f["provider_kind"], f["call_sync"], f["text"]) == (
        "completed", "anthropic-sync", True, body["text"])
    assert f["types"] == ["CallStarted", "UpstreamSucceeded", "FinalizeClaimed", "Completed"]
    assert (f["reservations"], f["credits"], f["charged"], f["moves"]) == (
        1, "committed", charged, ["reserved>committed"])
    assert await verify_job(conn, job) == []


async def test_the_streaming_route_streams_chunks_and_completes(
        apps: Apps, conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator) -> None:
    sim.sim.queue_script("kie", Script(cost=0.05))  # the stream reports 0.05 KIE credits
    app = await apps.start()
    async with http.post(f"{app.url}/ai-writer/stream",
                         json={"user_id": "u-1", "prompt": "a poem"}) as resp:
        assert (resp.status, resp.content_type) == (200, "text/event-stream"), app.logs()
        got = [e async for e in events(resp)]
    assert [name for name, _ in got] == [
        "job", "message_start", "content_block_start", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop"]
    job = uuid.UUID(got[0][1]["job_id"])
    f = await facts(conn, job)
    assert (f["status"], f["provider_kind"], f["text"]) == (
        "completed", "kie-llm", got[3][1]["delta"]["text"])
    assert f["types"] == ["CallStarted", "UpstreamSucceeded", "FinalizeClaimed", "Completed"]
    assert (f["reservations"], f["credits"], f["charged"], f["moves"]) == (
        1, "committed", Decimal("0.05") * PER_KIE_CREDIT, ["reserved>committed"])
    assert await verify_job(conn, job) == []


async def test_a_server_killed_mid_stream_is_swept_and_refunded_once(
        apps: Apps, conn: Conn, db_url: str, http: aiohttp.ClientSession,
        sim: RunningSimulator, held: HeldStream, tmp_path: Path) -> None:
    app = await apps.start(kie_url=held.url)
    seen: list[str] = []
    async with http.post(f"{app.url}/ai-writer/stream",
                         json={"user_id": "u-1", "prompt": "a long essay"}) as resp:
        async for name, data in events(resp):
            seen.append(name)
            if name == "job":
                job = uuid.UUID(data["job_id"])
            if name == "message_start":  # the LLM's first chunk reached the client
                break
        # ... and the relay holds the second one: the app is inside the call, mid-stream
        await asyncio.wait_for(held.first_sent.wait(), DEADLINE_S)
        app.proc.send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(app.proc.wait(), DEADLINE_S) == -signal.SIGKILL
    held.release.set()
    assert seen == ["job", "message_start"]
    f = await facts(conn, job)
    assert (f["call_state"], f["call_sync"], f["types"], f["credits"], f["moves"]) == (
        "created", True, ["CallStarted"], "reserved", None)

    async with open_pool(db_url, max_size=2) as pool:
        reconciler = Reconciler(pool, http, sim.settings, LocalFolderStore(tmp_path / "m"),
                                sleep=no_sleep)
        assert (await reconciler.reconcile_once()).swept == 0  # now: not stale yet
        past = utcnow() + timedelta(
            seconds=ReconcileConfig().threshold_for("kie-llm") + 60)
        assert (await reconciler.reconcile_once(past)).swept == 1
        swept = await facts(conn, job)
        assert (await reconciler.reconcile_once(past + timedelta(minutes=5))).swept == 0
    assert await facts(conn, job) == swept  # the second pass changed nothing
    assert (swept["status"], swept["call_state"], swept["error_message"]) == (
        "failed", "swept", "reconcile_no_recovery")
    assert swept["types"] == ["CallStarted", "Swept"]
    assert (swept["reservations"], swept["credits"], swept["charged"], swept["moves"]) == (
        1, "refunded", 0, ["reserved>refunded"])
    assert sim.sim.journal.count("kie", "call") == 1
    assert await verify_job(conn, job) == []


async def test_a_client_gone_mid_stream_is_failed_and_refunded_and_the_server_lives(
        apps: Apps, conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        held: HeldStream) -> None:
    app = await apps.start(kie_url=held.url)
    async with http.post(f"{app.url}/ai-writer/stream",
                         json={"user_id": "u-1", "prompt": "a long essay"}) as resp:
        async for name, data in events(resp):
            if name == "job":
                job = uuid.UUID(data["job_id"])
            if name == "message_start":
                break
        await asyncio.wait_for(held.first_sent.wait(), DEADLINE_S)
        resp.close()  # the browser tab is closed
    assert (await facts(conn, job))["call_state"] == "created"
    held.release.set()  # the LLM goes on; the app's next write to the client fails

    async def ended() -> bool:
        return bool((await facts(conn, job))["call_state"] != "created")

    await until("the call to end", ended)
    f = await facts(conn, job)
    assert (f["status"], f["call_state"], f["error_message"]) == (
        "failed", "failed", "the stream was closed before it ended")
    assert f["types"] == ["CallStarted", "UpstreamFailed"]
    assert (f["reservations"], f["credits"], f["charged"], f["moves"]) == (
        1, "refunded", 0, ["reserved>refunded"])
    assert sim.sim.journal.count("kie", "call") == 1
    assert await verify_job(conn, job) == []
    assert app.proc.returncode is None
    after = await post_sync(http, app, "still there?")  # the same process serves on
    assert after["result"] == "completed"
    assert (await facts(conn, uuid.UUID(after["job_id"])))["credits"] == "committed"
    app.proc.send_signal(signal.SIGTERM)  # a deploy: a graceful stop
    assert await asyncio.wait_for(app.proc.wait(), DEADLINE_S) == 0, app.logs()
    assert "Traceback" not in app.logs()
