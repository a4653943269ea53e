"""KIE clients against the simulator: one kind of each task family plus ``kie-llm``, through
success, upstream failure, not-found, the transient recordInfo-null window, rate limits,
5xx, malformed JSON, timeouts, callbacks, and the duplicate-billing guard."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from callwarden.providers.errors import (
    AuthenticationError,
    BadRequest,
    MalformedResponse,
    ProviderTimeout,
    TransientError,
)
from callwarden.providers.kie.client import (
    RECORD_PENDING,
    KieLlmClient,
    KieTaskClient,
    kie_client_for,
)
from callwarden.providers.kie.webhook import verify_kie
from callwarden.providers.outcomes import Failed, NotFound, PollOutcome, Running, Succeeded
from callwarden.providers.simulator.core import Fault, RunningSimulator, Script, Step
from callwarden.providers.transport import RetryPolicy
from tests.support import poll_until_done

FAST = RetryPolicy(max_attempts=3, base_delay_s=0.0, max_delay_s=0.0, max_total_s=5.0,
                   timeout_s=3.0)
CALLBACK = "http://127.0.0.1:9/unused-callback"
REQUESTS: dict[str, dict[str, Any]] = {
    "kie-standard": {"model": "nano-banana-pro", "input": {"prompt": "a cat"}},
    "kie-veo": {"prompt": "a dog", "model": "veo3_fast"},
    "kie-suno": {"prompt": "a song", "customMode": False, "instrumental": True,
                 "model": "V4_5"},
    "kie-kontext": {"prompt": "a hat", "aspectRatio": "1:1"},
    "kie-luma": {"prompt": "make it rain", "videoUrl": "https://example.com/in.mp4"},
    "kie-runway": {"prompt": "a river", "duration": 5, "quality": "720p",
                   "aspectRatio": "16:9"},
}
KINDS = list(REQUESTS)
CONTENT_TYPES = {"kie-standard": "image/png", "kie-veo": "video/mp4", "kie-suno": "audio/mpeg",
                 "kie-kontext": "image/png", "kie-luma": "video/mp4", "kie-runway": "video/mp4"}


class FakeSleep:
    """Records requested delays; yields to the loop without waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def task_client(rs: RunningSimulator, http: aiohttp.ClientSession, kind: str, *,
                sleep: FakeSleep | None = None, clock: FakeClock | None = None,
                policy: RetryPolicy = FAST) -> KieTaskClient:
    return KieTaskClient(http, rs.settings.kie, kind, policy, sleep or FakeSleep(),
                         callback_url=CALLBACK if kind == "kie-suno" else None,
                         now=clock or FakeClock())


def with_script(kind: str, **script: Any) -> dict[str, Any]:
    return {**REQUESTS[kind], "_sim": msgspec.to_builtins(Script(**script))}


async def run(client: KieTaskClient, request: dict[str, Any]) -> tuple[PollOutcome,
                                                                        list[PollOutcome]]:
    seen: list[PollOutcome] = []

    async def on_poll(outcome: PollOutcome) -> None:
        seen.append(outcome)

    task_id = await client.create(request)
    final = await poll_until_done(client.poll, task_id, interval_s=1.0, budget_s=60.0,
                                  on_poll=on_poll)
    return final, seen


# -- outcomes -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_task_succeeds_with_fetchable_media(
    sim: RunningSimulator, http: aiohttp.ClientSession, kind: str,
) -> None:
    final, seen = await run(task_client(sim, http, kind), REQUESTS[kind])
    assert isinstance(final, Succeeded)
    assert all(isinstance(o, Running) for o in seen[:-1])
    assert len(final.media_urls) == (2 if kind == "kie-suno" else 1)
    async with http.get(final.media_urls[0]) as resp:
        assert resp.status == 200
        assert resp.content_type == CONTENT_TYPES[kind]
    assert sim.sim.journal.count("kie", "create") == 1
    if kind == "kie-standard":
        assert final.cost is None  # live recordInfo reports no cost (docs/providers.md)


