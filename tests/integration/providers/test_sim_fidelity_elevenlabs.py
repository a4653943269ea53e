"""The ElevenLabs simulator answers in the shapes the live API sends, field by field.

Each test drives the simulator over HTTP into the state a fixture of
``tests/fixtures/providers/elevenlabs/`` records and asserts ``diff(shape_of(<recorded
variants>), <simulated body>) == []``, plus the headers the fixture records.
:data:`COMPARED` and :data:`NOT_COMPARABLE` classify every fixture file of the folder.

The GET-dubbing comparisons merge the official example with the bodies of one live dub
(``dubbing_status_live_*``): the official example omits ``source_language``, which the
SDK documents and the live API sends.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web
from multidict import CIMultiDictProxy

from callwarden.providers.elevenlabs.webhook import verify_elevenlabs
from callwarden.providers.simulator.core import Fault, RunningSimulator
from callwarden.providers.simulator.elevenlabs import CHARACTER_COST, set_workspace_webhook
from tests.recorded import FIXTURES, Recorded, load
from tests.shapes import diff, shape_of

PROVIDER = "elevenlabs"
MP4 = b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 32  # a video source
MP3 = b"ID3\x04\x00" + b"\x00" * 32  # an audio source
#: Headers the CDN / ASGI server adds, not the API.
TRANSPORT = frozenset({"content-encoding", "server", "via"})
#: Headers whose recorded value the simulator must repeat.
SAME_VALUE = ("content-type", "character-cost", "fiat-cost-before-overages", "fiat-currency",
              "access-control-expose-headers")

#: fixture -> the test comparing the simulator with it.
COMPARED: dict[str, str] = {
    "dubbing_create": "test_dub_create_answers_its_id_and_a_float_expected_duration",
    "dubbing_status_live_preparing": "test_dub_in_progress_has_no_languages_media_or_source_yet",
    "dubbing_status_live_dubbing": "test_dub_in_progress_has_no_languages_media_or_source_yet",
    "dubbing_status_live_dubbed": "test_dubbed_dub_lists_its_languages_media_and_source",
    "dubbing_status_dubbed": "test_dubbed_dub_lists_its_languages_media_and_source",
    "dubbing_status_failed": "test_failed_dub_reports_its_error_and_no_media",
    "dubbing_audio_response": "test_dub_audio_follows_the_source_media_type",
    "dubbing_audio_not_ready_425": "test_dub_audio_is_a_flat_425_until_dubbed",
    "dubbing_audio_not_found_404": "test_dub_audio_of_a_language_without_a_dub_is_a_flat_404",
    "tts_response": "test_tts_answers_audio_with_request_id_and_a_reported_character_cost",
    "sfx_response": "test_sfx_reports_the_recorded_character_cost_and_no_request_id",
    "stt_response": "test_stt_answers_the_recorded_body_and_cost_headers",
    "stt_webhook_accepted": "test_stt_with_webhook_is_accepted_then_delivered_signed",
    "webhook_speech_to_text": "test_stt_with_webhook_is_accepted_then_delivered_signed",
    "voice_clone_response": "test_sync_json_answers_have_the_recorded_shape",
    "voice_design_response": "test_sync_json_answers_have_the_recorded_shape",
    "forced_alignment_response": "test_sync_json_answers_have_the_recorded_shape",
    "error_400_validation": "test_keyterms_without_scribe_v2_is_the_documented_400",
    "error_401": "test_wrong_key_gets_the_live_401_shape",
    "error_401_quota_legacy": "test_quota_error_keeps_the_legacy_401_shape",
    "error_402": "test_insufficient_credits_is_a_402_payment_required",
    "error_422": "test_missing_field_is_a_pydantic_422",
    "error_429": "test_rate_limits_are_429_rate_limit_errors",
    "error_429_legacy": "test_legacy_concurrency_429_has_only_a_status",
}
#: fixture -> why no simulator answer is compared with it.
NOT_COMPARABLE: dict[str, str] = {
    "error_401_legacy": "an older serializer of the bad-key 401; the simulator sends the "
                        "live current one (error_401), so a bad key cannot take both shapes",
    "signature_vectors": "HMAC test vectors of providers/elevenlabs/webhook.py, not an answer (the "
                         "simulator's deliveries are verified with it in the webhook test)",
}


# ------------------------------------------------------------------ helpers

def key(rs: RunningSimulator) -> dict[str, str]:
    return {"xi-api-key": rs.sim.api_key}


def url(rs: RunningSimulator, path: str) -> str:
    return rs.url(PROVIDER, path)


def form(fields: Mapping[str, Any], **files: bytes) -> aiohttp.FormData:
    data = aiohttp.FormData()
    for name, value in fields.items():
        text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
        data.add_field(name, text)
    for name, content in files.items():
        data.add_field(name, content, filename=f"{name}.bin")
    return data


def shape_diff(names: list[str], body: Any, *extra: Any, opaque: tuple[str, ...] = ()
               ) -> list[str]:
    variants = [load(PROVIDER, n).body for n in names] + list(extra)
    return diff(shape_of(*variants), body, opaque=opaque)


def header_problems(recorded: Recorded, got: CIMultiDictProxy[str]) -> list[str]:
    """Recorded headers the answer lacks, or whose value it does not repeat."""
    problems = [f"missing {k}" for k in recorded.headers
                if k not in TRANSPORT and k not in got]
    for name in SAME_VALUE:
        want = recorded.headers.get(name)
        have = got.get(name, "").split(";")[0].strip()
        if want is not None and have != want:
            problems.append(f"{name}: {have!r}, recorded {want!r}")
    return problems


async def create_dub(rs: RunningSimulator, http: aiohttp.ClientSession, *,
                     file: bytes = MP4, script: Mapping[str, Any] | None = None,
                     **fields: str) -> tuple[int, Any]:
    data = {"target_lang": "es", "name": "My Dubbing Project", **fields}
    if script is not None:
        data["_sim"] = msgspec.json.encode(script).decode()
    async with http.post(url(rs, "/v1/dubbing"), data=form(data, file=file),
                         headers=key(rs)) as resp:
        return resp.status, await resp.json()


async def get_json(rs: RunningSimulator, http: aiohttp.ClientSession, path: str
                   ) -> tuple[int, Any]:
    async with http.get(url(rs, path), headers=key(rs)) as resp:
        return resp.status, await resp.json()


async def dub_in(rs: RunningSimulator, http: aiohttp.ClientSession, end: str,
                 **fields: Any) -> tuple[str, Any]:
    """A dub whose first poll is already ``end``; (its id, that poll's body)."""
    _, created = await create_dub(rs, http, script={"steps": [], "end": end,
                                                    "error": "no speech detected"},
                                  **fields)
    dubbing_id = created["dubbing_id"]
    status, body = await get_json(rs, http, f"/v1/dubbing/{dubbing_id}")
    assert status == 200
    return dubbing_id, body


async def post_json(rs: RunningSimulator, http: aiohttp.ClientSession, path: str,
                    body: Mapping[str, Any], headers: Mapping[str, str] | None = None
                    ) -> tuple[int, Any]:
    async with http.post(url(rs, path), json=body,
                         headers=key(rs) if headers is None else headers) as resp:
        return resp.status, await resp.json()


@asynccontextmanager
async def receiver() -> AsyncIterator[str]:
    """A webhook endpoint answering 200, on a free local port."""
    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/webhooks/elevenlabs", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/webhooks/elevenlabs"
    finally:
        await runner.cleanup()


# ------------------------------------------------------------------ coverage

def test_every_fixture_is_compared_or_has_a_reason() -> None:
    folder = {p.stem for p in (FIXTURES / PROVIDER).glob("*.json")}
    assert set(COMPARED) | set(NOT_COMPARABLE) == folder
    assert not set(COMPARED) & set(NOT_COMPARABLE)
    assert all(name in globals() for name in COMPARED.values())
    assert all(reason for reason in NOT_COMPARABLE.values())


# ------------------------------------------------------------------ dubbing

async def test_dub_create_answers_its_id_and_a_float_expected_duration(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    status, body = await create_dub(sim, http)
    assert status == 200
    assert shape_diff(["dubbing_create"], body) == []
    assert isinstance(body["expected_duration_sec"], float)
    assert re.fullmatch(r"[A-Za-z0-9]{20}", body["dubbing_id"])


IN_PROGRESS = ["dubbing_status_live_preparing", "dubbing_status_live_dubbing"]


async def test_dub_in_progress_has_no_languages_media_or_source_yet(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    _, created = await create_dub(sim, http, source_lang="auto")
    path = f"/v1/dubbing/{created['dubbing_id']}"
    seen = []
    for _ in range(3):
        status, body = await get_json(sim, http, path)
        assert status == 200
        # The official example omits source_language, and the SDK says it is filled once
        # dubbed: with "auto" it may be absent (the live dub named its source language).
        assert shape_diff([*IN_PROGRESS, "dubbing_status_dubbed"], body) == []
        assert (body["target_languages"], body["media_metadata"]) == ([], None)
        assert "source_language" not in body  # "auto": known once dubbed
        seen.append(body["status"])
    assert seen == ["queued", "preparing", "dubbing"]


async def test_dub_with_a_given_source_language_reports_it_from_the_first_poll(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    _, created = await create_dub(sim, http, source_lang="en")
    path = f"/v1/dubbing/{created['dubbing_id']}"
    for _ in range(3):
        _, body = await get_json(sim, http, path)
        assert shape_diff(IN_PROGRESS, body) == []
        assert body["source_language"] == "en"


async def test_dubbed_dub_lists_its_languages_media_and_source(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    _, body = await dub_in(sim, http, "succeeded")
    assert shape_diff(["dubbing_status_dubbed", "dubbing_status_live_dubbed"], body) == []
    assert body["status"] == "dubbed"
    assert body["target_languages"] == ["es"]
    assert body["media_metadata"]["content_type"] == "video/mp4"
    assert body["source_language"] == "en"  # an ISO code, never "auto"
    # the official example's format: no timezone, six fraction digits
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}", body["created_at"])


async def test_failed_dub_reports_its_error_and_no_media(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    _, body = await dub_in(sim, http, "failed")
    assert shape_diff(["dubbing_status_failed"], body) == []
    assert (body["status"], body["error"]) == ("failed", "no speech detected")
    assert body["media_metadata"] is None


async def test_dub_audio_is_a_flat_425_until_dubbed(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    _, created = await create_dub(sim, http)
    status, body = await get_json(sim, http, f"/v1/dubbing/{created['dubbing_id']}/audio/es")
    recorded = load(PROVIDER, "dubbing_audio_not_ready_425")
    assert status == recorded.status
    assert shape_diff([recorded.name], body) == []
    assert body == recorded.body  # the OpenAPI example, verbatim


async def test_dub_audio_of_a_language_without_a_dub_is_a_flat_404(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    dubbing_id, _ = await dub_in(sim, http, "succeeded")
    status, body = await get_json(sim, http, f"/v1/dubbing/{dubbing_id}/audio/fr")
    recorded = load(PROVIDER, "dubbing_audio_not_found_404")
    assert status == recorded.status
    assert shape_diff([recorded.name], body) == []
    assert body["message"] == recorded.body["message"].replace("{language_code}", "fr")


@pytest.mark.parametrize(("source", "content_type", "magic"), [
    (MP3, "audio/mpeg", b"ID3"), (MP4, "video/mp4", b"\x00\x00\x00\x18ftyp")],
    ids=["audio-source", "video-source"])
async def test_dub_audio_follows_the_source_media_type(
        sim: RunningSimulator, http: aiohttp.ClientSession, source: bytes,
        content_type: str, magic: bytes) -> None:
    dubbing_id, body = await dub_in(sim, http, "succeeded", file=source)
    assert body["media_metadata"]["content_type"] == content_type
    async with http.get(url(sim, f"/v1/dubbing/{dubbing_id}/audio/es"),
                        headers=key(sim)) as resp:
        assert resp.status == 200
        assert resp.content_type == content_type
        assert (await resp.read()).startswith(magic)
        if content_type == "audio/mpeg":
            assert header_problems(load(PROVIDER, "dubbing_audio_response"),
                                   resp.headers) == []


# ------------------------------------------------------------------ sync operations

async def test_tts_answers_audio_with_request_id_and_a_reported_character_cost(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    recorded = load(PROVIDER, "tts_response")
    text = "Hello there"
    for script, cost in (({}, CHARACTER_COST["tts"]), ({"_sim": {"cost": 37}}, 37)):
        async with http.post(url(sim, "/v1/text-to-speech/JBFqnCBsd6RMkjVDRZzb"),
                             json={"text": text, **script}, headers=key(sim)) as resp:
            assert resp.status == 200
            if not script:
                assert header_problems(recorded, resp.headers) == []
            assert resp.headers["character-cost"] == str(cost)
            assert resp.headers["character-cost"] != str(len(text))
            assert re.fullmatch(r"[0-9a-f]{32}", resp.headers["request-id"])
            assert (await resp.read()).startswith(b"ID3")


async def test_sfx_reports_the_recorded_character_cost_and_no_request_id(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    recorded = load(PROVIDER, "sfx_response")
    async with http.post(url(sim, "/v1/sound-generation"), headers=key(sim),
                         json={"text": "soft ui click", "duration_seconds": 0.5}) as resp:
        assert resp.status == 200
        assert header_problems(recorded, resp.headers) == []
        for absent in ("request-id", "current-concurrent-requests"):
            assert absent not in resp.headers  # not in the live answer
        assert (await resp.read()).startswith(b"ID3")


async def test_stt_answers_the_recorded_body_and_cost_headers(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    recorded = load(PROVIDER, "stt_response")
    async with http.post(url(sim, "/v1/speech-to-text"), headers=key(sim),
                         data=form({"model_id": "scribe_v2"}, file=MP3)) as resp:
        assert resp.status == 200
        assert header_problems(recorded, resp.headers) == []
        body = await resp.json()
    assert shape_diff([recorded.name], body) == []
    assert {w["type"] for w in body["words"]} <= {"word", "spacing", "audio_event"}


async def test_stt_with_webhook_is_accepted_then_delivered_signed(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    fields = {"model_id": "scribe_v2", "webhook": "true", "diarize": "true",
              "webhook_metadata": {"job": "j-1"}}
    async with receiver() as hook:
        set_workspace_webhook(sim.sim, hook)
        async with http.post(url(sim, "/v1/speech-to-text"), headers=key(sim),
                             data=form(fields, file=MP3)) as resp:
            accepted = load(PROVIDER, "stt_webhook_accepted")
            assert resp.status == accepted.status == 202
            body = await resp.json()
        assert shape_diff([accepted.name], body) == []
        (delivery,) = await sim.sim.webhooks.wait_for(1, outcome="delivered")
    assert delivery.url == hook
    event = msgspec.json.decode(delivery.body)
    assert shape_diff(["webhook_speech_to_text"], event,
                      opaque=("$.data.webhook_metadata",)) == []
    assert (event["type"], event["data"]["request_id"]) == (
        "speech_to_text_transcription", body["request_id"])
    assert event["data"]["webhook_metadata"] == {"job": "j-1"}
    verify_elevenlabs(sim.sim.webhook_secrets[PROVIDER],
                      delivery.headers["ElevenLabs-Signature"], delivery.body,
                      now=sim.sim.clock.now())


SYNC_JSON: list[tuple[str, str, dict[str, Any], dict[str, bytes]]] = [
    ("voice_clone_response", "/v1/voices/add", {"name": "Me"}, {"files": MP3}),
    ("voice_design_response", "/v1/text-to-voice/design",
     {"voice_description": "a calm narrator"}, {}),
    ("forced_alignment_response", "/v1/forced-alignment", {"text": "hello world"},
     {"file": MP3}),
]


@pytest.mark.parametrize(("fixture", "path", "fields", "files"), SYNC_JSON,
                         ids=[case[0] for case in SYNC_JSON])
async def test_sync_json_answers_have_the_recorded_shape(
        sim: RunningSimulator, http: aiohttp.ClientSession, fixture: str, path: str,
        fields: dict[str, Any], files: dict[str, bytes]) -> None:
    data: Any = form(fields, **files) if files else None
    async with http.post(url(sim, path), headers=key(sim), data=data,
                         json=None if files else fields) as resp:
        assert resp.status == 200
        assert header_problems(load(PROVIDER, fixture), resp.headers) == []
        body = await resp.json()
    assert shape_diff([fixture], body) == []


# ------------------------------------------------------------------ errors

TTS = "/v1/text-to-speech/JBFqnCBsd6RMkjVDRZzb"


def failing(code: str | None) -> dict[str, Any]:
    return {"text": "hi", "_sim": {"end": "failed", "error": "upstream says no",
                                   "error_code": code}}


async def test_keyterms_without_scribe_v2_is_the_documented_400(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    recorded = load(PROVIDER, "error_400_validation")
    async with http.post(url(sim, "/v1/speech-to-text"), headers=key(sim),
                         data=form({"model_id": "scribe_v1", "keyterms": ["cw"]},
                                   file=MP3)) as resp:
        assert resp.status == recorded.status
        body = await resp.json()
    assert shape_diff([recorded.name], body) == []
    assert body["detail"]["message"] == recorded.body["detail"]["message"]
    assert body["detail"]["param"] == "keyterms"


async def test_wrong_key_gets_the_live_401_shape(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    status, body = await post_json(sim, http, TTS, {"text": "hi"},
                                   headers={"xi-api-key": "wrong"})
    assert status == 401
    assert shape_diff(["error_401"], body) == []
    assert (body["detail"]["code"], body["detail"]["status"]) == (
        "unauthorized", "invalid_api_key")


async def test_quota_error_keeps_the_legacy_401_shape(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    status, body = await post_json(sim, http, TTS, failing("quota_exceeded"))
    assert status == 401
    assert shape_diff(["error_401_quota_legacy"], body) == []
    assert body["detail"]["status"] == "quota_exceeded"


async def test_insufficient_credits_is_a_402_payment_required(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    status, body = await post_json(sim, http, TTS, failing("insufficient_credits"))
    assert status == 402
    assert shape_diff(["error_402"], body) == []
    assert (body["detail"]["type"], body["detail"]["code"]) == (
        "payment_required", "insufficient_credits")


async def test_missing_field_is_a_pydantic_422(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    status, body = await post_json(sim, http, TTS, {"model_id": "eleven_v3"})
    assert status == 422
    assert shape_diff(["error_422"], body) == []
    assert body["detail"][0]["loc"] == ["body", "text"]


async def test_rate_limits_are_429_rate_limit_errors(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    status, body = await post_json(sim, http, TTS, failing("concurrent_limit_exceeded"))
    assert status == 429
    assert shape_diff(["error_429"], body) == []
    sim.sim.faults.arm(PROVIDER, "tts", Fault(kind="rate_limit", retry_after=2))
    async with http.post(url(sim, TTS), json={"text": "hi"}, headers=key(sim)) as resp:
        assert (resp.status, resp.headers["retry-after"]) == (429, "2")
        limited = await resp.json()
    assert shape_diff(["error_429"], limited) == []
    assert [b["detail"]["code"] for b in (body, limited)] == [
        "concurrent_limit_exceeded", "rate_limit_exceeded"]


async def test_legacy_concurrency_429_has_only_a_status(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    status, body = await post_json(sim, http, TTS, failing("too_many_concurrent_requests"))
    assert status == 429
    assert shape_diff(["error_429_legacy"], body) == []


@pytest.mark.parametrize(("code", "status", "kind"), [
    (None, 500, "internal_error"), ("internal_error", 500, "internal_error"),
    ("maintenance", 503, "service_unavailable")])
async def test_server_errors_use_the_documented_codes_and_types(
        sim: RunningSimulator, http: aiohttp.ClientSession, code: str | None, status: int,
        kind: str) -> None:
    got, body = await post_json(sim, http, TTS, failing(code))
    assert got == status
    assert shape_diff(["error_402", "error_429"], body) == []  # the current detail shape
    assert (body["detail"]["type"], body["detail"]["code"]) == (kind, code or kind)
