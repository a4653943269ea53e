"""The KIE simulator, field by field against the recorded shapes
(``tests/fixtures/providers/kie``): every answer and callback the simulator has a
counterpart for is driven over HTTP into the fixture's state and compared with
:func:`tests.shapes.diff` (no extra key, no missing key, no type the live API never sent).
Request echoes (``param``, ``paramJson``, ``promptJson``) are opaque: their content is the
request's. Callbacks are captured without a receiver (``webhook.drop``), except for the
retry schedule, which needs a receiver that refuses them.

:data:`COMPARED` and :data:`NOT_COMPARABLE` classify every fixture of the folder; a test
keeps the classification complete.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Final

import aiohttp
import msgspec
import pytest
from aiohttp import web

from callwarden.providers.kie.webhook import verify_kie
from callwarden.providers.simulator.core import Fault, RunningSimulator
from callwarden.providers.simulator.kie import RETRY_SCHEDULE_S, signer
from callwarden.providers.simulator.kie_render import CREATE_PATHS, POLL_PATHS
from tests.recorded import FIXTURES, Recorded, load, vectors
from tests.shapes import Shape, diff, shape_of

PROVIDER: Final = "kie"
AUTH: Final = {"Authorization": "Bearer sim-key"}
UNUSED_CALLBACK: Final = "http://127.0.0.1:9/cb"  # never contacted: deliveries are dropped
DAY: Final = 24 * 3600.0
REQUESTS: Final[dict[str, dict[str, Any]]] = {
    "market": {"model": "nano-banana-pro", "input": {"prompt": "a cat", "aspect_ratio": "1:1"}},
    "veo": {"prompt": "a dog", "model": "veo3_fast", "aspectRatio": "16:9"},
    "suno": {"prompt": "a song", "customMode": False, "instrumental": True, "model": "V4_5"},
    "kontext": {"prompt": "a hat", "aspectRatio": "1:1"},
    "luma": {"prompt": "make it rain", "videoUrl": "https://example.com/in.mp4"},
    "runway": {"prompt": "a river", "duration": 5, "quality": "720p", "aspectRatio": "16:9",
               "imageUrl": "https://example.com/in.jpg"},
}
REQUEST_ECHOES: Final = ("$.data.param", "$.data.paramJson", "$.data.promptJson")

# Every fixture of the folder: compared (by which test) or not comparable (why).
COMPARED: Final[dict[str, str]] = {
    "market_create": "test_market_create_answers_equal_task_and_record_ids",
    "market_record_waiting": "test_market_record_info_while_pending_has_the_live_keys",
    "market_record_queuing": "test_market_record_info_while_pending_has_the_live_keys",
    "market_record_generating": "test_market_record_info_while_pending_has_the_live_keys",
    "market_record_success_image": "test_market_success_has_the_live_keys_and_no_cost",
    "market_record_success_video": "test_market_success_has_the_live_keys_and_no_cost",
    "market_record_success_text": "test_text_model_success_reports_a_result_object",
    "market_record_fail": "test_market_failure_reports_string_fail_code_and_message",
    "record_is_null": "test_unknown_market_id_is_record_info_null",
    "error_400_taskid_required": "test_error_envelopes_are_the_documented_ones",
    "error_401": "test_error_envelopes_are_the_documented_ones",
    "error_429": "test_error_envelopes_are_the_documented_ones",
    "error_500": "test_error_envelopes_are_the_documented_ones",
    "credit": "test_credit_balance_is_a_bare_number",
    "suno_create": "test_suno_create_answers_only_a_task_id",
    "suno_create_missing_callback": "test_suno_create_without_callback_url_is_refused",
    "suno_record_not_found": "test_unknown_suno_id_is_success_with_null_data",
    "suno_record_success": "test_suno_success_lists_tracks_in_camel_case",
    "suno_record_fail": "test_suno_failure_keeps_a_response_without_tracks",
    "veo_record_success": "test_success_flag_families_answer_their_documented_record",
    "kontext_record_success": "test_success_flag_families_answer_their_documented_record",
    "luma_record_success": "test_success_flag_families_answer_their_documented_record",
    "runway_record_success": "test_runway_expire_flag_turns_1_after_14_days",
    "runway_record_expired": "test_runway_expire_flag_turns_1_after_14_days",
    "callback_market_success": "test_terminal_callback_has_the_documented_shape",
    "callback_market_fail": "test_terminal_callback_has_the_documented_shape",
    "callback_veo_success": "test_terminal_callback_has_the_documented_shape",
    "callback_veo_fail": "test_terminal_callback_has_the_documented_shape",
    "callback_kontext_success": "test_terminal_callback_has_the_documented_shape",
    "callback_kontext_fail": "test_terminal_callback_has_the_documented_shape",
    "callback_luma_success": "test_terminal_callback_has_the_documented_shape",
    "callback_runway_success": "test_terminal_callback_has_the_documented_shape",
    "callback_runway_fail": "test_terminal_callback_has_the_documented_shape",
    "callback_suno_text": "test_suno_sends_text_first_and_complete_stages",
    "callback_suno_first": "test_suno_sends_text_first_and_complete_stages",
    "callback_suno_complete": "test_suno_sends_text_first_and_complete_stages",
    "callback_suno_error": "test_suno_failure_sends_an_error_stage_with_null_data",
    "llm_claude_messages": "test_claude_message_has_the_live_shape_with_credits",
    "llm_chat_completions": "test_chat_completion_reports_credits_consumed",
    "llm_claude_error_401": "test_llm_without_valid_key_is_a_real_http_401",
    "signature_vectors": "test_callback_signer_reproduces_the_signature_vectors",
}
NOT_COMPARABLE: Final[dict[str, str]] = {
    "market_record_success_docs_example":
        "the documented example (message, updateTime, single-encoded param, costTime in ms) "
        "is contradicted by 595 live answers; the simulator follows the live ones",
    "error_404":
        "no source says when recordInfo answers 404 'Task not found' rather than the "
        "documented 422 'recordInfo is null' for an unknown id; the simulator never sends it",
    "download_url_wrong": "the simulator has no /api/v1/common/download-url endpoint",
    "suno_sibling_record_does_not_exist":
        "the simulator has no Suno sibling creates (wav, mp4, midi, vocal-removal)",
    "suno_style_generate": "the simulator has no synchronous /api/v1/style/generate",
}


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: Any


def fixture(name: str) -> Recorded:
    return load(PROVIDER, name)


def recorded(*names: str) -> Shape:
    return shape_of(*(fixture(n).body for n in names))


def assert_recorded_shape(names: tuple[str, ...], answer: Answer,
                          opaque: tuple[str, ...] = REQUEST_ECHOES) -> None:
    """Body shape as recorded; HTTP status as recorded; the live ``Content-Type`` when the
    fixture was recorded live."""
    assert diff(recorded(*names), answer.body, opaque=opaque) == []
    for name in names:
        rec = fixture(name)
        assert answer.status == rec.status, name
        if rec.evidence == "O" and "content-type" in rec.headers:
            assert answer.content_type == rec.headers["content-type"], name


def decoded(value: str) -> Any:
    return msgspec.json.decode(value)


def with_script(family: str, script: dict[str, Any], *, callback: str | None = None,
                **overrides: Any) -> dict[str, Any]:
    """A create body following ``script``; Suno (which insists on a callback URL) and
    ``callback=UNUSED_CALLBACK`` get their callbacks dropped, recorded but never sent."""
    body = {**REQUESTS[family], **overrides, "_sim": script}
    url = callback or (UNUSED_CALLBACK if family == "suno" else None)
    if url is not None:
        body["callBackUrl"] = url
    if url == UNUSED_CALLBACK:
        body["_sim"] = {"webhook": {"drop": True}, **script}
    return body


async def send(http: aiohttp.ClientSession, method: str, url: str, *,
               headers: dict[str, str] | None = None, **kw: Any) -> Answer:
    async with http.request(method, url, headers=AUTH if headers is None else headers,
                            **kw) as resp:
        return Answer(resp.status, resp.headers.get("Content-Type", ""),
                      msgspec.json.decode(await resp.read()))


async def create(sim: RunningSimulator, http: aiohttp.ClientSession, family: str,
                 body: dict[str, Any]) -> Answer:
    return await send(http, "POST", sim.url(PROVIDER, CREATE_PATHS[family]), json=body)


async def create_task(sim: RunningSimulator, http: aiohttp.ClientSession, family: str,
                      script: dict[str, Any], **kw: Any) -> str:
    answer = await create(sim, http, family, with_script(family, script, **kw))
    assert answer.body["code"] == 200, answer.body
    task_id: str = answer.body["data"]["taskId"]
    return task_id


async def poll(sim: RunningSimulator, http: aiohttp.ClientSession, family: str,
               task_id: str) -> Answer:
    return await send(http, "GET", sim.url(PROVIDER, POLL_PATHS[family]),
                      params={"taskId": task_id})


async def dropped_callbacks(sim: RunningSimulator, count: int) -> list[dict[str, Any]]:
    """The first ``count`` callbacks the simulator meant to send (``webhook.drop``)."""
    got = await sim.sim.webhooks.wait_for(count, outcome="dropped")
    assert all(d.headers["Content-Type"] == "application/json" for d in got)
    return [msgspec.json.decode(d.body) for d in got]


# -- classification -------------------------------------------------------------------------


def test_every_kie_fixture_is_compared_or_explained() -> None:
    on_disk = {p.stem for p in (FIXTURES / PROVIDER).glob("*.json")}
    assert set(COMPARED).isdisjoint(NOT_COMPARABLE)
    assert set(COMPARED) | set(NOT_COMPARABLE) == on_disk
    tests = {name for name, value in globals().items()
             if name.startswith("test_") and callable(value)}
    assert set(COMPARED.values()) <= tests


# -- market ---------------------------------------------------------------------------------


async def test_market_create_answers_equal_task_and_record_ids(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    answer = await create(sim, http, "market", REQUESTS["market"])
    assert_recorded_shape(("market_create",), answer)
    data = answer.body["data"]
    assert data["taskId"] == data["recordId"]
    assert re.fullmatch(r"[0-9a-f]{32}", data["taskId"])


@pytest.mark.parametrize(("steps", "polls", "name"), [
    ([{"phase": "queued", "polls": 5}], 1, "market_record_waiting"),
    ([{"phase": "queued", "polls": 1}, {"phase": "queued", "polls": 5}], 2,
     "market_record_queuing"),
    ([{"phase": "running", "polls": 5, "progress": 40}], 1, "market_record_generating"),
], ids=["waiting", "queuing", "generating"])
async def test_market_record_info_while_pending_has_the_live_keys(
        sim: RunningSimulator, http: aiohttp.ClientSession, steps: list[dict[str, Any]],
        polls: int, name: str) -> None:
    task_id = await create_task(sim, http, "market", {"steps": steps})
    for _ in range(polls):
        answer = await poll(sim, http, "market", task_id)
    assert_recorded_shape((name,), answer)
    data = answer.body["data"]
    assert (data["state"], data["resultJson"]) == (fixture(name).body["data"]["state"], "")
    param = decoded(data["param"])
    assert diff(shape_of(decoded(fixture(name).body["data"]["param"])), param) == []
    assert decoded(param["input"]) == REQUESTS["market"]["input"]  # double-encoded


async def test_market_success_has_the_live_keys_and_no_cost(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    variants = ("market_record_success_image", "market_record_success_video")
    task_id = await create_task(sim, http, "market", {"steps": [], "media_count": 2})
    answer = await poll(sim, http, "market", task_id)
    assert_recorded_shape(variants, answer)
    data = answer.body["data"]
    assert data["state"] == "success"
    results = [decoded(fixture(n).body["data"]["resultJson"]) for n in variants]
    assert diff(shape_of(*results), decoded(data["resultJson"])) == []
    assert isinstance(data["costTime"], int)
    assert data["costTime"] < 5  # whole seconds, not milliseconds


async def test_text_model_success_reports_a_result_object(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    name = "market_record_success_text"
    task_id = await create_task(sim, http, "market",
                                {"steps": [], "output": {"text": "a haiku"}})
    answer = await poll(sim, http, "market", task_id)
    assert_recorded_shape((name,), answer)
    result = decoded(answer.body["data"]["resultJson"])
    assert diff(shape_of(decoded(fixture(name).body["data"]["resultJson"])), result,
                opaque=["$.resultObject"]) == []
    assert result == {"resultObject": {"text": "a haiku"}}


async def test_market_failure_reports_string_fail_code_and_message(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    task_id = await create_task(sim, http, "market", {
        "steps": [], "end": "failed", "error": "Internal server error", "error_code": "500"})
    answer = await poll(sim, http, "market", task_id)
    assert_recorded_shape(("market_record_fail",), answer)
    data = answer.body["data"]
    assert (data["state"], data["failCode"], data["failMsg"]) == (
        "fail", "500", "Internal server error")


@pytest.mark.parametrize(("model", "reported"), [
    ("sora-2-text-to-video", True), ("nano-banana-pro", False)])
async def test_only_sora2_models_report_progress(
        sim: RunningSimulator, http: aiohttp.ClientSession, model: str,
        reported: bool) -> None:
    script = {"steps": [{"phase": "running", "polls": 5, "progress": 40}]}
    task_id = await create_task(sim, http, "market", script, model=model)
    data = (await poll(sim, http, "market", task_id)).body["data"]
    assert ("progress" in data) is reported
    assert data.get("progress") == (40 if reported else None)


async def test_unknown_market_id_is_record_info_null(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    answer = await poll(sim, http, "market", "0" * 32)
    assert_recorded_shape(("record_is_null",), answer)
    assert answer.body == fixture("record_is_null").body


@pytest.mark.parametrize("name", ["error_400_taskid_required", "error_401", "error_429",
                                  "error_500"])
async def test_error_envelopes_are_the_documented_ones(
        sim: RunningSimulator, http: aiohttp.ClientSession, name: str) -> None:
    url = sim.url(PROVIDER, POLL_PATHS["market"])
    task = {"taskId": "0" * 32}
    if name == "error_400_taskid_required":
        answer = await send(http, "GET", url)
    elif name == "error_401":
        answer = await send(http, "GET", url, params=task,
                            headers={"Authorization": "Bearer wrong"})
    else:
        fault = Fault(kind="rate_limit_in_body") if name == "error_429" else \
            Fault(kind="http_status", status=500)
        sim.sim.faults.arm(PROVIDER, "poll", fault)
        answer = await send(http, "GET", url, params=task)
    assert answer.body == fixture(name).body
    if name == "error_500":  # an injected HTTP-level fault: the transport status is 500
        assert diff(recorded(name), answer.body) == []
        assert answer.status == 500
    else:
        assert_recorded_shape((name,), answer)


async def test_credit_balance_is_a_bare_number(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    answer = await send(http, "GET", sim.url(PROVIDER, "/api/v1/chat/credit"))
    assert_recorded_shape(("credit",), answer)


# -- Suno -----------------------------------------------------------------------------------


async def test_suno_create_answers_only_a_task_id(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    answer = await create(sim, http, "suno", with_script("suno", {}))
    assert_recorded_shape(("suno_create",), answer)


async def test_suno_create_without_callback_url_is_refused(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    answer = await create(sim, http, "suno", REQUESTS["suno"])
    assert_recorded_shape(("suno_create_missing_callback",), answer)
    assert answer.body == fixture("suno_create_missing_callback").body
    assert sim.sim.tasks.all(PROVIDER) == []


async def test_unknown_suno_id_is_success_with_null_data(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    answer = await poll(sim, http, "suno", "0" * 32)
    assert_recorded_shape(("suno_record_not_found",), answer)
    assert answer.body == fixture("suno_record_not_found").body


async def test_suno_success_lists_tracks_in_camel_case(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    task_id = await create_task(sim, http, "suno", {"steps": []})
    answer = await poll(sim, http, "suno", task_id)
    assert_recorded_shape(("suno_record_success",), answer)
    data = answer.body["data"]
    assert data["status"] == "SUCCESS"
    assert all(t["audioUrl"] for t in data["response"]["sunoData"])


async def test_suno_failure_keeps_a_response_without_tracks(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    task_id = await create_task(sim, http, "suno", {
        "steps": [], "end": "failed", "error": "Generation failed, please retry"})
    answer = await poll(sim, http, "suno", task_id)
    assert_recorded_shape(("suno_record_fail",), answer)
    data = answer.body["data"]
    assert (data["status"], data["errorCode"]) == ("GENERATE_AUDIO_FAILED", 501)
    assert data["response"] == {"taskId": task_id, "sunoData": [],
                                "errorMessage": "Generation failed, please retry"}


# -- Veo, Kontext, Luma, Runway -------------------------------------------------------------


@pytest.mark.parametrize(("family", "name"), [
    ("veo", "veo_record_success"), ("kontext", "kontext_record_success"),
    ("luma", "luma_record_success")])
async def test_success_flag_families_answer_their_documented_record(
        sim: RunningSimulator, http: aiohttp.ClientSession, family: str, name: str) -> None:
    task_id = await create_task(sim, http, family, {"steps": []})
    answer = await poll(sim, http, family, task_id)
    assert_recorded_shape((name,), answer)
    assert answer.body["data"]["successFlag"] == 1


async def test_runway_expire_flag_turns_1_after_14_days(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    task_id = await create_task(sim, http, "runway", {"steps": []})
    fresh = await poll(sim, http, "runway", task_id)
    assert_recorded_shape(("runway_record_success",), fresh)
    assert fresh.body["data"]["expireFlag"] == 0
    assert re.fullmatch(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}",
                        fresh.body["data"]["videoInfo"]["videoId"])
    sim.sim.clock.advance(14 * DAY - 60)
    assert (await poll(sim, http, "runway", task_id)).body["data"]["expireFlag"] == 0
    sim.sim.clock.advance(120)
    expired = await poll(sim, http, "runway", task_id)
    assert_recorded_shape(("runway_record_expired",), expired)
    assert expired.body["data"]["expireFlag"] == 1


def result_url(family: str, data: dict[str, Any]) -> str:
    """The first result media URL of a successful status ``data``."""
    url: str
    if family == "market":
        url = decoded(data["resultJson"])["resultUrls"][0]
    elif family == "kontext":
        url = data["response"]["resultImageUrl"]
    elif family == "suno":
        url = data["response"]["sunoData"][0]["audioUrl"]
    elif family == "runway":
        url = data["videoInfo"]["videoUrl"]
    else:
        url = data["response"]["resultUrls"][0]
    return url


async def media_status(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(url) as resp:
        return resp.status


@pytest.mark.parametrize("family", list(REQUESTS))
async def test_result_media_are_kept_14_days(
        sim: RunningSimulator, http: aiohttp.ClientSession, family: str) -> None:
    task_id = await create_task(sim, http, family, {"steps": []})
    url = result_url(family, (await poll(sim, http, family, task_id)).body["data"])
    sim.sim.clock.advance(14 * DAY - 60)
    assert await media_status(http, url) == 200
    sim.sim.clock.advance(120)
    assert await media_status(http, url) == 404


async def test_kontext_origin_image_lives_10_minutes(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    task_id = await create_task(sim, http, "kontext", {"steps": []})
    response = (await poll(sim, http, "kontext", task_id)).body["data"]["response"]
    sim.sim.clock.advance(590)
    assert await media_status(http, response["originImageUrl"]) == 200
    sim.sim.clock.advance(20)
    assert await media_status(http, response["originImageUrl"]) == 404
    assert await media_status(http, response["resultImageUrl"]) == 200


# -- callbacks ------------------------------------------------------------------------------


TERMINAL_CALLBACKS: Final[list[tuple[str, str, dict[str, Any]]]] = [
    ("market", "callback_market_success", {}),
    ("market", "callback_market_fail", {"end": "failed", "error": "Internal server error",
                                        "error_code": "500"}),
    ("veo", "callback_veo_success", {}),
    ("veo", "callback_veo_fail", {
        "end": "failed", "error_code": "400",
        "error": "Your prompt was flagged by Website as violating content policies."}),
    ("kontext", "callback_kontext_success", {}),
    ("kontext", "callback_kontext_fail", {"end": "failed",
                                          "error": "Image generation task failed"}),
    ("luma", "callback_luma_success", {}),
    ("runway", "callback_runway_success", {}),
    ("runway", "callback_runway_fail", {
        "end": "failed",
        "error": "Inappropriate content detected. Please replace the image or video."}),
]


@pytest.mark.parametrize(("family", "name", "script"), TERMINAL_CALLBACKS,
                         ids=[name for _, name, _ in TERMINAL_CALLBACKS])
async def test_terminal_callback_has_the_documented_shape(
        sim: RunningSimulator, http: aiohttp.ClientSession, family: str, name: str,
        script: dict[str, Any]) -> None:
    task_id = await create_task(sim, http, family, {"steps": [], **script},
                                callback=UNUSED_CALLBACK)
    [body] = await dropped_callbacks(sim, 1)
    assert diff(recorded(name), body, opaque=REQUEST_ECHOES) == []
    expected = fixture(name).body
    assert (body["code"], body["msg"]) == (expected["code"], expected["msg"])
    assert task_id in (body["data"].get("taskId"), body["data"].get("task_id"))


async def test_market_success_callback_reports_the_scripted_cost(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    await create_task(sim, http, "market", {"steps": [], "cost": 100},
                      callback=UNUSED_CALLBACK)
    [body] = await dropped_callbacks(sim, 1)
    assert body["data"]["consumeCredits"] == 100
    assert body["data"]["updateTime"] == body["data"]["completeTime"]


async def test_suno_sends_text_first_and_complete_stages(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    task_id = await create_task(sim, http, "suno", {
        "steps": [{"phase": "running", "seconds": 30}]})
    [text] = await dropped_callbacks(sim, 1)
    assert diff(recorded("callback_suno_text"), text) == []
    assert text["data"]["data"] == []
    sim.sim.clock.advance(31)
    stages = {b["data"]["callbackType"]: b for b in await dropped_callbacks(sim, 3)}
    assert list(stages) == ["text", "first", "complete"]
    for stage, body in stages.items():
        name = f"callback_suno_{stage}"
        assert diff(recorded(name), body) == [], stage
        assert (body["code"], body["msg"]) == (fixture(name).body["code"],
                                               fixture(name).body["msg"])
        assert body["data"]["task_id"] == task_id
    assert stages["first"]["data"]["data"][0]["audio_url"]
    assert all(t["audio_url"] for t in stages["complete"]["data"]["data"])


async def test_suno_failure_sends_an_error_stage_with_null_data(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    await create_task(sim, http, "suno", {"steps": [], "end": "failed",
                                          "error": "Audio generation failed."})
    [body] = await dropped_callbacks(sim, 1)
    assert diff(recorded("callback_suno_error"), body) == []
    expected = fixture("callback_suno_error").body
    assert (body["code"], body["msg"]) == (expected["code"], expected["msg"])
    assert (body["data"]["callbackType"], body["data"]["data"]) == ("error", None)


def test_callback_signer_reproduces_the_signature_vectors() -> None:
    for v in vectors(PROVIDER)["vectors"]:
        headers = signer(v["key"], v["task_id"])(v["timestamp"])
        assert headers["X-Webhook-Timestamp"] == str(v["timestamp"])
        assert headers["X-Webhook-Signature"] == v["signature"]


@dataclass(frozen=True)
class Arrival:
    headers: dict[str, str]
    at: float


@pytest.fixture
async def refusing_receiver(sim: RunningSimulator
                            ) -> AsyncIterator[tuple[str, list[Arrival]]]:
    """A callback URL that answers HTTP 500 to everything, noting when (sim time)."""
    got: list[Arrival] = []

    async def hook(request: web.Request) -> web.Response:
        await request.read()
        got.append(Arrival(dict(request.headers), sim.sim.clock.now()))
        return web.Response(status=500, text="down")

    app = web.Application()
    app.router.add_post("/cb", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/cb", got
    finally:
        await runner.cleanup()


async def test_failed_callback_is_retried_after_1_5_and_15_minutes_freshly_signed(
        sim: RunningSimulator, http: aiohttp.ClientSession,
        refusing_receiver: tuple[str, list[Arrival]]) -> None:
    url, got = refusing_receiver
    lead = 0.25  # the last quarter second of each wait passes in real time
    task_id = await create_task(sim, http, "market", {"steps": []}, callback=url)
    await sim.sim.webhooks.wait_for(1, outcome="rejected")
    for attempt, delay in enumerate(RETRY_SCHEDULE_S, start=2):
        sim.sim.clock.advance(delay - lead)
        await sim.sim.webhooks.wait_for(attempt, outcome="rejected")
    await sim.sim.webhooks.drain()  # gives up after the third retry
    attempts = sim.sim.webhooks.deliveries
    assert [d.attempt for d in attempts] == [1, 2, 3, 4]
    gaps = [b.at - a.at for a, b in pairwise(attempts)]
    assert all(d <= gap < d + 1.0 for d, gap in zip([60, 300, 900], gaps, strict=True)), gaps
    assert len(got) == 4
    secret = sim.sim.webhook_secrets[PROVIDER]
    for arrival in got:  # each attempt verifies at its own arrival: signed afresh
        verify_kie(secret, task_id, arrival.headers, now=arrival.at)
    assert len({a.headers["X-Webhook-Signature"] for a in got}) == 4


# -- kie-llm --------------------------------------------------------------------------------

LLM: Final = {"model": "claude-sonnet-4-6", "stream": False,
              "messages": [{"role": "user", "content": "hello"}]}


async def test_claude_message_has_the_live_shape_with_credits(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    answer = await send(http, "POST", sim.url(PROVIDER, "/claude/v1/messages"), json=LLM)
    assert_recorded_shape(("llm_claude_messages",), answer)
    assert re.fullmatch(r"msg_[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", answer.body["id"])
    assert isinstance(answer.body["credits_consumed"], float)


async def test_chat_completion_reports_credits_consumed(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    body = {"model": "gemini-3.1-pro", "messages": [{"role": "user", "content": "hi"}]}
    answer = await send(http, "POST", sim.url(PROVIDER, "/gemini-3.1-pro/v1/chat/completions"),
                        json=body)
    assert_recorded_shape(("llm_chat_completions",), answer)
    assert answer.body["model"] == "gemini-3.1-pro"


async def test_llm_without_valid_key_is_a_real_http_401(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    answer = await send(http, "POST", sim.url(PROVIDER, "/claude/v1/messages"), json=LLM,
                        headers={"Authorization": "Bearer wrong"})
    assert_recorded_shape(("llm_claude_error_401",), answer)
    assert answer.body == fixture("llm_claude_error_401").body