@pytest.mark.parametrize("kind", KINDS)
async def test_upstream_failure_is_a_failed_outcome_keeping_the_message(
    sim: RunningSimulator, http: aiohttp.ClientSession, kind: str,
) -> None:
    request = with_script(kind, end="failed", error="content policy violation",
                          error_code="400")
    final, _ = await run(task_client(sim, http, kind), request)
    assert isinstance(final, Failed)
    assert final.error == "content policy violation"
    assert final.code == "400"


@pytest.mark.parametrize(("kind", "end", "error_code", "expected", "raw_field", "raw_value"), [
    ("kie-luma", "succeeded", "4", Succeeded, "successFlag", 4),  # only the callback failed
    ("kie-suno", "succeeded", "CALLBACK_EXCEPTION", Succeeded, "status", "CALLBACK_EXCEPTION"),
    ("kie-veo", "failed", "2", Failed, "successFlag", 2),
])
async def test_family_specific_terminal_variants(
    sim: RunningSimulator, http: aiohttp.ClientSession, kind: str, end: str, error_code: str,
    expected: type, raw_field: str, raw_value: object,
) -> None:
    request = with_script(kind, end=end, error_code=error_code)
    final, _ = await run(task_client(sim, http, kind), request)
    assert isinstance(final, Succeeded | Failed)
    assert isinstance(final, expected)
    assert final.raw[raw_field] == raw_value


async def test_suno_callback_exception_without_audio_is_failed(
    sim: RunningSimulator, http: aiohttp.ClientSession,
) -> None:
    request = with_script("kie-suno", end="failed", error_code="CALLBACK_EXCEPTION")
    final, _ = await run(task_client(sim, http, "kie-suno"), request)
    assert isinstance(final, Failed)
    assert final.code == "CALLBACK_EXCEPTION"


@pytest.mark.parametrize("kind", KINDS)
async def test_vanished_task_is_pending_during_grace_then_not_found(
    sim: RunningSimulator, http: aiohttp.ClientSession, kind: str,
) -> None:
    clock = FakeClock()
    client = task_client(sim, http, kind, clock=clock)
    task_id = await client.create(with_script(kind, steps=[], end="vanished"))
    assert await client.poll(task_id) == Running(raw_state=RECORD_PENDING)
    clock.t += 61
    assert isinstance(await client.poll(task_id), NotFound)


@pytest.mark.parametrize("kind", KINDS)
async def test_transient_record_null_right_after_create_is_tolerated(
    sim: RunningSimulator, http: aiohttp.ClientSession, kind: str,
) -> None:
    request = with_script(kind, not_found_first_polls=2)
    final, seen = await run(task_client(sim, http, kind), request)
    assert isinstance(final, Succeeded)
    assert seen[:2] == [Running(raw_state=RECORD_PENDING)] * 2


async def test_unknown_id_is_not_found_once_the_grace_is_over(
    sim: RunningSimulator, http: aiohttp.ClientSession,
) -> None:
    client = KieTaskClient(http, sim.settings.kie, "kie-standard", FAST, FakeSleep(),
                           null_grace_s=0.0)
    assert await client.poll("0" * 32) == NotFound(message="recordInfo is null")


# -- faults ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["rate_limit", "rate_limit_in_body"])
@pytest.mark.parametrize("kind", KINDS)
async def test_rate_limited_create_and_poll_are_retried_then_succeed(
    sim: RunningSimulator, http: aiohttp.ClientSession, kind: str, fault: str,
) -> None:
    for route in ("create", "poll"):
        sim.sim.faults.arm("kie", route, Fault(kind=fault, retry_after=1.5))  # type: ignore[arg-type]
    sleep = FakeSleep()
    final, _ = await run(task_client(sim, http, kind, sleep=sleep), REQUESTS[kind])
    assert isinstance(final, Succeeded)
    assert sleep.delays.count(1.5) == 2
    assert len(sim.sim.tasks.all("kie")) == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_5xx_on_poll_is_retried_and_on_create_is_raised_unretried(
    sim: RunningSimulator, http: aiohttp.ClientSession, kind: str,
) -> None:
    client = task_client(sim, http, kind)
    sim.sim.faults.arm("kie", "create", Fault(kind="http_status", status=502))
    with pytest.raises(TransientError):
        await client.create(REQUESTS[kind])
    assert sim.sim.journal.count("kie", "create") == 1
    task_id = await client.create(REQUESTS[kind])
    sim.sim.faults.arm("kie", "poll", Fault(kind="http_status", status=500))
    sim.sim.faults.arm("kie", "poll", Fault(kind="http_status", status=455))
    assert isinstance(await client.poll(task_id), Running)
    assert sim.sim.journal.count("kie", "poll") == 3


