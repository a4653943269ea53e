"""Bring your own call (callwarden.calls.own, callwarden.calls.own_sync): host code makes the
provider request with its own HTTP client — plain aiohttp, or urllib for the blocking
face — against the simulator's real routes, and records every transition through the
fenced write path. Rows are checked with plain SQL; projections must equal the fold."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import urllib.parse
import urllib.request
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from callwarden import BlockingCalls, CallwardenError, OwnCall, OwnCalls, Rate, RateTable
from callwarden.calls.config import CallConfig
from callwarden.calls.own import Reported
from callwarden.calls.own_sync import SyncCall
from callwarden.database.clock import utcnow
from callwarden.database.db import Conn, Pool
from callwarden.database.jobs import create_job
from callwarden.database.write import append, cancel, load
from callwarden.errors import CallAlreadyStarted, TaskAlreadyClaimed, TaskIdConflict, WrongKind
from callwarden.events.types import CallStarted, TaskCreated, UpstreamResult, UpstreamSucceeded
from callwarden.providers.errors import UnknownProviderKind
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.reconciler.config import ReconcileConfig
from callwarden.replay.verify import verify_job
from tests.integration.conftest import MakeReconciler, MakeRunner
from tests.support.own_kie import KIE_AUTH, KIE_REQ, kie_create, kie_poll

CLAUDE = "claude-sonnet-4-6"
PRICES = RateTable(rates=(
    Rate(kind="anthropic-sync", unit="input_tokens", credits=0.01),
    Rate(kind="anthropic-sync", unit="output_tokens", credits=0.02),
    Rate(kind="kie-llm", unit="provider_credits", credits=100.0)))
MakeOwn = Callable[..., OwnCalls]


@pytest.fixture
def own(pool: Pool, sim: RunningSimulator, tmp_path: Path) -> MakeOwn:
    def make(**kw: Any) -> OwnCalls:
        return OwnCalls(pool, media=LocalFolderStore(tmp_path / "media"),
                        settings=sim.settings, **kw)
    return make


async def facts(conn: Conn, job: uuid.UUID) -> dict[str, Any]:
    row = await (await conn.execute(
        "SELECT j.status, j.call_state, j.call_sync, j.provider_task_id, j.error_message, "
        "j.output_data->>'text' AS text, j.heartbeat_at, j.heartbeat_owner, "
        "(SELECT array_agg(e.type ORDER BY e.seq) FROM callwarden.call_events e WHERE e.job_id "
        "= j.id)"
        " AS types, "
        "(SELECT count(*) FROM usage_logs u WHERE u.job_id = j.id) AS reservations, "
        "(SELECT string_agg(u.status, ',') FROM usage_logs u WHERE u.job_id = j.id) "
        "AS credits, "
        "(SELECT sum(u.credits_charged) FROM usage_logs u WHERE u.job_id = j.id) AS charged, "
        "(SELECT count(*) FROM assets a WHERE a.job_id = j.id) AS assets "
        "FROM jobs j WHERE j.id = %s", (job,))).fetchone()
    assert row is not None
    out = dict(row)
    out["types"] = out["types"] or []
    return out


# -- the host's own provider code ---------------------------------------------------------





async def kie_report(call: OwnCall, data: dict[str, Any] | None) -> Reported:
    """What the host's handler does with its poll's answer."""
    if data is None:
        return await call.not_found("recordInfo is null")
    if data["state"] == "fail":
        return await call.failed(data["failMsg"], code=data["failCode"])
    return await call.succeeded(media_urls=json.loads(data["resultJson"])["resultUrls"])


async def claude(http: aiohttp.ClientSession, sim: RunningSimulator) -> dict[str, Any]:
    async with http.post(sim.url("anthropic", "/v1/messages"), json={
            "model": CLAUDE, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
            headers={"x-api-key": "sim-key", "anthropic-version": "2023-06-01"}) as resp:
        resp.raise_for_status()
        return dict(await resp.json())


async def sse(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[str | None, Any]]:
    event: str | None = None
    async for raw in resp.content:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            yield event, json.loads(line[6:])
            event = None


async def ai_writer_stream(calls: OwnCalls, http: aiohttp.ClientSession,
                           sim: RunningSimulator, job: uuid.UUID) -> AsyncGenerator[bytes, None]:
    """The seed's ai-writer SSE route, the host's way: its own streaming request to KIE's
    Claude proxy; every event is forwarded to the client from inside the context, the
    text and usage recorded when the stream ends."""
    async with calls.sync_call(job, "kie-llm") as call:
        parts: list[str] = []
        stop = None
        async with http.post(sim.url("kie", "/claude/v1/messages"), headers=KIE_AUTH, json={
                "model": CLAUDE, "stream": True,
                "messages": [{"role": "user", "content": "write"}]}) as resp:
            async for event, data in sse(resp):
                if event == "message_start":
                    message = data["message"]
                    call.usage.update(model=message["model"],
                                      provider_credits=message["credits_consumed"],
                                      input_tokens=message["usage"]["input_tokens"])
                elif event == "content_block_delta":
                    parts.append(data["delta"]["text"])
                elif event == "message_delta":
                    call.usage["output_tokens"] = data["usage"]["output_tokens"]
                    stop = data["delta"]["stop_reason"]
                yield f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()
        call.succeeded(text="".join(parts), stop_reason=stop)


# -- async kinds --------------------------------------------------------------------------

async def test_kie_handler_creates_with_its_own_client_and_completes_once(
        conn: Conn, own: MakeOwn, http: aiohttp.ClientSession, sim: RunningSimulator) -> None:
    job = await create_job(conn, credits=10)
    call = await own().start(job, "kie-standard")
    assert (call.action, call.resume_task_id) == ("create", None)
    assert (await facts(conn, job))["types"] == ["CallStarted"]  # before the create
    task_id = await kie_create(http, sim, KIE_REQ)
    created = await call.task_created(task_id)
    assert (created.ok, created.result) == (True, "still_running")
    done = await kie_report(call, await kie_poll(http, sim, task_id))
    assert (done.ok, done.result) == (True, "completed")
    f = await facts(conn, job)
    assert f["types"] == ["CallStarted", "TaskCreated", "UpstreamSucceeded",
                          "FinalizeClaimed", "Completed"]
    assert (f["status"], f["provider_task_id"], f["assets"]) == ("completed", task_id, 1)
    assert (f["reservations"], f["credits"], f["charged"]) == (1, "committed", Decimal(10))
    assert sim.sim.journal.count("kie", "create") == 1
    assert await verify_job(conn, job) == []


async def test_a_redelivery_is_told_to_resume_and_never_creates(
        conn: Conn, own: MakeOwn, http: aiohttp.ClientSession, sim: RunningSimulator) -> None:
    job = await create_job(conn)
    first = await own().start(job, "kie-standard")
    task_id = await kie_create(http, sim, KIE_REQ)
    await first.task_created(task_id)  # ... and the first delivery's process dies
    again = await own().start(job, "kie-standard")  # the queue runs the handler again
    assert (again.action, again.resume_task_id) == ("resume", task_id)
    assert (await kie_report(again, await kie_poll(http, sim, task_id))).result == "completed"
    third = await own().start(job, "kie-standard")
    assert third.action == "done"
    assert third.outcome is not None
    assert (third.outcome.ok, third.outcome.result) == (False, "completed")
    f = await facts(conn, job)
    assert len(f["types"]) == 5
    assert (f["reservations"], f["credits"]) == (1, "committed")
    assert sim.sim.journal.count("kie", "create") == 1
    assert await verify_job(conn, job) == []


async def test_after_task_created_the_runner_polls_the_recorded_task_and_never_creates(
        conn: Conn, own: MakeOwn, make_runner: MakeRunner, http: aiohttp.ClientSession,
        sim: RunningSimulator) -> None:
    job = await create_job(conn)
    call = await own().start(job, "kie-standard")
    await call.task_created(await kie_create(http, sim, KIE_REQ))
    out = await make_runner().run(job, "kie-standard", KIE_REQ)
    assert out.result == "completed"
    assert sim.sim.journal.count("kie", "create") == 1  # the host's only
    assert sim.sim.journal.count("kie", "poll") >= 1  # the runner's
    f = await facts(conn, job)
    assert (f["credits"], f["assets"], f["types"][1]) == ("committed", 1, "TaskCreated")
    assert await verify_job(conn, job) == []


async def test_an_ambiguous_create_is_named_and_left_for_the_reconciler(
        conn: Conn, own: MakeOwn, make_reconciler: MakeReconciler,
        sim: RunningSimulator) -> None:
    job = await create_job(conn)
    assert (await own().start(job, "kie-standard")).action == "create"
    # the create request went out and the process died before its answer came back
    again = await own().start(job, "kie-standard")
    assert (again.action, again.resume_task_id) == ("ambiguous", None)
    recreate = await own(config=CallConfig(ambiguous_create="recreate")).start(
        job, "kie-standard")
    assert recreate.action == "create"  # the opt-in: create again, at the risk of paying twice
    assert (await facts(conn, job))["types"] == ["CallStarted"]
    past = utcnow() + timedelta(seconds=ReconcileConfig().threshold_for("kie-standard") + 60)
    assert (await make_reconciler().reconcile_once(past)).swept == 1
    f = await facts(conn, job)
    assert (f["call_state"], f["credits"], f["charged"]) == ("swept", "refunded", 0)
    assert f["types"] == ["CallStarted", "Swept"]
    assert sim.sim.journal.count("kie", "create") == 0
    assert await verify_job(conn, job) == []


@pytest.mark.parametrize(("script", "result", "error"), [
    ({"steps": [], "end": "failed", "error": "nsfw content"}, "failed", "nsfw content"),
    ({"steps": [], "end": "vanished"}, "swept", "upstream_task_not_found"),
])
async def test_the_hosts_failed_or_vanished_poll_refunds(
        conn: Conn, own: MakeOwn, http: aiohttp.ClientSession, sim: RunningSimulator,
        script: dict[str, Any], result: str, error: str) -> None:
    job = await create_job(conn, credits=4)
    call = await own().start(job, "kie-standard")
    task_id = await kie_create(http, sim, {**KIE_REQ, "input": {"prompt": "x", "_sim": script}})
    await call.task_created(task_id)
    out = await kie_report(call, await kie_poll(http, sim, task_id))
    assert (out.ok, out.result) == (True, result)
    f = await facts(conn, job)
    assert (f["credits"], f["charged"], f["error_message"]) == ("refunded", 0, error)
    assert len(f["types"]) == 3
    assert await verify_job(conn, job) == []


async def test_a_result_recorded_before_a_crash_is_finalized_on_redelivery(
        conn: Conn, own: MakeOwn, sim: RunningSimulator) -> None:
    job = await create_job(conn)
    p = (await append(conn, job, await load(conn, job), CallStarted(
        at=utcnow(), actor="worker:dead", kind="kie-standard"))).projection
    p = (await append(conn, job, p, TaskCreated(at=utcnow(), actor="worker:dead",
                                                task_id="t-1"))).projection
    await append(conn, job, p, UpstreamSucceeded(at=utcnow(), actor="worker:dead",
                                                 result=UpstreamResult(text="ok")))
    call = await own().start(job, "kie-standard")
    assert call.action == "finalize"
    assert (await call.finalize()).result == "completed"
    assert (await facts(conn, job))["credits"] == "committed"
    assert await verify_job(conn, job) == []


# -- bad input ----------------------------------------------------------------------------

async def test_task_ids_that_do_not_fit_are_refused_and_nothing_is_written_twice(
        conn: Conn, own: MakeOwn) -> None:
    job, other = await create_job(conn), await create_job(conn)
    call = await own().start(job, "kie-standard")
    assert (await call.task_created("task-a")).ok
    same = await call.task_created("task-a")
    assert (same.ok, same.result) == (False, "still_running")
    with pytest.raises(TaskIdConflict, match="task-a"):
        await call.task_created("task-b")
    with pytest.raises(TaskIdConflict):
        await (await own().start(job, "kie-standard")).task_created("task-b")
    assert (await facts(conn, job))["types"] == ["CallStarted", "TaskCreated"]
    rival = await own().start(other, "kie-standard")
    with pytest.raises(TaskAlreadyClaimed):  # another job holds that upstream task
        await rival.task_created("task-a")
    assert (await facts(conn, other))["types"] == ["CallStarted"]
    for j in (job, other):
        assert await verify_job(conn, j) == []


async def test_outcomes_reported_on_a_terminal_call_are_ok_false_and_write_nothing(
        conn: Conn, own: MakeOwn, http: aiohttp.ClientSession, sim: RunningSimulator) -> None:
    job = await create_job(conn, credits=10)
    call = await own().start(job, "kie-standard")
    task_id = await kie_create(http, sim, KIE_REQ)
    await call.task_created(task_id)
    await kie_report(call, await kie_poll(http, sim, task_id))
    before = await facts(conn, job)
    late = [await call.succeeded(text="again"), await call.failed("late"),
            await call.not_found(), await call.task_created(task_id)]
    assert {(r.ok, r.result) for r in late} == {(False, "completed")}
    assert await facts(conn, job) == before
    assert (before["reservations"], before["credits"], before["charged"]) == (
        1, "committed", Decimal(10))
    # a cancel that got there first: the host's late success is not recorded, refunded once
    cancelled = await create_job(conn, credits=5)
    racing = await own().start(cancelled, "kie-standard")
    await racing.task_created("task-c")
    await cancel(conn, cancelled, by="user:1", now=utcnow())
    r = await racing.succeeded(text="too late")
    assert (r.ok, r.result) == (False, "cancelled")
    f = await facts(conn, cancelled)
    assert (f["types"][-1], f["reservations"], f["credits"]) == ("Cancelled", 1, "refunded")
    assert await verify_job(conn, cancelled) == []


async def test_the_wrong_kind_and_a_job_the_host_ended_write_nothing(
        conn: Conn, own: MakeOwn) -> None:
    job = await create_job(conn)
    with pytest.raises(WrongKind):
        await own().start(job, "anthropic-sync")
    with pytest.raises(WrongKind):
        async with own().sync_call(job, "kie-standard"):
            pytest.fail("the body must not run")
    with pytest.raises(WrongKind):  # refused when built: before a host reserves credits
        own().sync_call(job, "kie-standard")
    with pytest.raises(UnknownProviderKind):
        own().sync_call(job, "kie-imaginary")
    assert (await facts(conn, job))["types"] == []
    await own().start(job, "kie-standard")
    with pytest.raises(WrongKind):
        await own().start(job, "kie-veo")
    ended = await create_job(conn)
    await conn.execute("UPDATE jobs SET status = 'cancelled' WHERE id = %s", (ended,))
    assert (await own().start(ended, "kie-standard")).action == "not_started"
    assert (await facts(conn, ended))["types"] == []
    assert issubclass(WrongKind, CallwardenError)


# -- sync kinds and streams ----------------------------------------------------------------

async def test_a_sync_call_in_the_context_is_charged_by_its_usage(
        conn: Conn, own: MakeOwn, http: aiohttp.ClientSession, sim: RunningSimulator) -> None:
    job = await create_job(conn, credits=10)
    async with own(pricing=PRICES).sync_call(job, "anthropic-sync") as call:
        assert (await facts(conn, job))["types"] == ["CallStarted"]
        answer = await claude(http, sim)
        usage = answer["usage"]
        call.succeeded(text=answer["content"][0]["text"], stop_reason=answer["stop_reason"],
                       usage={"model": answer["model"], "input_tokens": usage["input_tokens"],
                              "output_tokens": usage["output_tokens"]})
    assert call.outcome is not None
    assert (call.outcome.ok, call.outcome.result) == (True, "completed")
    expected = round(usage["input_tokens"] * 0.01 + usage["output_tokens"] * 0.02, 6)
    assert 0 < expected < 10  # charged by usage, below the reservation
    f = await facts(conn, job)
    assert f["types"] == ["CallStarted", "UpstreamSucceeded", "FinalizeClaimed", "Completed"]
    assert (f["call_sync"], f["text"]) == (True, answer["content"][0]["text"])
    assert (f["credits"], f["charged"]) == ("committed", Decimal(str(expected)))
    assert await verify_job(conn, job) == []


async def test_an_exception_inside_is_failed_refunded_and_reraised(
        conn: Conn, own: MakeOwn, http: aiohttp.ClientSession, sim: RunningSimulator) -> None:
    job, empty = await create_job(conn), await create_job(conn)

    async def route() -> None:
        async with own().sync_call(job, "anthropic-sync"):
            await claude(http, sim)
            raise ValueError("no JSON in the answer")  # the seed's post-LLM failure

    with pytest.raises(ValueError, match="no JSON in the answer"):
        await route()
    async with own().sync_call(empty, "anthropic-sync") as call:
        pass  # no result set
    assert call.outcome is not None
    assert (call.outcome.ok, call.outcome.result) == (True, "failed")
    for j, error in ((job, "ValueError: no JSON in the answer"),
                     (empty, "the context exited without a result")):
        f = await facts(conn, j)
        assert (f["types"], f["error_message"]) == (["CallStarted", "UpstreamFailed"], error)
        assert (f["reservations"], f["credits"], f["charged"]) == (1, "refunded", 0)
        assert await verify_job(conn, j) == []


async def test_a_context_used_twice_for_one_job_is_refused_before_its_body(
        conn: Conn, own: MakeOwn) -> None:
    job = await create_job(conn, credits=3)
    calls = own()
    async with calls.sync_call(job, "anthropic-sync") as call:
        with pytest.raises(CallAlreadyStarted):  # while the first is still open
            async with calls.sync_call(job, "anthropic-sync"):
                pytest.fail("the body must not run")
        call.succeeded(text="once")
    with pytest.raises(CallAlreadyStarted) as info:  # a redelivered route, afterwards
        async with calls.sync_call(job, "anthropic-sync"):
            pytest.fail("the body must not run")
    assert info.value.projection is not None
    assert info.value.projection.output_text == "once"
    f = await facts(conn, job)
    assert len(f["types"]) == 4
    assert (f["reservations"], f["credits"], f["charged"]) == (1, "committed", Decimal(3))


async def test_a_stream_yields_its_chunks_inside_the_context_and_records_the_end(
        conn: Conn, own: MakeOwn, http: aiohttp.ClientSession, sim: RunningSimulator) -> None:
    job = await create_job(conn, credits=5)
    chunks = ai_writer_stream(own(pricing=PRICES), http, sim, job)
    first = await anext(chunks)
    assert first.startswith(b"event: message_start")
    f = await facts(conn, job)  # the generator is suspended inside the context
    assert (f["call_state"], f["types"]) == ("created", ["CallStarted"])
    rest = [chunk async for chunk in chunks]
    assert len(rest) == 5
    delta = next(json.loads(c.split(b"data: ", 1)[1]) for c in rest
                 if c.startswith(b"event: content_block_delta"))
    f = await facts(conn, job)
    assert (f["status"], f["text"]) == ("completed", delta["delta"]["text"])
    assert (f["credits"], f["charged"]) == ("committed", Decimal("2"))  # 0.02 KIE credits
    assert await verify_job(conn, job) == []


async def test_a_streaming_route_serves_the_client_and_records_the_answer(
        conn: Conn, own: MakeOwn, http: aiohttp.ClientSession, sim: RunningSimulator) -> None:
    calls, job = own(), await create_job(conn, credits=5)

    async def route(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        async with contextlib.aclosing(ai_writer_stream(calls, http, sim, job)) as chunks:
            async for chunk in chunks:
                await resp.write(chunk)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/ai-writer", route)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        async with http.get(f"http://127.0.0.1:{runner.addresses[0][1]}/ai-writer") as resp:
            body = await resp.read()
    finally:
        await runner.cleanup()
    assert body.count(b"event: ") == 6
    f = await facts(conn, job)
    assert (f["status"], f["credits"], f["charged"]) == ("completed", "committed", Decimal(5))
    assert f["text"] is not None
    assert f["text"] in body.decode()


async def test_a_stream_closed_early_or_cancelled_is_failed_and_refunded(
        conn: Conn, own: MakeOwn, http: aiohttp.ClientSession, sim: RunningSimulator) -> None:
    calls = own()
    closed, cancelled = await create_job(conn), await create_job(conn)
    chunks = ai_writer_stream(calls, http, sim, closed)
    await anext(chunks)
    await chunks.aclose()  # the client went away: the route closes the generator
    entered = asyncio.Event()

    async def never_answers() -> None:
        async with calls.sync_call(cancelled, "anthropic-sync"):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.get_running_loop().create_task(never_answers())
    async with asyncio.timeout(30):
        await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for job, code in ((closed, "the stream was closed before it ended"),
                      (cancelled, "cancelled before the call ended")):
        f = await facts(conn, job)
        assert (f["types"], f["error_message"]) == (["CallStarted", "UpstreamFailed"], code)
        assert (f["reservations"], f["credits"], f["charged"]) == (1, "refunded", 0)
        assert await verify_job(conn, job) == []


async def test_a_live_context_heartbeats_and_is_not_swept_past_its_threshold(
        conn: Conn, own: MakeOwn, make_reconciler: MakeReconciler) -> None:
    live, dead = await create_job(conn), await create_job(conn)
    await append(conn, dead, await load(conn, dead), CallStarted(
        at=utcnow(), actor="worker:dead", kind="anthropic-sync", sync=True))
    beaten, sleeps = asyncio.Event(), 0

    async def sleep(_: float) -> None:  # the first interval passes at once, then it waits
        nonlocal sleeps
        sleeps += 1
        if sleeps > 1:
            beaten.set()
            await asyncio.Event().wait()

    calls = own(sleep=sleep)
    async with calls.sync_call(live, "anthropic-sync") as call:
        async with asyncio.timeout(30):  # bounded: a context that never beats fails here
            await beaten.wait()
        f = await facts(conn, live)
        assert f["heartbeat_owner"] == calls.owner
        reconciler = make_reconciler(thresholds_s={"anthropic-sync": 10})
        counts = await reconciler.reconcile_once(f["heartbeat_at"] + timedelta(seconds=30))
        assert counts.swept == 1  # the dead one, past its 10 s threshold
        assert (await facts(conn, live))["call_state"] == "created"  # fresh heartbeat
        call.succeeded(text="a long stream")
    assert (await facts(conn, live))["credits"] == "committed"
    assert (await facts(conn, dead))["credits"] == "refunded"


# -- the blocking face ---------------------------------------------------------------------

def _blocking_sync_route(url: str, sim: RunningSimulator, ok: uuid.UUID,
                         broken: uuid.UUID) -> tuple[bool, SyncCall, str]:
    """A sync view (Flask, Django): no event loop anywhere in this thread."""
    try:
        asyncio.get_running_loop()
        no_loop = False
    except RuntimeError:
        no_loop = True
    request = urllib.request.Request(sim.url("anthropic", "/v1/messages"), method="POST",
                                     data=json.dumps({"model": CLAUDE, "max_tokens": 32,
                                                      "messages": [{"role": "user",
                                                                    "content": "hi"}]}).encode(),
                                     headers={"x-api-key": "sim-key", "content-type":
                                              "application/json",
                                              "anthropic-version": "2023-06-01"})
    with BlockingCalls(url, pricing=PRICES) as calls:
        with calls.sync_call(ok, "anthropic-sync") as call:
            with urllib.request.urlopen(request, timeout=30) as resp:
                answer = json.load(resp)
            call.succeeded(text=answer["content"][0]["text"], usage={
                k: answer["usage"][k] for k in ("input_tokens", "output_tokens")})
        try:
            with calls.sync_call(broken, "anthropic-sync"):
                raise KeyError("choices")
        except KeyError as exc:
            raised = repr(exc)
    return no_loop, call, raised


async def test_the_blocking_context_needs_no_event_loop(
        db_url: str, conn: Conn, sim: RunningSimulator) -> None:
    ok, broken = await create_job(conn, credits=10), await create_job(conn, credits=10)
    no_loop, call, raised = await asyncio.to_thread(_blocking_sync_route, db_url, sim, ok,
                                                    broken)
    assert no_loop
    assert raised == "KeyError('choices')"
    assert call.outcome is not None
    assert call.outcome.result == "completed"
    f = await facts(conn, ok)
    expected = round(float(call.usage["input_tokens"]) * 0.01
                     + float(call.usage["output_tokens"]) * 0.02, 6)
    assert (f["credits"], f["charged"]) == ("committed", Decimal(str(expected)))
    g = await facts(conn, broken)
    assert (g["credits"], g["error_message"]) == ("refunded", "KeyError: 'choices'")
    for job in (ok, broken):
        assert await verify_job(conn, job) == []


def _blocking_kie_handler(url: str, sim: RunningSimulator, media: Path,
                          job: uuid.UUID) -> tuple[str, str, str]:
    def kie(path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        req = urllib.request.Request(
            sim.url("kie", path), headers={**KIE_AUTH, "content-type": "application/json"},
            data=json.dumps(body).encode() if body is not None else None)
        with urllib.request.urlopen(req, timeout=30) as resp:
            return dict(json.load(resp))

    with BlockingCalls(url, media=LocalFolderStore(media), settings=sim.settings) as calls:
        call = calls.start(job, "kie-standard")
        first = call.action
        call.task_created(kie("/api/v1/jobs/createTask", KIE_REQ)["data"]["taskId"])
        again = calls.start(job, "kie-standard")  # a redelivery, blocking too
        assert again.resume_task_id is not None
        query = urllib.parse.urlencode({"taskId": again.resume_task_id})
        data: dict[str, Any] = {"state": "waiting"}
        while data["state"] not in ("success", "fail"):
            data = kie(f"/api/v1/jobs/recordInfo?{query}")["data"]
        urls = json.loads(data["resultJson"])["resultUrls"]
        return first, again.action, again.succeeded(media_urls=urls).result


async def test_the_blocking_face_records_an_async_kind_made_with_urllib(
        db_url: str, conn: Conn, sim: RunningSimulator, tmp_path: Path) -> None:
    job = await create_job(conn)
    got = await asyncio.to_thread(_blocking_kie_handler, db_url, sim, tmp_path / "m", job)
    assert got == ("create", "resume", "completed")
    f = await facts(conn, job)
    assert (f["credits"], f["assets"], len(f["types"])) == ("committed", 1, 5)
    assert sim.sim.journal.count("kie", "create") == 1
    assert await verify_job(conn, job) == []


KILLED_ROUTE = """
import sys, uuid
from callwarden import BlockingCalls
with BlockingCalls(sys.argv[1]) as calls:
    with calls.sync_call(uuid.UUID(sys.argv[2]), "anthropic-sync"):
        print("inside", flush=True)
        sys.stdin.readline()  # the LLM call that never comes back: SIGKILL lands here