@pytest.mark.parametrize("kind", KINDS)
async def test_malformed_json_raises_malformed_response(
    sim: RunningSimulator, http: aiohttp.ClientSession, kind: str,
) -> None:
    client = task_client(sim, http, kind)
    task_id = await client.create(REQUESTS[kind])
    sim.sim.faults.arm("kie", "poll", Fault(kind="malformed_json"))
    with pytest.raises(MalformedResponse):
        await client.poll(task_id)
    assert isinstance(await client.poll(task_id), Running)


@pytest.mark.parametrize("kind", KINDS)
async def test_hanging_poll_times_out(
    sim: RunningSimulator, http: aiohttp.ClientSession, kind: str,
) -> None:
    client = task_client(sim, http, kind, policy=RetryPolicy(max_attempts=1, timeout_s=0.1))
    task_id = await client.create(REQUESTS[kind])
    sim.sim.faults.arm("kie", "poll", Fault(kind="hang", hang_s=0.4))
    with pytest.raises(ProviderTimeout):
        await client.poll(task_id)


async def test_wrong_key_is_an_in_body_401(
    sim: RunningSimulator, http: aiohttp.ClientSession,
) -> None:
    endpoint = msgspec.structs.replace(sim.settings.kie, api_key="wrong")
    client = KieTaskClient(http, endpoint, "kie-standard", FAST, FakeSleep())
    with pytest.raises(AuthenticationError, match="Unauthorized"):  # the documented text
        await client.create(REQUESTS["kie-standard"])


async def test_suno_without_callback_is_refused_by_client_and_simulator(
    sim: RunningSimulator, http: aiohttp.ClientSession,
) -> None:
    client = KieTaskClient(http, sim.settings.kie, "kie-suno", FAST, FakeSleep())
    with pytest.raises(BadRequest, match="callBackUrl"):
        await client.create(REQUESTS["kie-suno"])
    assert sim.sim.journal.count("kie", "create") == 0
    async with http.post(sim.url("kie", "/api/v1/generate"), json=REQUESTS["kie-suno"],
                         headers={"Authorization": "Bearer sim-key"}) as resp:
        assert resp.status == 200
        assert await resp.json() == {"code": 422, "msg": "Please enter callBackUrl.",
                                     "data": None}


async def test_missing_user_agent_meets_cloudflare_1010(sim: RunningSimulator) -> None:
    async with aiohttp.ClientSession(skip_auto_headers=["User-Agent"]) as bare:
        client = KieTaskClient(bare, sim.settings.kie, "kie-standard", FAST, FakeSleep())
        with pytest.raises(AuthenticationError, match="User-Agent"):
            await client.create(REQUESTS["kie-standard"])


# -- byte shapes (reference §15 items 6–8) --------------------------------------------------

AUTH = {"Authorization": "Bearer sim-key"}


async def get_data(sim: RunningSimulator, http: aiohttp.ClientSession, path: str,
                   task_id: str) -> dict[str, Any]:
    async with http.get(sim.url("kie", path), params={"taskId": task_id}, headers=AUTH) as resp:
        body = await resp.json()
    assert resp.status == 200
    assert (body["code"], body["msg"]) == (200, "success")
    data: dict[str, Any] = body["data"]
    return data


async def test_market_record_info_is_byte_shape_faithful(
    sim: RunningSimulator, http: aiohttp.ClientSession,
) -> None:
    task_id = await task_client(sim, http, "kie-standard").create(REQUESTS["kie-standard"])
    assert len(task_id) == 32
    assert int(task_id, 16) >= 0
    path = "/api/v1/jobs/recordInfo"
    pending = await get_data(sim, http, path, task_id)
    assert (pending["state"], pending["resultJson"], pending["failCode"]) == ("waiting", "", None)
    param = msgspec.json.decode(pending["param"])
    assert msgspec.json.decode(param["input"]) == {"prompt": "a cat"}  # double-encoded
    assert pending["createTime"] > 10**12  # epoch ms
    for _ in range(3):
        done = await get_data(sim, http, path, task_id)
    assert done["state"] == "success"
    assert msgspec.json.decode(done["resultJson"])["resultUrls"]
    assert done["costTime"] < 5  # seconds, not ms
    assert done["completeTime"] >= done["createTime"]


@pytest.mark.parametrize(("kind", "path", "pattern"), [
    ("kie-veo", "/api/v1/veo/record-info", r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$"),
    ("kie-kontext", "/api/v1/flux/kontext/record-info", r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$"),
    ("kie-luma", "/api/v1/modify/record-info", r"^\d{13}$"),
])
async def test_success_flag_families_use_their_time_formats(
    sim: RunningSimulator, http: aiohttp.ClientSession, kind: str, path: str, pattern: str,
) -> None:
    task_id = await task_client(sim, http, kind).create(REQUESTS[kind])
    data = await get_data(sim, http, path, task_id)
    assert data["successFlag"] == 0
    assert data["response"] is None
    assert re.match(pattern, str(data["createTime"]))


async def test_credit_and_unauthenticated_answers(
    sim: RunningSimulator, http: aiohttp.ClientSession,
) -> None:
    async with http.get(sim.url("kie", "/api/v1/chat/credit"), headers=AUTH) as resp:
        assert await resp.json() == {"code": 200, "msg": "success", "data": 5916.25}
    async with http.get(sim.url("kie", "/api/v1/chat/credit")) as resp:
        assert resp.status == 200
        assert (await resp.json())["code"] == 401


async def test_llm_simulator_streams_unless_stream_is_false(
    sim: RunningSimulator, http: aiohttp.ClientSession,
) -> None:
    async with http.post(sim.url("kie", "/claude/v1/messages"), json=LLM, headers=AUTH) as resp:
        assert resp.content_type == "text/event-stream"
        assert "event: message_stop" in await resp.text()


# -- duplicate-billing guard ----------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_resume_after_restart_never_creates(
    sim: RunningSimulator, http: aiohttp.ClientSession, kind: str,
) -> None:
    task_id = await task_client(sim, http, kind).create(REQUESTS[kind])
    assert sim.sim.journal.count("kie", "create") == 1
    restarted = kie_client_for(kind, http, sim.settings.kie, FAST, FakeSleep(),
                               callback_url=CALLBACK)
    assert isinstance(restarted, KieTaskClient)
    final = await poll_until_done(restarted.poll, task_id, interval_s=1.0, budget_s=60.0)
    assert isinstance(final, Succeeded)
    assert sim.sim.journal.count("kie", "create") == 1


# -- callbacks ------------------------------------------------------------------------------


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[str, list[tuple[dict[str, Any], dict[str, str]]]]]:
    got: list[tuple[dict[str, Any], dict[str, str]]] = []

    async def hook(request: web.Request) -> web.Response:
        got.append((await request.json(), dict(request.headers)))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/cb", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/cb", got
    await runner.cleanup()