"""


async def test_a_process_killed_inside_the_context_is_swept_and_refunded_once(
        db_url: str, conn: Conn, make_reconciler: MakeReconciler) -> None:
    job = await create_job(conn, credits=7)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", KILLED_ROUTE, db_url, str(job),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(60):
            assert await proc.stdout.readline() == b"inside\n"
        proc.send_signal(signal.SIGKILL)
        assert await proc.wait() == -signal.SIGKILL
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    f = await facts(conn, job)
    assert (f["call_state"], f["call_sync"], f["credits"]) == ("created", True, "reserved")
    threshold = ReconcileConfig().threshold_for("anthropic-sync")
    reconciler = make_reconciler()
    assert (await reconciler.reconcile_once(utcnow() + timedelta(seconds=threshold - 60))
            ).swept == 0  # not before its threshold
    past = utcnow() + timedelta(seconds=threshold + 60)
    assert (await reconciler.reconcile_once(past)).swept == 1
    assert (await reconciler.reconcile_once(past + timedelta(minutes=5))).swept == 0
    f = await facts(conn, job)
    assert (f["call_state"], f["error_message"]) == ("swept", "reconcile_no_recovery")
    assert f["types"] == ["CallStarted", "Swept"]
    assert (f["reservations"], f["credits"], f["charged"]) == (1, "refunded", 0)
    assert await verify_job(conn, job) == []


async def test_an_own_call_beats_while_the_hosts_block_runs_and_stops_after(
        conn: Conn, pool: Pool, http: aiohttp.ClientSession, sim: RunningSimulator,
        tmp_path: Path) -> None:
    """TaskCreated stamps the first heartbeat; ``beating()`` keeps stamping while the host
    polls, and stops when its block ends (issue 25.2)."""
    calls = OwnCalls(pool, media=LocalFolderStore(tmp_path / "media"), settings=sim.settings,
                     config=CallConfig(heartbeat_every_s=0.01))
    job = await create_job(conn, credits=10)
    call = await calls.start(job, "kie-standard")
    await call.task_created(await kie_create(http, sim, KIE_REQ))

    async def beat() -> Any:
        row = await (await conn.execute("SELECT heartbeat_at FROM jobs WHERE id = %s",
                                        (job,))).fetchone()
        assert row is not None
        return row["heartbeat_at"]

    first = await beat()
    assert first is not None  # TaskCreated's
    async with call.beating():
        deadline = asyncio.get_running_loop().time() + 10
        while await beat() == first:  # a condition, polled with a deadline
            assert asyncio.get_running_loop().time() < deadline, "no heartbeat while polling"
            await asyncio.sleep(0.01)
    after = await beat()
    for _ in range(5):  # several beat periods later, nothing moved it
        await calls.sleep(0.02)
    assert await beat() == after