@pytest.mark.parametrize(("kind", "id_key", "stages"), [
    ("kie-standard", "taskId", [None]), ("kie-runway", "task_id", [None]),
    ("kie-suno", "task_id", ["text", "first", "complete"]),
])
async def test_signed_callbacks_arrive_without_any_poll(
    sim: RunningSimulator, http: aiohttp.ClientSession,
    receiver: tuple[str, list[tuple[dict[str, Any], dict[str, str]]]],
    kind: str, id_key: str, stages: list[str | None],
) -> None:
    url, got = receiver
    client = KieTaskClient(http, sim.settings.kie, kind, FAST, FakeSleep())
    request = with_script(kind, steps=[Step(phase="running", seconds=0.05)])
    task_id = await client.create(request, callback_url=url)
    await sim.sim.webhooks.wait_for(len(stages), outcome="delivered")
    assert sim.sim.journal.count("kie", "poll") == 0
    by_stage = {b["data"].get("callbackType"): b for b, _ in got}
    assert sorted(by_stage, key=str) == sorted(stages, key=str)
    assert len(got) == len(stages)
    for body, headers in got:
        assert body["data"][id_key] == task_id
        verify_kie(sim.sim.webhook_secrets["kie"], task_id, headers, now=sim.sim.clock.now())
    if kind == "kie-suno":
        assert all(t["audio_url"] for t in by_stage["complete"]["data"]["data"])
        assert by_stage["text"]["data"]["data"] == []  # no tracks at the text stage


# -- kie-llm --------------------------------------------------------------------------------

LLM = {"model": "claude-sonnet-4-6", "messages": [{"role": "user", "content": "hello"}]}
CHAT = {"api": "chat", "model": "gemini-2.5-pro", "messages": [{"role": "user", "content": "hi"}]}


def llm(rs: RunningSimulator, http: aiohttp.ClientSession, *, timeout_s: float = 3.0,
        key: str | None = None) -> KieLlmClient:
    endpoint = rs.settings.kie
    if key is not None:
        endpoint = msgspec.structs.replace(endpoint, api_key=key)
    policy = msgspec.structs.replace(FAST, timeout_s=timeout_s)
    return KieLlmClient(http, endpoint, "kie-llm", policy, FakeSleep())


@pytest.mark.parametrize(("request_body", "cost"), [(LLM, 0.02), (CHAT, 0.05)])
async def test_llm_call_returns_text_and_credits(
    sim: RunningSimulator, http: aiohttp.ClientSession, request_body: dict[str, Any],
    cost: float | None,
) -> None:
    out = await llm(sim, http).call(request_body)
    assert isinstance(out, Succeeded)
    assert out.text == f"Simulated reply to: {request_body['messages'][0]['content']}"
    assert out.cost == cost
    assert sim.sim.journal.entries("kie", "call")[0].json()["stream"] is False


@pytest.mark.parametrize(("fault", "expected"), [
    (Fault(kind="rate_limit", retry_after=0.5), None),
    (Fault(kind="rate_limit_in_body", retry_after=0.5), None),
    (Fault(kind="http_status", status=503), TransientError),
    (Fault(kind="malformed_json"), MalformedResponse),
])
async def test_llm_faults(
    sim: RunningSimulator, http: aiohttp.ClientSession, fault: Fault,
    expected: type[Exception] | None,
) -> None:
    sim.sim.faults.arm("kie", "call", fault)
    client = llm(sim, http)
    if expected is None:
        out = await client.call(LLM)
        assert isinstance(out, Succeeded)
        assert out.text
        assert sim.sim.journal.count("kie", "call") == 2
    else:
        with pytest.raises(expected):
            await client.call(LLM)
        assert sim.sim.journal.count("kie", "call") == 1


@pytest.mark.parametrize(("script", "key", "expected"), [
    (Script(end="failed", error="prompt too long"), None, BadRequest),
    (Script(), "wrong", AuthenticationError),
    (Script(hang_s=1.0), None, ProviderTimeout),
])
async def test_llm_errors(
    sim: RunningSimulator, http: aiohttp.ClientSession, script: Script, key: str | None,
    expected: type[Exception],
) -> None:
    request = {**LLM, "_sim": msgspec.to_builtins(script)}
    with pytest.raises(expected):
        await llm(sim, http, timeout_s=0.3, key=key).call(request)
